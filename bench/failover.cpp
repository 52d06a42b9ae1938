// bench/failover: a 3-node cluster under a steady stream of small transactional jobs; the leader
// is faulted N times per variant (SIGKILL, SIGSTOP, SIGTERM, and partition: the leader's proxy to
// PostgreSQL drops every byte, nothing closed, until the round ends) and the time from the fault
// to the first job started by the next leader is measured on the database clock. For partitions
// it also measures the time to the old leader's own demotion (its log) and counts rounds where
// the next grant came first (must be 0). It counts jobs run twice (started by two leaders) and
// committed twice (two effect rows: must be 0).
//   bench/failover [--rounds N] [--rate JOBS_PER_S] [--only SIGKILL|SIGSTOP|SIGTERM|partition]
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "bench_db.h"
#include "support/proxy.h"
#include "support/runs.h"
#include "support/testkit.h"

namespace {

using namespace baton;
using namespace std::chrono_literals;
using test::Process;
using test::wait_for;

constexpr int kPartition = 0;  // Variant::signal of the partition fault

struct Variant {
  std::string name;
  int signal;
  std::vector<double> ms;
  std::vector<double> demoted_ms;  // partition: fault to the old leader's demotion
  int granted_first = 0;           // partition: rounds where the next grant preceded it
  long long run_twice = 0;
  long long committed_twice = 0;
  int missed = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

class Bench {
 public:
  Bench(std::string url, int rate) : url_(std::move(url)), rate_(rate) {
    schema_ = "bench_failover_" + std::to_string(getpid());
    dir_ = test::temp_dir("bench-failover");
    db_ = detail::connect({.url = url_, .schema = schema_, .application_name = "bench"});
    detail::migrate(*db_, schema_);
    exec("CREATE TABLE effects (job_id bigint, node text, epoch bigint)");
    for (int i = 1; i <= 3; ++i)
      start("n" + std::to_string(i));
  }
  ~Bench() {
    producing_ = false;
    if (producer_.joinable()) producer_.join();
    nodes_.clear();
    try {
      exec("DROP SCHEMA " + schema_ + " CASCADE");
    } catch (const std::exception&) {
    }
  }

  void start(const std::string& id) {
    // Every node reaches PostgreSQL through a proxy of its own, so that any of them can be cut.
    if (!proxies_.contains(id)) proxies_[id] = std::make_unique<test::Proxy>(url_);
    nodes_[id] = std::make_unique<Process>(
        std::vector<std::string>{test::binary("demo_node"), "--database-url",
                                 proxies_[id]->url_through(url_), "--schema", schema_, "--node-id",
                                 id, "--metrics-listen", "off", "--threads", "4", "--no-migrate"},
        dir_ + "/" + id + ".log");
  }

  long long count(const std::string& sql) {
    pqxx::nontransaction tx(*db_);
    auto r = tx.exec(sql);
    return r.empty() || r[0][0].is_null() ? 0 : r[0][0].as<long long>();
  }
  std::string value(const std::string& sql) {
    pqxx::nontransaction tx(*db_);
    auto r = tx.exec(sql);
    return r.empty() || r[0][0].is_null() ? "" : r[0][0].c_str();
  }
  void exec(const std::string& sql) {
    pqxx::nontransaction tx(*db_);
    tx.exec(sql);
  }

  void produce() {
    producing_ = true;
    producer_ = std::thread([this] {
      auto conn = detail::connect({.url = url_, .schema = schema_, .application_name = "bench"});
      const int per_tick = std::max(1, rate_ / 100);
      auto next = std::chrono::steady_clock::now();
      while (producing_) {
        pqxx::nontransaction tx(*conn);
        tx.exec_params(
            "INSERT INTO jobs (queue, type, payload) SELECT 'default', 'record_tx', '{}' "
            "FROM generate_series(1, $1)",
            per_tick);
        tx.exec_params("SELECT pg_notify($1, 'default')", detail::jobs_channel(schema_));
        enqueued_ += per_tick;
        next += 10ms;
        std::this_thread::sleep_until(next);
      }
    });
  }

  std::string leader() {
    return value("SELECT client_id FROM locks WHERE expires_at > clock_timestamp()");
  }

