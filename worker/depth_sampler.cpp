// Depth sampler (see depth_sampler.h).
#include "worker/depth_sampler.h"

namespace baton::worker {
namespace {

constexpr const char* kDepthSql = R"sql(
WITH live AS (
  SELECT queue,
         count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS available,
         count(*) FILTER (WHERE state = 'available' AND run_at > now()) AS scheduled,
         count(*) FILTER (WHERE state = 'running') AS running,
         coalesce(extract(epoch FROM now() - min(run_at) FILTER (
           WHERE state = 'available' AND run_at <= now())), 0)::float8 AS oldest
    FROM jobs GROUP BY queue),
dead AS (SELECT queue, count(*) AS dead FROM dead_jobs GROUP BY queue)
SELECT queue, coalesce(available, 0), coalesce(scheduled, 0), coalesce(running, 0),
       coalesce(oldest, 0), coalesce(dead, 0)
  FROM live FULL JOIN dead USING (queue)
)sql";

}  // namespace

const char* depth_sql() {
  return kDepthSql;
}

std::unique_ptr<PeriodicService> make_depth_sampler(const detail::ConnectOptions& connect,
                                                    Millis interval,
                                                    detail::QueueObserver* observer) {
  return std::make_unique<PeriodicService>(
      "depth_sampler", connect, interval, [observer](pqxx::connection& conn, std::int64_t) {
        std::vector<detail::QueueDepth> depths;
        {
          pqxx::read_transaction tx(conn);
          for (const auto& r : tx.exec(kDepthSql)) {
            depths.push_back({r[0].c_str(), r[1].as<std::int64_t>(), r[2].as<std::int64_t>(),
                              r[3].as<std::int64_t>(), r[4].as<double>(), r[5].as<std::int64_t>()});
          }
        }
        if (observer != nullptr) observer->queue_depths(depths);
      });
}

}  // namespace baton::worker
