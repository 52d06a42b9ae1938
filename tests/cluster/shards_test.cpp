// Partitioned leadership with real processes: shards spread over the nodes at their fair share,
// move when a node dies or joins, keep the order of ordered partitions, and keep queue pauses and
// concurrency limits across the cluster. The run log (record_run) is the witness: which node ran
// which job when, and whether any job ran twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/runs.h"

namespace {

using namespace baton::test;

// Valid leases by node, over the deployment's shard lock rows.
std::map<std::string, int> shares(Cluster& cluster) {
  std::map<std::string, int> out;
  pqxx::nontransaction tx(cluster.db());
  for (const auto& r :
       tx.exec("SELECT client_id, count(*) FROM locks WHERE expires_at > clock_timestamp() "
               "AND (lock_key = 'baton-leader' OR lock_key LIKE 'baton-leader:%') GROUP BY 1")) {
    out[r[0].c_str()] = r[1].as<int>();
  }
  return out;
}

std::string show(const std::map<std::string, int>& m) {
  std::string s;
  for (const auto& [node, n] : m)
    s += node + "=" + std::to_string(n) + " ";
  return s;
}

// Waits until the shares are exactly `want`.
bool settle(Cluster& cluster, const std::map<std::string, int>& want,
            std::chrono::milliseconds timeout = 20s) {
  return wait_for([&] { return shares(cluster) == want; }, timeout);
}

// `n` jobs through the SQL API (so that they spread over the shards), in one transaction.
void enqueue(Cluster& cluster, const std::string& queue, const std::string& type,
             const std::string& payload, int n) {
  pqxx::nontransaction tx(cluster.db());
  tx.exec_params("SELECT count(enqueue($1, $2, $3::jsonb)) FROM generate_series(1, $4)", queue,
                 type, payload, n);
}

long long history(Cluster& cluster) {
  return cluster.count("SELECT count(*) FROM job_history");
}

// baton_leader{shard="k"} of one scrape, by shard.
std::map<int, double> leader_by_shard(const std::string& page) {
  std::map<int, double> out;
  static const std::regex line(R"re(^baton_leader\{[^}]*shard="(\d+)"[^}]*\} (\S+)$)re");
  std::smatch m;
  std::size_t at = 0;
  while (at < page.size()) {
    auto end = page.find('\n', at);
    if (end == std::string::npos) end = page.size();
    const std::string l = page.substr(at, end - at);
    if (std::regex_match(l, m, line)) out[std::stoi(m[1])] = std::stod(m[2]);
    at = end + 1;
  }
  return out;
}

TEST(Shards, ThreeNodesSettleAtTwoEachAndAfterAKillNineTheSurvivorsLeadThreeEach) {
  Cluster cluster(unique_schema("shards_kill"), 0);
  const auto log = cluster.dir() + "/runs.log";
  for (const char* id : {"n1", "n2", "n3"})
    cluster.start(id, {"--shards", "6", "--run-log", log, "--threads", "4"});
  ASSERT_TRUE(settle(cluster, {{"n1", 2}, {"n2", 2}, {"n3", 2}}))
      << show(shares(cluster)) << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT value::int FROM settings WHERE key = 'shards'"), 6);

  // Every node says how many it leads, and every shard has exactly one leader.
  ASSERT_TRUE(wait_for(
      [&] {
        std::map<int, double> sum;
        for (const auto& id : cluster.node_ids()) {
          const auto addr = cluster.metrics_addr(id);
          if (addr.empty()) return false;
          const auto page = scrape(addr);
          if (metric_sum(page, "baton_shards_led") != 2) return false;
          for (const auto& [k, v] : leader_by_shard(page))
            sum[k] += v;
        }
        return sum.size() == 6 &&
               std::all_of(sum.begin(), sum.end(), [](const auto& kv) { return kv.second == 1; });
      },
      20s))
      << cluster.logs();
  // batonctl leader lists every shard's holder.
  const auto listing = ctl(cluster, "--json leader");
  for (int k = 1; k < 6; ++k) {
    EXPECT_NE(listing.find("baton-leader:" + std::to_string(k)), std::string::npos) << listing;
  }
  EXPECT_NE(listing.find("\"shard\""), std::string::npos) << listing;

  constexpr int kJobs = 1200;
  enqueue(cluster, "default", "record_run", R"({"ms": 10})", kJobs);
  // Every node at work, its outcomes recorded, before n2 dies: counting the history alone, n2 was
  // once killed 0.25 s into its first jobs, none of whose outcomes had committed yet (the others
  // had recorded 150 between them), and the check below found it had run nothing.
  ASSERT_TRUE(wait_for(
      [&] {
        return history(cluster) >= 150 &&
               cluster.count("SELECT count(DISTINCT node) FROM job_history") == 3;
      },
      30s))
      << cluster.logs();
  cluster.process("n2").signal(SIGKILL);
  EXPECT_EQ(cluster.process("n2").wait(5s), 128 + SIGKILL);
  ASSERT_TRUE(settle(cluster, {{"n1", 3}, {"n3", 3}}))
      << "the dead node's shards did not spread over the survivors: " << show(shares(cluster))
      << cluster.logs();

  ASSERT_TRUE(wait_for([&] { return history(cluster) == kJobs; }, 60s))
      << history(cluster) << " of " << kJobs << "\n"
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs"), 0);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM dead_jobs"), 0);
  // A job ran again only when the killed node was running it (whose runs never logged an end).
  for (const auto& [job, runs] : read_runs(log)) {
    for (std::size_t i = 0; i + 1 < runs.size(); ++i) {
      EXPECT_EQ(runs[i].node, "n2")
          << "job " << job << " ran again after a run on " << runs[i].node;
    }
  }
  for (const char* id : {"n1", "n2", "n3"}) {
    EXPECT_GT(
        cluster.count(std::string("SELECT count(*) FROM job_history WHERE node = '") + id + "'"), 0)
        << id << " ran none of the jobs";
  }
}

