// bench/throughput: enqueue and drain rates, and enqueue-to-start latency, on a local cluster.
//   enqueue  single sequential enqueues (one connection), then batches of 1,000 and 10,000
//   drain    N queued no-op jobs drained by one leader (+2 passive nodes), jobs/s
//   latency  on an idle cluster, enqueue-return to handler start, p50/p99 over M samples
//   backlog  drain rate with a large backlog versus 100,000 (optional, --backlog N)
// Prints a table and one JSON object per figure.
//   bench/throughput [--drain 100000] [--samples 1000] [--threads 16] [--backlog 0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include <baton/baton.h>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "bench_db.h"
#include "support/testkit.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Options {
  long long drain = 100'000;
  int samples = 1000;
  int threads = 16;
  long long backlog = 0;
};

void figure(const char* name, const nlohmann::json& values) {
  nlohmann::json j{{"bench", name}};
  j.update(values);
  std::printf("%s\n", j.dump().c_str());
}

class Bench {
 public:
  Bench(std::string url, Options o) : url_(std::move(url)), o_(o) {
    schema_ = "bench_tp_" + std::to_string(getpid());
    dir_ = baton::test::temp_dir("bench-throughput");
    db_ = baton::detail::connect({.url = url_, .schema = schema_, .application_name = "bench"});
    baton::detail::migrate(*db_, schema_);
  }
  ~Bench() {
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

  void start_nodes(int n) {
    for (int i = 1; i <= n; ++i) {
      nodes_.push_back(std::make_unique<baton::test::Process>(
          std::vector<std::string>{baton::test::binary("batond"), "--database-url", url_,
                                   "--schema", schema_, "--node-id", "b" + std::to_string(i),
                                   "--threads", std::to_string(o_.threads), "--batch-size", "1000",
                                   "--no-migrate", "--metrics-listen", "off", "--log-level",
                                   "warn"},
          dir_ + "/b" + std::to_string(i) + ".log"));
    }
    baton::test::wait_for(
        [&] {
          return count(
                     "SELECT count(*) FROM locks WHERE expires_at > "
                     "clock_timestamp()") == 1;
        },
        30s);
  }
  void stop_nodes() { nodes_.clear(); }

  void enqueue() {
    baton::Client client(url_, schema_);
    constexpr int kSingle = 5000;
    auto t0 = Clock::now();
    for (int i = 0; i < kSingle; ++i)
      client.enqueue("noop", nlohmann::json::object());
    const double single = kSingle / std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("%-34s %12.0f jobs/s\n", "enqueue, single, sequential", single);
    figure("enqueue", {{"mode", "single"}, {"jobs_per_s", single}, {"jobs", kSingle}});
    for (int batch : {1000, 10000}) {
      std::vector<nlohmann::json> payloads(static_cast<std::size_t>(batch),
                                           nlohmann::json{{"n", 1}});
      const int rounds = 200'000 / batch;
      t0 = Clock::now();
      for (int r = 0; r < rounds; ++r)
        client.enqueue_many("noop", payloads);
      const double rate = rounds * batch / std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("enqueue, batches of %-14d %12.0f jobs/s\n", batch, rate);
      figure("enqueue", {{"mode", "batch"}, {"batch", batch}, {"jobs_per_s", rate}});
    }
    exec("TRUNCATE jobs");
  }

  double drain(long long n, const char* label) {
    exec("INSERT INTO jobs (queue, type) SELECT 'default', 'noop' FROM generate_series(1, " +
         std::to_string(n) + ")");
    exec("VACUUM ANALYZE jobs");
    const auto t0 = Clock::now();
    start_nodes(3);
    baton::test::wait_for([&] { return count("SELECT count(*) FROM jobs") == 0; }, 1800s, 50ms);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    stop_nodes();
    const double rate = static_cast<double>(n) / secs;
    std::printf("%-34s %12.0f jobs/s  (%lld jobs in %.1f s, election included)\n", label, rate, n,
                secs);
    figure("drain",
           {{"jobs", n}, {"jobs_per_s", rate}, {"seconds", secs}, {"threads", o_.threads}});
    exec("TRUNCATE job_history");
    return rate;
  }

  void latency() {
    start_nodes(1);
    baton::Client client(url_, schema_);
    std::vector<double> ms;
    for (int i = 0; i < o_.samples; ++i) {
      const auto id = client.enqueue("noop", nlohmann::json::object());
      const auto returned = std::chrono::system_clock::now();
      std::string started;
      baton::test::wait_for(
          [&] {
            pqxx::nontransaction tx(*db_);
            auto r = tx.exec_params(
                "SELECT extract(epoch FROM started_at)::float8 FROM job_history WHERE id = $1", id);
            if (r.empty()) return false;
            const auto start = std::chrono::system_clock::time_point(
                std::chrono::duration_cast<std::chrono::system_clock::duration>(
                    std::chrono::duration<double>(r[0][0].as<double>())));
            ms.push_back(std::chrono::duration<double, std::milli>(start - returned).count());
            return true;
          },
          10s, 1ms);
    }
    stop_nodes();
    std::sort(ms.begin(), ms.end());
    auto pct = [&](double p) { return ms[static_cast<std::size_t>(p * (ms.size() - 1))]; };
    std::printf("%-34s p50 %.2f ms  p99 %.2f ms  (%zu samples; started_at is the claim time)\n",
                "latency, enqueue return to start", pct(0.5), pct(0.99), ms.size());
    figure("latency", {{"samples", ms.size()}, {"p50_ms", pct(0.5)}, {"p99_ms", pct(0.99)}});
  }

 private:
  std::string url_;
  Options o_;
  std::string schema_, dir_;
  std::unique_ptr<pqxx::connection> db_;
  std::vector<std::unique_ptr<baton::test::Process>> nodes_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--drain") == 0) o.drain = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--samples") == 0) o.samples = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--threads") == 0) o.threads = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--backlog") == 0) o.backlog = std::atoll(argv[i + 1]);
  }
  try {
    baton::bench::BenchDatabase database;
    Bench b(database.url(), o);
    b.enqueue();
    const double base = b.drain(o.drain, "drain, 1 leader + 2 passive");
    if (o.backlog > 0) {
      const double big = b.drain(o.backlog, "drain, large backlog");
      std::printf("%-34s %12.0f %%\n", "backlog rate / base rate", 100 * big / base);
      figure("backlog", {{"jobs", o.backlog}, {"ratio", big / base}});
    }
    b.latency();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "throughput: %s\n", e.what());
    return 1;
  }
  return 0;
}
