// Chaos soak: three real nodes, a mixed stream of jobs, and a fault injector (bounded in time and
// count) that kill -9s, freezes and thaws the leader, restarts PostgreSQL, terminates the nodes'
// backends, restarts nodes, and loses the answers to statements the server ran (the nodes reach
// the server through a proxy in this process: a COMMIT's answer lost after it committed, the
// connection cut as soon as a COMMIT is sent, a claim's answer lost). At the end the queue must
// drain and:
//  - every enqueued job is in job_history or dead_jobs, exactly once;
//  - transactional effects (record_tx) exist exactly once per job;
//  - external effects (record_ext) at least once, each extra run explained by a fault;
//  - no node died except by the injector;
//  - each surviving node's baton_fenced_total equals the fenced outcomes its log reports.
// Short by default (CTest); BATON_CHAOS_SECONDS=1800 for the long run.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "support/cluster.h"
#include "support/proxy.h"

namespace {

using namespace baton::test;

struct Fault {
  std::string what;
  std::string at;  // database clock
};

class Chaos {
 public:
  Chaos(const std::string& schema, int shards)
      : schema_(schema),
        dir_(temp_dir(schema)),
        shards_(shards),
        cluster_(schema, 0),
        proxy_(database_url()) {
    create_effects(cluster_);
    pqxx::nontransaction tx(cluster_.db());
    tx.exec(
        "CREATE TABLE executions (job_id bigint, node text, epoch bigint, attempt int, "
        "at timestamptz DEFAULT clock_timestamp())");
    for (const char* id : {"n1", "n2", "n3"})
      start(id);
  }

  void start(const std::string& id) {
    const auto log = dir_ + "/" + id + "." + std::to_string(generation_++) + ".log";
    auto p = std::make_unique<Process>(
        std::vector<std::string>{binary("demo_node"), "--database-url",
                                 proxy_.url_through(database_url()), "--schema", schema_,
                                 "--node-id", id, "--metrics-listen", "127.0.0.1:0", "--threads",
                                 "4", "--retry-base", "50ms", "--retry-cap", "200ms",
                                 "--no-migrate", "--shards", std::to_string(shards_)},
        log);
    nodes_[id] = std::move(p);
    logs_[id] = log;
  }

  std::string now() { return query_value(db(), "SELECT clock_timestamp()::text"); }
  pqxx::connection& db() { return cluster_.db(); }
  void reconnect() {
    for (int i = 0; i < 200; ++i) {
      try {
        query_value(db(), "SELECT 1");
        return;
      } catch (const std::exception&) {
        cluster_.reconnect();
      }
    }
  }
  long long count(const std::string& sql) {
    reconnect();
    return query_int(db(), sql);
  }
  std::string leader() {
    reconnect();
    return cluster_.leader();
  }

  void enqueue_some(std::mt19937& rng) {
    const int n = std::uniform_int_distribution<int>(5, 15)(rng);
    std::string values;
    for (int i = 0; i < n; ++i) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      std::string job;
      if (kind < 4) {
        job = R"({"type": "record_tx", "payload": {"ms": 20}})";
      } else if (kind < 7) {
        job = R"({"type": "record_ext", "payload": {"ms": 10}})";
      } else if (kind < 9) {
        job = R"({"type": "record_ext", "payload": {"fail_attempts": 1}, "max_attempts": 5})";
      } else {
        job = R"({"type": "sleep", "payload": {"ms": 300}})";
      }
      values += (values.empty() ? "" : ",") + job;
    }
    reconnect();
    pqxx::nontransaction tx(db());
    enqueued_ += static_cast<long long>(
        tx.exec_params("SELECT count(*) FROM enqueue_many($1::jsonb)", "[" + values + "]")[0][0]
            .as<long long>());
  }

  void inject(std::mt19937& rng, const std::string& pgdir) {
    const auto l = leader();
    const int kind = std::uniform_int_distribution<int>(0, 12)(rng);
    if (kind < 3 && !l.empty()) {
      faults_.push_back({"kill -9 " + l, now()});
      nodes_[l]->signal(SIGKILL);
      nodes_[l]->wait(5s);
      killed_by_us_.insert(logs_[l]);
      start(l);
    } else if (kind < 5 && !l.empty()) {
      faults_.push_back({"SIGSTOP " + l, now()});
      nodes_[l]->signal(SIGSTOP);
      std::this_thread::sleep_for(2500ms);  // the fault itself: frozen past the ttl
      nodes_[l]->signal(SIGCONT);
      faults_.push_back({"SIGCONT " + l, now()});
    } else if (kind < 6 && !pgdir.empty() && pg_restarts_ < 3) {
      faults_.push_back({"restart PostgreSQL", now()});
      ++pg_restarts_;
      run_command(std::string(BATON_SOURCE_DIR) + "/scripts/pg restart " + pgdir, nullptr);
      reconnect();
    } else if (kind < 8) {
      faults_.push_back({"terminate node backends", now()});
      reconnect();
      pqxx::nontransaction tx(db());
      tx.exec_params(
          "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
          "application_name LIKE $1 AND random() < 0.5",
          "%@" + schema_);
    } else if (kind == 10) {
      // The next COMMIT any node sends (a completer's write, a transactional job's, an
      // election's) runs, and its answer never arrives.
      faults_.push_back({"lose a COMMIT's answer", now()});
      proxy_.lose_answer_to("COMMIT");
    } else if (kind == 11) {
      // The same, but cut as it is sent: the node may ask while the server still commits.
      faults_.push_back({"cut as a COMMIT is sent", now()});
      proxy_.cut_after("COMMIT");
    } else if (kind == 12) {
      // A claim (the prepared statement's name is in its Bind message) commits unanswered.
      faults_.push_back({"lose a claim's answer", now()});
      proxy_.lose_answer_to("baton_claim");
    } else {
      const std::string id = "n" + std::to_string(std::uniform_int_distribution<int>(1, 3)(rng));
      faults_.push_back({"restart " + id, now()});
      nodes_[id]->signal(SIGTERM);
      const int rc = nodes_[id]->wait(30s);
      if (rc != 0) crashed_.push_back(id + " exited " + std::to_string(rc) + " on SIGTERM");
      start(id);
    }
  }