TEST(Shards, AFourthNodeJoinsSharesBecomeTwoTwoOneOneAndNoJobRunsTwice) {
  Cluster cluster(unique_schema("shards_join"), 0);
  const auto log = cluster.dir() + "/runs.log";
  // Every hand-over here must be graceful: a lease of 2 s, so that a busy 2-core machine (four
  // nodes of six shards, and another test beside them) does not end one by a late renewal.
  const std::vector<std::string> flags = {"--shards",  "6", "--run-log",  log,
                                          "--threads", "4", "--lock-ttl", "2s"};
  for (const char* id : {"n1", "n2", "n3"})
    cluster.start(id, flags);
  ASSERT_TRUE(settle(cluster, {{"n1", 2}, {"n2", 2}, {"n3", 2}}))
      << show(shares(cluster)) << cluster.logs();
  int jobs = 2000;
  enqueue(cluster, "default", "record_run", R"({"ms": 20})", jobs);
  ASSERT_TRUE(wait_for([&] { return history(cluster) >= 100; }, 30s)) << cluster.logs();
  cluster.start("n4", flags);
  // 6 over 4 nodes is 2, 2, 1, 1: the two oldest keep two, the newest (n4) takes one. Jobs stay
  // queued until then, however long the new node takes to start on a busy machine.
  ASSERT_TRUE(wait_for(
      [&] {
        if (cluster.count("SELECT count(*) FROM jobs") < 500) {
          enqueue(cluster, "default", "record_run", R"({"ms": 20})", 500);
          jobs += 500;
        }
        const auto now = shares(cluster);
        std::vector<int> counts;
        for (const auto& [node, n] : now)
          counts.push_back(n);
        std::sort(counts.begin(), counts.end());
        return counts == std::vector<int>{1, 1, 2, 2} && now.count("n4") == 1 && now.at("n4") == 1;
      },
      30s))
      << show(shares(cluster)) << cluster.logs();
  const auto at_join = history(cluster);
  ASSERT_TRUE(wait_for([&] { return history(cluster) == jobs; }, 60s))
      << history(cluster) << " of " << jobs << "\n"
      << cluster.logs();
  EXPECT_LT(at_join, jobs) << "the jobs ran out before the rebalance: the test proves nothing";
  EXPECT_GT(cluster.count("SELECT count(*) FROM job_history WHERE node = 'n4'"), 0);
  // A graceful hand-over: every job ran once, on its first attempt, and none was cancelled.
  const auto runs = read_runs(log);
  EXPECT_EQ(runs.size(), static_cast<std::size_t>(jobs));
  for (const auto& [job, list] : runs) {
    EXPECT_EQ(list.size(), 1u) << "job " << job << " ran " << list.size() << " times";
    EXPECT_FALSE(list.front().cancelled) << "job " << job;
  }
  EXPECT_EQ(cluster.count("SELECT count(*) FROM job_history WHERE attempts <> 1"), 0);
  // The hand-overs were releases (drained, released, taken), not expiries.
  EXPECT_GT(cluster.count("SELECT count(*) FROM leadership_events WHERE event = 'released' "
                          "AND reason = 'stepped_down'"),
            0);
  EXPECT_EQ(cluster.count("SELECT count(*) FROM leadership_events WHERE event = 'granted' "
                          "AND reason IN ('lease_expired', 'session_ended')"),
            0);
}

