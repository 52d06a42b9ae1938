// bench/scale_out: partitioned leadership (docs/concepts.md, "Shards") on a local cluster of
// demo_node processes. Prints a table and one JSON object per figure.
//   scale_out   sleep-bound jobs (--job-ms 10) on --threads 4 per node, --shards 6, drained by
//               1, 2 and 3 nodes, interleaved by round; each node count's rate, and its ratio to
//               one node's rate in the same round (median and range over --rounds)
//   shard_kill  kill -9 of a node that leads shards, under load: from the kill to the first job
//               claimed, and to the first job started, under a new epoch on every shard it led
//               (the slowest of them); and the same for the single leader of a deployment
//               without shards, interleaved
//   rebalance   a fourth node joins a 3-node, 6-shard cluster under load: from its start to its
//               first claimed job, and to shares of 2/2/1/1
//
//   bench/scale_out [--rounds 3] [--jobs 3000] [--job-ms 10] [--threads 4] [--shards 6]
//                   [--only scale,kill,rebalance]
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "bench_db.h"
#include "support/testkit.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Options {
  int rounds = 3;
  long long jobs = 3000;
  int job_ms = 10;
  int threads = 4;
  int shards = 6;
  std::string only = "scale,kill,rebalance";
  bool wants(const std::string& part) const {
    return ("," + only + ",").find("," + part + ",") != std::string::npos;
  }
};