  // One fault; returns the ms from the fault to the first job started under the next epoch.
  double fault(Variant& v) {
    std::string l;
    if (!wait_for([&] { return !(l = leader()).empty(); }, 30s))
      throw std::runtime_error("no leader");
    const auto epoch = count("SELECT epoch FROM locks");
    const std::string at = value("SELECT clock_timestamp()::text");
    const auto fault_at = std::chrono::system_clock::now();
    if (v.signal == kPartition) {
      proxies_[l]->blackhole();
    } else {
      nodes_[l]->signal(v.signal);
    }
    double ms = -1;
    const std::string first_start =
        "SELECT extract(epoch FROM least((SELECT min(started_at) FROM job_history WHERE epoch > " +
        std::to_string(epoch) + "), (SELECT min(claimed_at) FROM jobs WHERE claimed_epoch > " +
        std::to_string(epoch) + ")) - '" + at + "'::timestamptz) * 1000";
    if (wait_for([&] { return !value(first_start).empty(); }, 30s, 2ms)) {
      ms = std::stod(value(first_start));
    } else {
      ++v.missed;
    }
    if (v.signal == kPartition) partition_order(v, l, epoch, fault_at);
    // Bring the cluster back to three healthy nodes.
    if (v.signal == kPartition) {
      proxies_[l]->heal();
    } else if (v.signal == SIGSTOP) {
      nodes_[l]->signal(SIGCONT);
    } else {
      nodes_[l]->wait(20s);
      start(l);
    }
    wait_for(
        [&] {
          return count(
                     "SELECT count(*) FROM nodes WHERE role IN ('leader', 'follower') AND "
                     "last_seen > now() - interval '2 seconds'") == 3 &&
                 value("SELECT role FROM nodes WHERE node_id = '" + l + "'") == "follower";
        },
        20s);
    std::this_thread::sleep_for(500ms);  // steady state before the next fault
    return ms;
  }

  // The partitioned leader's demotion, from its log, against the next leader's grant.
  void partition_order(Variant& v, const std::string& old_leader, long long epoch,
                       std::chrono::system_clock::time_point fault_at) {
    const std::string lost = "leadership LOST: epoch=" + std::to_string(epoch);
    const std::string granted = "leadership GRANTED: epoch=" + std::to_string(epoch + 1);
    std::optional<std::chrono::system_clock::time_point> demoted, next;
    wait_for(
        [&] {
          demoted = test::logged_at(nodes_[old_leader]->log(), lost, fault_at);
          for (const auto& [id, node] : nodes_) {
            if (id != old_leader && !next) next = test::logged_at(node->log(), granted, fault_at);
          }
          return demoted && next;
        },
        10s);
    if (!demoted) return;
    v.demoted_ms.push_back(std::chrono::duration<double, std::milli>(*demoted - fault_at).count());
    if (next && *next <= *demoted) ++v.granted_first;
  }

  long long run_twice() { return count("SELECT count(*) FROM job_history WHERE attempts > 1"); }
  long long committed_twice() {
    return count(
        "SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY job_id "
        "HAVING count(*) > 1) d");
  }
  long long enqueued() const { return enqueued_; }
  void stop_producing() {
    producing_ = false;
    if (producer_.joinable()) producer_.join();
  }