TEST(Shards, OrderedPartitionsKeepTheirOrderWhileShardsMove) {
  Cluster cluster(unique_schema("shards_order"), 0);
  const auto log = cluster.dir() + "/runs.log";
  const std::vector<std::string> flags = {"--shards", "4", "--run-log", log, "--threads", "4"};
  for (const char* id : {"n1", "n2"})
    cluster.start(id, flags);
  ASSERT_TRUE(settle(cluster, {{"n1", 2}, {"n2", 2}})) << show(shares(cluster)) << cluster.logs();
  ctl(cluster, "queue ordered sms --partitions 8");
  constexpr int kKeys = 16, kPerKey = 25;
  {
    pqxx::nontransaction tx(cluster.db());
    // Interleaved: key 0, 1, ..., 15, then again; each key's jobs in enqueue (id) order.
    tx.exec_params(
        "SELECT count(enqueue('sms', 'record_run', '{\"ms\": 8}', partition_key => 'k' || k)) "
        "FROM generate_series(1, $1) s, generate_series(0, $2 - 1) k",
        kPerKey, kKeys);
  }
  ASSERT_EQ(cluster.count("SELECT count(*) FROM jobs WHERE partition IS NULL"), 0)
      << "jobs were enqueued outside the ordered partitions";
  EXPECT_GT(cluster.count("SELECT count(DISTINCT shard) FROM jobs"), 1)
      << "the partitions all fell on one shard";
  EXPECT_EQ(cluster.count("SELECT count(*) FROM (SELECT partition_key FROM jobs GROUP BY 1 "
                          "HAVING count(DISTINCT shard) > 1) d"),
            0)
      << "a partition's jobs are on two shards";
  // Shards move while the partitions run: a node joins, one leaves gracefully, it comes back.
  ASSERT_TRUE(wait_for([&] { return history(cluster) >= 40; }, 30s)) << cluster.logs();
  cluster.start("n3", flags);
  ASSERT_TRUE(wait_for([&] { return shares(cluster).count("n3") == 1; }, 20s))
      << show(shares(cluster)) << cluster.logs();
  cluster.process("n1").signal(SIGTERM);
  EXPECT_EQ(cluster.process("n1").wait(20s), 0) << cluster.logs();
  cluster.start("n1", flags);
  ASSERT_TRUE(wait_for([&] { return history(cluster) == kKeys * kPerKey; }, 90s))
      << history(cluster) << cluster.logs();

  std::map<long long, std::string> key_of;
  {
    pqxx::nontransaction tx(cluster.db());
    for (const auto& r : tx.exec("SELECT id, partition_key FROM job_history"))
      key_of[r[0].as<long long>()] = r[1].c_str();
  }
  // Per key: runs in id order, each starting after the one before ended.
  std::map<std::string, std::vector<LoggedRun>> by_key;
  std::set<std::string> nodes;
  for (const auto& [job, runs] : read_runs(log)) {
    for (const auto& run : runs) {
      by_key[key_of[job]].push_back(run);
      nodes.insert(run.node);
    }
  }
  ASSERT_EQ(by_key.size(), static_cast<std::size_t>(kKeys));
  for (auto& [key, runs] : by_key) {
    std::sort(runs.begin(), runs.end(),
              [](const auto& a, const auto& b) { return a.start_us < b.start_us; });
    for (std::size_t i = 1; i < runs.size(); ++i) {
      EXPECT_LE(runs[i - 1].job, runs[i].job) << "partition " << key << " ran out of order";
      EXPECT_LE(runs[i - 1].end_us, runs[i].start_us)
          << "partition " << key << ": job " << runs[i].job << " started before job "
          << runs[i - 1].job << " ended";
    }
  }
  EXPECT_GE(nodes.size(), 2u) << "the partitions ran on one node: no shard moved under them";
}