void figure(const char* name, const nlohmann::json& values) {
  nlohmann::json j{{"bench", name}};
  j.update(values);
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

nlohmann::json summary(const std::vector<double>& v) {
  return {{"median", median(v)},
          {"min", v.empty() ? 0 : *std::min_element(v.begin(), v.end())},
          {"max", v.empty() ? 0 : *std::max_element(v.begin(), v.end())},
          {"samples", v}};
}

// One deployment (schema) with its own shard count, and the node processes running on it.
class Deployment {
 public:
  Deployment(std::string url, int shards, const Options& o, const std::string& tag)
      : url_(std::move(url)), shards_(shards), o_(o) {
    schema_ = "bench_so_" + tag + "_" + std::to_string(getpid());
    dir_ = baton::test::temp_dir("bench-scale-out");
    db_ = baton::detail::connect({.url = url_, .schema = schema_, .application_name = "bench"});
    baton::detail::migrate(*db_, schema_);
    pqxx::nontransaction(*db_).exec_params("SELECT set_shards($1)", shards_);
  }
  ~Deployment() {
    nodes_.clear();
    try {
      pqxx::nontransaction(*db_).exec("DROP SCHEMA " + schema_ + " CASCADE");
    } catch (const std::exception&) {
    }
  }

  long long count(const std::string& sql) {
    pqxx::nontransaction tx(*db_);
    return tx.exec(sql)[0][0].as<long long>();
  }
  void exec(const std::string& sql) { pqxx::nontransaction(*db_).exec(sql); }
  std::string value(const std::string& sql) {
    pqxx::nontransaction tx(*db_);
    return tx.exec(sql)[0][0].c_str();
  }

  // Starts one node; ids are new for every start.
  std::string start() {
    const std::string id = "s" + std::to_string(++starts_);
    std::vector<std::string> args{baton::test::binary("demo_node"),
                                  "--database-url",
                                  url_,
                                  "--schema",
                                  schema_,
                                  "--node-id",
                                  id,
                                  "--no-migrate",
                                  "--metrics-listen",
                                  "off",
                                  "--log-level",
                                  "warn",
                                  "--threads",
                                  std::to_string(o_.threads),
                                  "--shards",
                                  std::to_string(shards_)};
    nodes_[id] = std::make_unique<baton::test::Process>(std::move(args), dir_ + "/" + id + ".log");
    return id;
  }
  void stop_all() { nodes_.clear(); }
  baton::test::Process& process(const std::string& id) { return *nodes_.at(id); }

  // Valid leases by node.
  std::map<std::string, int> shares() {
    std::map<std::string, int> out;
    pqxx::nontransaction tx(*db_);
    for (const auto& r : tx.exec("SELECT client_id, count(*) FROM locks "
                                 "WHERE expires_at > clock_timestamp() GROUP BY 1")) {
      out[r[0].c_str()] = r[1].as<int>();
    }
    return out;
  }
  // Every shard led, by running nodes only, at the fair share (each within floor..ceil).
  bool settled() {
    const auto s = shares();
    int total = 0;
    const int n = static_cast<int>(nodes_.size());
    for (const auto& [node, k] : s) {
      if (nodes_.count(node) == 0) return false;
      if (k < shards_ / n || k > (shards_ + n - 1) / n) return false;
      total += k;
    }
    return total == shards_ && static_cast<int>(s.size()) == std::min(n, shards_);
  }

  // n sleep jobs spread over the shards, while the queue is paused.
  void queue_jobs(long long n) {
    exec(
        "INSERT INTO queue_state (queue, paused, updated_by) VALUES ('default', true, 'bench') "
        "ON CONFLICT (queue) DO UPDATE SET paused = true");
    exec(
        "INSERT INTO jobs (queue, type, payload, shard) SELECT 'default', 'sleep', "
        "'{\"ms\": " +
        std::to_string(o_.job_ms) + "}'::jsonb, floor(random() * " + std::to_string(shards_) +
        ")::int FROM generate_series(1, " + std::to_string(n) + ")");
  }
  void resume() {
    pqxx::work tx(*db_);
    tx.exec("UPDATE queue_state SET paused = false WHERE queue = 'default'");
    for (int k = 0; k < shards_; ++k) {
      // Wake every shard's leader.
      tx.exec_params("SELECT pg_notify($1, 'default')", baton::detail::jobs_channel(schema_));
    }
    tx.commit();
  }
  void clear() { exec("TRUNCATE jobs, job_history"); }

 private:
  std::string url_;
  int shards_;
  Options o_;
  std::string schema_;
  std::string dir_;
  int starts_ = 0;
  std::unique_ptr<pqxx::connection> db_;
  std::map<std::string, std::unique_ptr<baton::test::Process>> nodes_;
};

// Drains o.jobs with `nodes` nodes; jobs/s from the resume to the last completion.
double drain(Deployment& d, int nodes, const Options& o) {
  for (int i = 0; i < nodes; ++i)
    d.start();
  if (!baton::test::wait_for([&] { return d.settled(); }, 60s)) {
    throw std::runtime_error("the shards did not settle over " + std::to_string(nodes) +
                             " node(s)");
  }
  d.queue_jobs(o.jobs);
  const auto t0 = Clock::now();
  d.resume();
  const bool done = baton::test::wait_for(
      [&] { return d.count("SELECT count(*) FROM (SELECT 1 FROM jobs LIMIT 1) j") == 0; }, 600s,
      10ms);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  d.stop_all();
  d.clear();
  if (!done) throw std::runtime_error("the drain did not finish in 10 minutes");
  return static_cast<double>(o.jobs) / secs;
}

// ms from a kill -9 to the first claim, and to the first start, under a new epoch on the slowest
// of the shards the node led.
struct KillFigures {
  double claimed = -1;
  double started = -1;
};

// kill -9 of the node leading shard 0, with jobs waiting on every shard.
KillFigures kill_to_running(Deployment& d, int nodes, const Options& o) {
  for (int i = 0; i < nodes; ++i)
    d.start();
  if (!baton::test::wait_for([&] { return d.settled(); }, 60s)) {
    throw std::runtime_error("the shards did not settle");
  }
  // Enough work that every shard is busy throughout.
  d.queue_jobs(o.jobs * 4);
  d.resume();
  baton::test::wait_for([&] { return d.count("SELECT count(*) FROM job_history") >= 200; }, 60s);
  const std::string victim = d.value(
      "SELECT client_id FROM locks WHERE expires_at > clock_timestamp() ORDER BY lock_key "
      "LIMIT 1");
  // "<region>/<lock_key>=<epoch>" for every shard it leads.
  const std::string held = d.value(
      "SELECT string_agg(region || '/' || lock_key || '=' || epoch, ',') FROM locks "
      "WHERE client_id = '" +
      victim + "' AND expires_at > clock_timestamp()");
  const std::string t0 = d.value("SELECT clock_timestamp()::text");
  d.process(victim).signal(SIGKILL);
  d.process(victim).wait(5s);
  std::vector<std::pair<std::string, long long>> shards;
  std::size_t at = 0;
  while (at < held.size()) {
    auto end = held.find(',', at);
    if (end == std::string::npos) end = held.size();
    const auto pair = held.substr(at, end - at);
    const auto eq = pair.rfind('=');
    shards.emplace_back(pair.substr(0, eq), std::stoll(pair.substr(eq + 1)));
    at = end + 1;
  }
  // ms from the kill to `first` (an instant under the shard's new epoch, l.epoch) on the slowest
  // of the shards, once every one has it.
  auto slowest_of = [&](const std::string& first, double& slowest) {
    double worst = 0;
    for (const auto& [group, old] : shards) {
      const auto ms =
          d.value("SELECT coalesce((SELECT round(extract(epoch FROM " + first + " - '" + t0 +
                  "'::timestamptz) * 1000)::text FROM locks l WHERE l.region || '/' "
                  "|| l.lock_key = '" +
                  group + "' AND l.epoch > " + std::to_string(old) + "), '')");
      if (ms.empty()) return false;
      worst = std::max(worst, std::stod(ms));
    }
    slowest = worst;
    return true;
  };
  // The first claim under each new epoch (still running, or finished: started_at is the claim).
  double slowest = -1;
  const bool moved = baton::test::wait_for(
      [&] {
        return slowest_of(
            "least((SELECT min(claimed_at) FROM jobs WHERE claimed_epoch = l.epoch), "
            "(SELECT min(started_at) FROM job_history WHERE epoch = l.epoch))",
            slowest);
      },
      30s, 5ms);
  // The first start (a claimed job may wait behind the node's buffer), once the history has a
  // run of every one: its end less its run time.
  double slowest_start = -1;
  const bool started =
      moved && baton::test::wait_for(
                   [&] {
                     return slowest_of(
                         "(SELECT min(finished_at - run_seconds * interval '1 second') FROM "
                         "job_history WHERE epoch = l.epoch)",
                         slowest_start);
                   },
                   30s, 5ms);
  d.stop_all();
  d.clear();
  if (!moved || !started)
    throw std::runtime_error("the killed node's shards did not run elsewhere");
  return {slowest, slowest_start};
}

}  // namespace