  // Nodes that exited on their own (not by our signals).
  void check_alive() {
    for (auto& [id, p] : nodes_) {
      if (!p->running()) crashed_.push_back(id + " (" + logs_[id] + ") died on its own");
    }
  }

  std::string schema_, dir_;
  int shards_ = 1;
  Cluster cluster_;
  Proxy proxy_;  // the nodes' way to the server
  int generation_ = 0;
  int pg_restarts_ = 0;
  long long enqueued_ = 0;
  std::map<std::string, std::unique_ptr<Process>> nodes_;
  std::map<std::string, std::string> logs_;
  std::set<std::string> killed_by_us_;
  std::vector<Fault> faults_;
  std::vector<std::string> crashed_;
};

// `shards` > 1: every node leads a share of the shards, and "the leader" the faults pick is shard
// 0's (the one that also runs the periodic work).
void soak(int shards, int default_seconds) {
  const char* env_seconds = std::getenv("BATON_CHAOS_SECONDS");
  const int seconds = env_seconds != nullptr ? std::atoi(env_seconds) : default_seconds;
  const char* pgdir_env = std::getenv("BATON_TEST_PGDIR");
  const std::string pgdir = pgdir_env != nullptr ? pgdir_env : "";
  Chaos chaos(unique_schema(shards > 1 ? "chaos_shards" : "chaos"), shards);
  ASSERT_TRUE(wait_for([&] { return !chaos.leader().empty(); }, 30s));
  std::mt19937 rng(20261122);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  auto next_fault = std::chrono::steady_clock::now() + 3s;
  int rounds = 0;
  while (std::chrono::steady_clock::now() < end && rounds < 100000) {
    ++rounds;
    try {
      chaos.enqueue_some(rng);
    } catch (const std::exception&) {
      // the database may be restarting: enqueue failed as a whole, nothing counted
    }
    if (std::chrono::steady_clock::now() >= next_fault && chaos.faults_.size() < 400) {
      chaos.inject(rng, pgdir);
      next_fault = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(std::uniform_int_distribution<int>(2000, 4000)(rng));
    }
    chaos.check_alive();
    std::this_thread::sleep_for(100ms);
  }
  // Drain.
  const auto drain_from = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_for([&] { return chaos.count("SELECT count(*) FROM jobs") == 0; }, 180s, 200ms))
      << chaos.count("SELECT count(*) FROM jobs") << " jobs left\n"
      << chaos.cluster_.logs();
  const auto drained_in = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - drain_from);
  chaos.check_alive();

  const auto history = chaos.count("SELECT count(*) FROM job_history");
  const auto dead = chaos.count("SELECT count(*) FROM dead_jobs");
  const auto both = chaos.count("SELECT count(*) FROM job_history h JOIN dead_jobs d USING (id)");
  const auto tx_jobs = chaos.count("SELECT count(*) FROM job_history WHERE type = 'record_tx'");
  const auto effects = chaos.count("SELECT count(*) FROM effects");
  const auto effect_dupes = chaos.count(
      "SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY job_id HAVING count(*) > 1) d");
  const auto effects_without_job = chaos.count(
      "SELECT count(*) FROM effects e WHERE NOT EXISTS (SELECT 1 FROM job_history h WHERE "
      "h.id = e.job_id)");
  const auto ext_jobs = chaos.count("SELECT count(*) FROM job_history WHERE type = 'record_ext'");
  const auto ext_never_ran = chaos.count(
      "SELECT count(*) FROM job_history h WHERE type = 'record_ext' AND NOT EXISTS (SELECT 1 "
      "FROM executions x WHERE x.job_id = h.id)");
  // Extra runs: executions beyond one per attempt the handler meant to fail.
  const auto extra = chaos.count(
      "SELECT coalesce(sum(n - 1), 0) FROM (SELECT job_id, attempt, count(*) AS n FROM executions "
      "GROUP BY job_id, attempt) a WHERE n > 1");
  const auto rerun_attempts = chaos.count(
      "SELECT count(*) FROM executions x JOIN job_history h ON h.id = x.job_id WHERE x.attempt > "
      "1 + coalesce((h.payload->>'fail_attempts')::int, 0)");
  // Every extra attempt must follow one that a fault ended: the attempt before it ended (its
  // error's time in the job's history: a failure written, or a rescue) within 15 s after some
  // fault. Not the extra attempt's own start: a job put back behind a backlog waits its turn.
  // (Faults come every 2-4 s, so during the soak this holds for any attempt that left an error;
  // it bites in the drain, when a rescue with no fault behind it would be a false one.)
  std::string fault_times;
  for (const auto& f : chaos.faults_) {
    fault_times += (fault_times.empty() ? "'" : ",'") + f.at + "'";
  }
  const auto unexplained =
      fault_times.empty()
          ? rerun_attempts
          : chaos.count(
                "SELECT count(*) FROM executions x JOIN job_history h ON h.id = x.job_id "
                "WHERE x.attempt > 1 + coalesce((h.payload->>'fail_attempts')::int, 0) "
                "AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(h.errors, '[]')) "
                "e(v), unnest(ARRAY[" +
                fault_times +
                "]::timestamptz[]) f(at) WHERE (e.v->>'attempt')::int = x.attempt - 1 "
                "AND (e.v->>'at')::timestamptz BETWEEN f.at AND f.at + interval '15 seconds')");

  // Fenced outcomes: each surviving node's counter against its own log.
  long long fenced_logged = 0, fenced_metric = 0;
  for (const auto& [id, log_path] : chaos.logs_) {
    const auto addr =
        query_value(chaos.db(), "SELECT metrics_addr FROM nodes WHERE node_id = '" + id + "'");
    const auto page = http_get(addr, "/metrics");
    if (page.empty()) continue;
    const auto log = chaos.nodes_[id]->log();
    std::smatch m;
    for (auto it = log.cbegin();
         std::regex_search(it, log.cend(), m, std::regex(R"((\d+) of \d+ outcomes were FENCED)"));
         it = m.suffix().first) {
      fenced_logged += std::stoll(m[1]);
    }
    for (std::size_t at = log.find("job FENCED"); at != std::string::npos;
         at = log.find("job FENCED", at + 1)) {
      ++fenced_logged;
    }
    fenced_metric += static_cast<long long>(metric_sum(page, "baton_fenced_total"));
  }

  std::printf(
      "[ chaos ] %d s, %d shard(s), %zu faults, %lld jobs enqueued: %lld completed, %lld dead\n",
      seconds, shards, chaos.faults_.size(), chaos.enqueued_, history, dead);
  std::map<std::string, int> kinds;
  for (const auto& f : chaos.faults_) {
    // "kill -9 n2" and "restart n1" group without their node; the rest are whole.
    kinds[std::regex_replace(f.what, std::regex(R"( n\d$)"), "")]++;
  }
  for (const auto& [k, n] : kinds)
    std::printf("[ chaos ]   %-26s %d\n", k.c_str(), n);
  std::printf("[ chaos ] the queue drained %lld ms after the last fault's round\n",
              static_cast<long long>(drained_in.count()));
  std::printf("[ chaos ] answers lost or cut by the proxy: %d\n", chaos.proxy_.answers_lost());
  std::printf("[ chaos ] transactional jobs %lld, effects %lld, duplicated effects %lld\n", tx_jobs,
              effects, effect_dupes);
  std::printf(
      "[ chaos ] external jobs %lld, extra runs %lld (rescues after faults %lld, "
      "unexplained %lld)\n",
      ext_jobs, extra, rerun_attempts, unexplained);
  std::printf("[ chaos ] fenced outcomes: logged %lld, baton_fenced_total %lld (surviving nodes)\n",
              fenced_logged, fenced_metric);

  EXPECT_EQ(history + dead, chaos.enqueued_) << "a job was lost or invented";
  EXPECT_EQ(both, 0) << "a job finished twice";
  EXPECT_EQ(effects, tx_jobs) << "transactional effects must be exactly once";
  EXPECT_EQ(effect_dupes, 0);
  EXPECT_EQ(effects_without_job, 0) << "an effect committed for a job that did not complete";
  EXPECT_EQ(ext_never_ran, 0) << "a completed external job has no execution";
  EXPECT_EQ(unexplained, 0) << "a job ran again with no fault to explain it";
  EXPECT_EQ(extra, 0) << "a job ran twice under one claim (the same attempt)";
  EXPECT_EQ(fenced_metric, fenced_logged);
  EXPECT_TRUE(chaos.crashed_.empty()) << chaos.crashed_.front();
}

TEST(Chaos, NoJobLostNoTransactionalEffectTwiceUnderFaults) {
  soak(1, 60);
}

// The same with 3 shards: claims, rescues and fencing per shard, and shards moving between the
// nodes as the faults take them down and bring them back.
TEST(Chaos, WithShardsNoJobLostNoTransactionalEffectTwiceUnderFaults) {
  soak(3, 45);
}

}  // namespace