TEST(Shards, QueuePausesAndConcurrencyLimitsHoldAcrossTheCluster) {
  Cluster cluster(unique_schema("shards_limits"), 0);
  const auto log = cluster.dir() + "/runs.log";
  for (const char* id : {"n1", "n2", "n3"}) {
    cluster.start(id, {"--shards", "3", "--run-log", log, "--threads", "4", "--queue-concurrency",
                       "limited=2"});
  }
  ASSERT_TRUE(settle(cluster, {{"n1", 1}, {"n2", 1}, {"n3", 1}}))
      << show(shares(cluster)) << cluster.logs();
  ctl(cluster, "queue pause limited");
  enqueue(cluster, "limited", "record_run", R"({"ms": 60})", 45);
  enqueue(cluster, "default", "record_run", R"({"ms": 1})", 30);
  EXPECT_EQ(cluster.count("SELECT count(DISTINCT shard) FROM jobs WHERE queue = 'limited'"), 3);
  // The other queue runs; the paused one waits on every shard.
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM job_history WHERE queue = 'default'") == 30;
      },
      30s))
      << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT count(*) FROM jobs WHERE queue = 'limited' AND state <> "
                          "'available'"),
            0);
  ctl(cluster, "queue resume limited");
  ASSERT_TRUE(wait_for([&] { return history(cluster) == 75; }, 60s)) << cluster.logs();

  std::set<long long> limited;
  {
    pqxx::nontransaction tx(cluster.db());
    for (const auto& r : tx.exec("SELECT id FROM job_history WHERE queue = 'limited'"))
      limited.insert(r[0].as<long long>());
  }
  // The most runs of the limited queue at one instant, over the whole cluster.
  std::vector<std::pair<long long, int>> edges;
  std::set<std::string> nodes;
  for (const auto& [job, runs] : read_runs(log)) {
    if (limited.count(job) == 0) continue;
    for (const auto& run : runs) {
      edges.emplace_back(run.start_us, 1);
      edges.emplace_back(run.end_us, -1);
      nodes.insert(run.node);
    }
  }
  std::sort(edges.begin(), edges.end());  // an end before a start at the same instant
  int now = 0, most = 0;
  for (const auto& [at, step] : edges) {
    now += step;
    most = std::max(most, now);
  }
  EXPECT_EQ(most, 2) << "the limit of 2 did not hold across the cluster (or was never reached)";
  EXPECT_GE(nodes.size(), 2u) << "one node ran the whole limited queue: nothing was shared";
}

TEST(Shards, ANodeWithAnotherShardCountIsRefusedWhileTheOthersRun) {
  Cluster cluster(unique_schema("shards_mismatch"), 0);
  cluster.start("n1", {"--shards", "4"});
  ASSERT_TRUE(settle(cluster, {{"n1", 4}})) << show(shares(cluster)) << cluster.logs();
  cluster.start("n2", {"--shards", "2"});
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.process("n2").log().find(
                   "nodes with another shard count are running: "
                   "n1 (4)") != std::string::npos;
      },
      20s))
      << cluster.logs();
  EXPECT_NE(cluster.process("n2").log().find("start this node with --shards 4"), std::string::npos)
      << cluster.process("n2").log();
  EXPECT_EQ(shares(cluster), (std::map<std::string, int>{{"n1", 4}}));
  EXPECT_EQ(cluster.count("SELECT value::int FROM settings WHERE key = 'shards'"), 4);
  // With n1 stopped, the count may change: n2 sets it and leads both shards.
  cluster.process("n1").signal(SIGTERM);
  EXPECT_EQ(cluster.process("n1").wait(20s), 0);
  ASSERT_TRUE(settle(cluster, {{"n2", 2}})) << show(shares(cluster)) << cluster.logs();
  EXPECT_EQ(cluster.count("SELECT value::int FROM settings WHERE key = 'shards'"), 2);
}