int main(int argc, char** argv) {
  if (const int code = baton::bench::check_flag_pairs(
          argc, argv,
          "bench/scale_out [--rounds 3] [--jobs 3000] [--job-ms 10] [--threads 4] [--shards 6] "
          "[--only scale,kill,rebalance]");
      code >= 0)
    return code;
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rounds") {
      o.rounds = std::stoi(value);
    } else if (flag == "--jobs") {
      o.jobs = std::stoll(value);
    } else if (flag == "--job-ms") {
      o.job_ms = std::stoi(value);
    } else if (flag == "--threads") {
      o.threads = std::stoi(value);
    } else if (flag == "--shards") {
      o.shards = std::stoi(value);
    } else if (flag == "--only") {
      o.only = value;
    } else {
      std::fprintf(stderr, "scale_out: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    baton::test::TempDirsGuard temp_dirs;  // ends last: the server and the nodes stop first
    baton::bench::BenchDatabase database;
    if (o.wants("scale")) {
      Deployment d(database.url(), o.shards, o, "scale");
      std::map<int, std::vector<double>> rate, ratio;
      for (int r = 0; r < o.rounds; ++r) {
        std::map<int, double> this_round;
        for (int nodes : {1, 2, 3}) {
          this_round[nodes] = drain(d, nodes, o);
          std::printf("round %d: %d node(s) %.0f jobs/s\n", r + 1, nodes, this_round[nodes]);
          std::fflush(stdout);
        }
        for (int nodes : {1, 2, 3}) {
          rate[nodes].push_back(this_round[nodes]);
          ratio[nodes].push_back(this_round[nodes] / this_round[1]);
        }
      }
      const double ideal = 1000.0 / o.job_ms * o.threads;
      for (int nodes : {1, 2, 3}) {
        std::printf(
            "%d node(s): %.0f jobs/s median (%.0f..%.0f), %.2fx one node (%.2f..%.2f); "
            "ideal %.0f\n",
            nodes, median(rate[nodes]), *std::min_element(rate[nodes].begin(), rate[nodes].end()),
            *std::max_element(rate[nodes].begin(), rate[nodes].end()), median(ratio[nodes]),
            *std::min_element(ratio[nodes].begin(), ratio[nodes].end()),
            *std::max_element(ratio[nodes].begin(), ratio[nodes].end()), ideal * nodes);
        figure("scale_out", {{"nodes", nodes},
                             {"shards", o.shards},
                             {"threads_per_node", o.threads},
                             {"job_ms", o.job_ms},
                             {"jobs", o.jobs},
                             {"jobs_per_s", summary(rate[nodes])},
                             {"ratio_to_one_node", summary(ratio[nodes])},
                             {"ideal_jobs_per_s", ideal * nodes}});
      }
    }
    if (o.wants("kill")) {
      Deployment sharded(database.url(), o.shards, o, "kill6");
      Deployment single(database.url(), 1, o, "kill1");
      std::vector<double> with_shards, without, with_shards_started, without_started;
      for (int r = 0; r < o.rounds; ++r) {
        const auto one = kill_to_running(single, 3, o);
        const auto many = kill_to_running(sharded, 3, o);
        without.push_back(one.claimed);
        without_started.push_back(one.started);
        with_shards.push_back(many.claimed);
        with_shards_started.push_back(many.started);
        std::printf(
            "round %d: kill -9 to the first claim elsewhere: one leader %.0f ms, %d shards %.0f "
            "ms (slowest shard); to the first start: %.0f ms and %.0f ms\n",
            r + 1, one.claimed, o.shards, many.claimed, one.started, many.started);
        std::fflush(stdout);
      }
      figure("shard_kill",
             {{"shards", o.shards},
              {"nodes", 3},
              {"single_leader_ms", summary(without)},
              {"sharded_slowest_shard_ms", summary(with_shards)},
              {"difference_ms", median(with_shards) - median(without)},
              {"single_leader_started_ms", summary(without_started)},
              {"sharded_slowest_shard_started_ms", summary(with_shards_started)},
              {"difference_started_ms", median(with_shards_started) - median(without_started)}});
    }
    if (o.wants("rebalance")) {
      Deployment d(database.url(), o.shards, o, "join");
      std::vector<double> first_job, settled;
      for (int r = 0; r < o.rounds; ++r) {
        for (int i = 0; i < 3; ++i)
          d.start();
        if (!baton::test::wait_for([&] { return d.settled(); }, 60s)) {
          throw std::runtime_error("the shards did not settle over 3 nodes");
        }
        d.queue_jobs(o.jobs * 4);
        d.resume();
        baton::test::wait_for([&] { return d.count("SELECT count(*) FROM job_history") >= 200; },
                              60s);
        const auto t0 = Clock::now();
        const auto id = d.start();
        double first = -1, fair = -1;
        baton::test::wait_for(
            [&] {
              const double ms =
                  std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
              if (first < 0 &&
                  d.count("SELECT count(*) FROM (SELECT 1 FROM jobs WHERE claimed_by = '" + id +
                          "' UNION ALL SELECT 1 FROM job_history WHERE node = '" + id +
                          "' LIMIT 1) x") > 0) {
                first = ms;
              }
              if (fair < 0 && d.settled()) fair = ms;
              return first >= 0 && fair >= 0;
            },
            60s, 5ms);
        d.stop_all();
        d.clear();
        first_job.push_back(first);
        settled.push_back(fair);
        std::printf(
            "round %d: a 4th node joins: its first job after %.0f ms, 2/2/1/1 after "
            "%.0f ms (start-up included)\n",
            r + 1, first, fair);
        std::fflush(stdout);
      }
      figure("rebalance", {{"shards", o.shards},
                           {"from_nodes", 3},
                           {"first_job_ms", summary(first_job)},
                           {"fair_share_ms", summary(settled)}});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scale_out: %s\n", e.what());
    return 1;
  }
  return 0;
}