 private:
  std::string url_;
  int rate_;
  std::string schema_;
  std::string dir_;
  std::unique_ptr<pqxx::connection> db_;
  std::map<std::string, std::unique_ptr<test::Proxy>> proxies_;
  std::map<std::string, std::unique_ptr<Process>> nodes_;
  std::atomic<bool> producing_{false};
  std::atomic<long long> enqueued_{0};
  std::thread producer_;
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  int rate = 1000;
  std::string only;
  const char* usage =
      "bench/failover [--rounds 1..100] [--rate 100..20000] "
      "[--only SIGKILL|SIGSTOP|SIGTERM|partition]";
  if (const int code = bench::check_flag_pairs(argc, argv, usage); code >= 0) return code;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) {
      rounds = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--rate") == 0) {
      rate = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--only") == 0) {
      only = argv[i + 1];
    } else {
      std::fprintf(stderr, "failover: unknown flag %s\nusage: %s\n", argv[i], usage);
      return 2;
    }
  }
  std::vector<Variant> variants{{"SIGKILL", SIGKILL, {}, {}, 0},
                                {"SIGSTOP", SIGSTOP, {}, {}, 0},
                                {"SIGTERM", SIGTERM, {}, {}, 0},
                                {"partition", kPartition, {}, {}, 0}};
  if (!only.empty()) {
    std::erase_if(variants, [&](const Variant& v) { return v.name != only; });
  }
  if (rounds < 1 || rounds > 100 || rate < 100 || rate > 20000 || variants.empty()) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  try {
    baton::test::TempDirsGuard temp_dirs;  // ends last: the server and the nodes stop first
    bench::BenchDatabase database;
    Bench b(database.url(), rate);
    if (b.leader().empty()) wait_for([&] { return !b.leader().empty(); }, 30s);
    b.produce();
    std::this_thread::sleep_for(1s);
    for (auto& v : variants) {
      const auto twice_before = b.run_twice();
      const auto committed_before = b.committed_twice();
      for (int r = 0; r < rounds; ++r) {
        const double ms = b.fault(v);
        if (ms >= 0) v.ms.push_back(ms);
        std::fprintf(stderr, "%s round %d: %.1f ms\n", v.name.c_str(), r + 1, ms);
      }
      v.run_twice = b.run_twice() - twice_before;
      v.committed_twice = b.committed_twice() - committed_before;
    }
    b.stop_producing();
    const bool drained = wait_for([&] { return b.count("SELECT count(*) FROM jobs") == 0; }, 60s);
    const long long finished =
        b.count("SELECT count(*) FROM job_history") + b.count("SELECT count(*) FROM dead_jobs");

    std::printf("\nfailover: 3 nodes, %d record_tx jobs/s, %d faults per variant\n", rate, rounds);
    std::printf("fault to the next epoch's first job:\n");
    std::printf("%-9s %8s %8s %8s %10s %16s\n", "fault", "p50 ms", "p95 ms", "max ms", "run twice",
                "committed twice");
    for (const auto& v : variants) {
      std::printf("%-9s %8.1f %8.1f %8.1f %10lld %16lld%s\n", v.name.c_str(), percentile(v.ms, 0.5),
                  percentile(v.ms, 0.95), percentile(v.ms, 1.0), v.run_twice, v.committed_twice,
                  v.missed > 0 ? "  (some faults saw no takeover)" : "");
    }
    for (const auto& v : variants) {
      if (v.signal != kPartition) continue;
      std::printf(
          "partition to the old leader's demotion: p50 %.1f ms, max %.1f ms; next grant "
          "before the demotion in %d of %zu rounds\n",
          percentile(v.demoted_ms, 0.5), percentile(v.demoted_ms, 1.0), v.granted_first,
          v.demoted_ms.size());
    }
    std::printf("jobs enqueued %lld, finished %lld, lost %lld%s\n\n", b.enqueued(), finished,
                b.enqueued() - finished, drained ? "" : " (queue did not drain in 60 s)");
    for (const auto& v : variants) {
      std::printf("%s\n", nlohmann::json{{"bench", "failover"},
                                         {"fault", v.name},
                                         {"rounds", rounds},
                                         {"p50_ms", percentile(v.ms, 0.5)},
                                         {"p95_ms", percentile(v.ms, 0.95)},
                                         {"max_ms", percentile(v.ms, 1.0)},
                                         {"run_twice", v.run_twice},
                                         {"committed_twice", v.committed_twice},
                                         {"missed", v.missed}}
                              .dump()
                              .c_str());
      if (v.signal == kPartition) {
        std::printf("%s\n", nlohmann::json{{"bench", "failover"},
                                           {"fault", "partition_demotion"},
                                           {"rounds", rounds},
                                           {"p50_ms", percentile(v.demoted_ms, 0.5)},
                                           {"max_ms", percentile(v.demoted_ms, 1.0)},
                                           {"granted_first", v.granted_first}}
                                .dump()
                                .c_str());
      }
    }
    const bool ordered = std::all_of(variants.begin(), variants.end(),
                                     [](const Variant& v) { return v.granted_first == 0; });
    if (b.committed_twice() == 0 && b.enqueued() == finished && ordered) return 0;
    test::keep_temp_dirs();  // the nodes' logs, for a look at what went wrong
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failover: %s\n", e.what());
    return 1;
  }
}