TEST(Shards, ADrillReportsWhereEachShardOfTheFaultedNodeWent) {
  Cluster cluster(unique_schema("shards_drill"), 0);
  for (const char* id : {"n1", "n2", "n3"})
    cluster.start(id, {"--shards", "6"});
  ASSERT_TRUE(settle(cluster, {{"n1", 2}, {"n2", 2}, {"n3", 2}}))
      << show(shares(cluster)) << cluster.logs();
  auto check = [&](const std::string& out, const std::string& faulted) {
    const auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << out << cluster.logs();
    EXPECT_EQ(j["leader"], faulted);
    EXPECT_NE(j["next_leader"], faulted) << out;
    ASSERT_EQ(j["other_shards"].size(), 1u) << out;
    EXPECT_NE(j["other_shards"][0]["to"], faulted) << out;
    EXPECT_GE(j["all_shards_moved_ms"].get<long long>(), j["granted_ms"].get<long long>()) << out;
  };
  // The drill faults shard 0's leader.
  auto shard0 = [&] {
    return query_value(cluster.db(),
                       "SELECT client_id FROM locks WHERE lock_key = 'baton-leader' "
                       "AND expires_at > clock_timestamp()");
  };
  // A step-down: the node stands aside, and the others take both its shards.
  auto faulted = shard0();
  int rc = 0;
  auto out = ctl(cluster, "--json drill --timeout 20s", &rc);
  EXPECT_EQ(rc, 0) << out << cluster.logs();
  check(out, faulted);
  // Back to 2 each once it stands again; then kill -9 shard 0's leader.
  ASSERT_TRUE(settle(cluster, {{"n1", 2}, {"n2", 2}, {"n3", 2}}, 30s))
      << show(shares(cluster)) << cluster.logs();
  faulted = shard0();
  out = ctl(cluster, "--json drill --kill --timeout 20s", &rc);
  EXPECT_EQ(rc, 0) << out << cluster.logs();
  check(out, faulted);
  EXPECT_EQ(cluster.process(faulted).wait(5s), 128 + SIGKILL);
}

// The first run of `job` in the run log, if any.
std::optional<LoggedRun> run_of(const std::string& log, long long job) {
  const auto runs = read_runs(log);
  const auto it = runs.find(job);
  if (it == runs.end() || it->second.empty()) return std::nullopt;
  return it->second.front();
}

// A record_run job on `shard`; with `release`, it runs until that file exists (two minutes at
// most), so that a test decides when it ends rather than a guess at how slow the machine is.
long long insert_on_shard(Cluster& cluster, int shard, int ms, const std::string& release = "") {
  pqxx::nontransaction tx(cluster.db());
  return tx
      .exec_params(
          "INSERT INTO jobs (queue, type, payload, shard) VALUES ('default', 'record_run', "
          "jsonb_strip_nulls(jsonb_build_object('ms', $1::int, 'until_exists', NULLIF($3, ''))"
          "), $2) RETURNING id",
          release.empty() ? ms : 120000, shard, release)[0][0]
      .as<long long>();
}

bool still_running(const std::string& log, long long job) {
  const auto r = run_of(log, job);
  return r && r->end_us == std::numeric_limits<long long>::max();
}

void release(const std::string& file) {
  std::ofstream(file) << "go\n";
}

