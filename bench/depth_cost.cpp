// bench/depth_cost: what one depth sample (the leader's per-queue count by state, oldest age and
// dead count) costs with 100k, 1M and 5M live jobs in 10 queues, 90 % available, 5 % scheduled,
// 5 % running. Prints the median of 5 samples per size.
//   bench/depth_cost [--max 5000000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "baton/detail/db.h"
#include "baton/detail/migrations.h"
#include "bench_db.h"
#include "worker/depth_sampler.h"

int main(int argc, char** argv) {
  long long max_rows = 5'000'000;
  if (argc == 3 && std::strcmp(argv[1], "--max") == 0) max_rows = std::atoll(argv[2]);
  try {
    baton::test::TempDirsGuard temp_dirs;  // ends last: the server and the nodes stop first
    baton::bench::BenchDatabase database;
    const std::string schema = "bench_depth_" + std::to_string(getpid());
    auto conn = baton::detail::connect(
        {.url = database.url(), .schema = schema, .application_name = "bench"});
    baton::detail::migrate(*conn, schema);
    long long rows = 0;
    std::printf("%12s %12s %12s\n", "live jobs", "sample ms", "insert s");
    for (long long target : {100'000LL, 1'000'000LL, 5'000'000LL}) {
      if (target > max_rows) break;
      const auto t0 = std::chrono::steady_clock::now();
      while (rows < target) {
        const long long n = std::min(500'000LL, target - rows);
        pqxx::work tx(*conn);
        tx.exec_params(
            "INSERT INTO jobs (queue, type, state, run_at, claimed_epoch) "
            "SELECT 'q' || (i % 10), 'noop', CASE WHEN i % 20 = 0 THEN 'running' ELSE "
            "'available' END, CASE WHEN i % 20 = 1 THEN now() + interval '1 hour' ELSE now() END, "
            "CASE WHEN i % 20 = 0 THEN 1 END FROM generate_series($1::bigint, $2::bigint) i",
            rows, rows + n - 1);
        tx.commit();
        rows += n;
      }
      pqxx::nontransaction(*conn).exec("VACUUM ANALYZE jobs");
      const double insert_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<double> ms;
      for (int i = 0; i < 5; ++i) {
        const auto s = std::chrono::steady_clock::now();
        pqxx::read_transaction tx(*conn);
        tx.exec(baton::worker::depth_sql());
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s)
                         .count());
      }
      std::sort(ms.begin(), ms.end());
      std::printf("%12lld %12.1f %12.1f\n", rows, ms[2], insert_s);
      std::printf(
          "%s\n",
          nlohmann::json{{"bench", "depth_cost"}, {"live_jobs", rows}, {"sample_ms_median", ms[2]}}
              .dump()
              .c_str());
    }
    pqxx::nontransaction(*conn).exec("DROP SCHEMA " + schema + " CASCADE");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depth_cost: %s\n", e.what());
    return 1;
  }
  return 0;
}