TEST(Shards, AHandOverThatCannotDrainInTimeKeepsTheShardAndRunsNothingTwice) {
  Cluster cluster(unique_schema("shards_keep"), 0);
  const auto log = cluster.dir() + "/runs.log";
  const std::vector<std::string> flags = {"--shards",         "2", "--run-log", log,
                                          "--shutdown-grace", "1s"};
  cluster.start("n1", flags);
  ASSERT_TRUE(settle(cluster, {{"n1", 2}})) << show(shares(cluster)) << cluster.logs();
  // A job on shard 1 (the first one handed over) that runs until released, past the grace.
  const auto go = cluster.dir() + "/release-long";
  const auto long_job = insert_on_shard(cluster, 1, 0, go);
  ASSERT_TRUE(wait_for([&] { return run_of(log, long_job).has_value(); }, 20s)) << cluster.logs();
  cluster.start("n2", flags);
  // n1 is over its share of 1; its hand-over of shard 1 cannot drain in 1 s, so it keeps it (and
  // hands shard 0 over instead).
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.process("n1").log().find("shard 1: not handed over") != std::string::npos;
      },
      20s))
      << cluster.logs();
  ASSERT_TRUE(still_running(log, long_job)) << "the hand-over ended the long job";
  EXPECT_EQ(query_value(cluster.db(),
                        "SELECT client_id FROM locks WHERE lock_key = 'baton-leader:1' "
                        "AND expires_at > clock_timestamp()"),
            "n1");
  // The kept shard claims again: new jobs on it run while the long one still runs.
  std::vector<long long> short_jobs;
  for (int i = 0; i < 5; ++i)
    short_jobs.push_back(insert_on_shard(cluster, 1, 1));
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM job_history WHERE id = ANY('{" +
                             std::to_string(short_jobs.front()) + "," +
                             std::to_string(short_jobs.back()) + "}')") == 2;
      },
      20s))
      << cluster.logs();
  // The other shard goes to n2 instead, and the long job ends where it started.
  ASSERT_TRUE(settle(cluster, {{"n1", 1}, {"n2", 1}}, 30s))
      << show(shares(cluster)) << cluster.logs();
  EXPECT_EQ(query_value(cluster.db(),
                        "SELECT client_id FROM locks WHERE lock_key = 'baton-leader' "
                        "AND expires_at > clock_timestamp()"),
            "n2");
  EXPECT_TRUE(still_running(log, long_job));
  release(go);
  ASSERT_TRUE(wait_for(
      [&] {
        return cluster.count("SELECT count(*) FROM job_history WHERE id = " +
                             std::to_string(long_job)) == 1;
      },
      30s))
      << cluster.logs();
  const auto runs = read_runs(log);
  ASSERT_EQ(runs.count(long_job), 1u);
  const auto& long_runs = runs.at(long_job);
  ASSERT_EQ(long_runs.size(), 1u) << "the long job ran " << long_runs.size() << " times";
  EXPECT_EQ(long_runs.front().node, "n1");
  EXPECT_FALSE(long_runs.front().cancelled) << "the hand-over cancelled a running job";
  for (const auto id : short_jobs) {
    ASSERT_EQ(runs.count(id), 1u);
    EXPECT_LT(runs.at(id).front().end_us, long_runs.front().end_us)
        << "job " << id << " of the kept shard waited for the long job";
  }
  EXPECT_EQ(cluster.count("SELECT attempts FROM job_history WHERE id = " +
                          std::to_string(long_job) + " AND outcome = 'completed'"),
            1);
}

TEST(Shards, AShardLostDuringAnotherShardsHandOverCancelsItsRunsAtOnce) {
  Cluster cluster(unique_schema("shards_lost"), 0);
  const auto log = cluster.dir() + "/runs.log";
  // A long grace: a hand-over that holds up the revoke of another shard would hold it this long.
  const std::vector<std::string> flags = {"--shards",         "2",  "--run-log", log,
                                          "--shutdown-grace", "30s"};
  cluster.start("n1", flags);
  ASSERT_TRUE(settle(cluster, {{"n1", 2}})) << show(shares(cluster)) << cluster.logs();
  // Both run until released: the first keeps shard 1's hand-over draining.
  const auto go = cluster.dir() + "/release";
  const auto draining = insert_on_shard(cluster, 1, 0, go);
  const auto lost = insert_on_shard(cluster, 0, 0, go);
  ASSERT_TRUE(wait_for([&] { return run_of(log, draining) && run_of(log, lost); }, 20s))
      << cluster.logs();
  cluster.start("n2", flags);
  ASSERT_TRUE(wait_for(
      [&] { return cluster.process("n1").log().find("handing shard 1 over") != std::string::npos; },
      20s))
      << cluster.logs();
  // n1 loses shard 0 while shard 1 drains: the server ends its election session.
  cluster.count(
      "SELECT count(*) FILTER (WHERE pg_terminate_backend(holder_pid)) FROM locks "
      "WHERE lock_key = 'baton-leader'");
  // Its run there sees the cancellation at once, before the job runs again elsewhere.
  ASSERT_TRUE(wait_for(
      [&] {
        const auto r = run_of(log, lost);
        return r && r->end_us != std::numeric_limits<long long>::max();
      },
      5s))
      << "the lost shard's run was not cancelled while the other shard drained\n"
      << cluster.logs();
  EXPECT_TRUE(run_of(log, lost)->cancelled);
  EXPECT_TRUE(still_running(log, draining)) << "shard 1's hand-over was over already";
  release(go);
  ASSERT_TRUE(wait_for([&] { return cluster.count("SELECT count(*) FROM job_history") == 2; }, 60s))
      << cluster.logs();
  EXPECT_EQ(overlapping_runs(log), "");
  const auto runs = read_runs(log);
  EXPECT_EQ(runs.at(draining).size(), 1u) << "the drained job ran again";
  EXPECT_FALSE(runs.at(draining).front().cancelled);
}

}  // namespace
