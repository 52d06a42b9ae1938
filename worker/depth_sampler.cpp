// Depth sampler (see depth_sampler.h).
#include "worker/depth_sampler.h"

#include <algorithm>
#include <map>

namespace baton::worker {
namespace {

// One scan of the live queue, by queue and type; the dead counts by queue. $1: the queues this
// node consumes (empty: all).
constexpr const char* kDepthSql = R"sql(
WITH live AS (
  SELECT queue, type,
         count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS available,
         count(*) FILTER (WHERE state = 'available' AND run_at > now()) AS scheduled,
         count(*) FILTER (WHERE state = 'running') AS running,
         coalesce(extract(epoch FROM now() - min(run_at) FILTER (
           WHERE state = 'available' AND run_at <= now())), 0)::float8 AS oldest
    FROM jobs WHERE cardinality($1::text[]) = 0 OR queue = ANY ($1::text[])
   GROUP BY queue, type),
dead AS (SELECT queue, count(*) AS dead FROM dead_jobs
          WHERE cardinality($1::text[]) = 0 OR queue = ANY ($1::text[]) GROUP BY queue)
SELECT queue, type, coalesce(available, 0), coalesce(scheduled, 0), coalesce(running, 0),
       coalesce(oldest, 0), coalesce(dead, 0)
  FROM live FULL JOIN dead USING (queue)
)sql";

std::string text_array(const std::vector<std::string>& names) {
  // Queue names follow the naming rule: no quote or backslash to escape.
  std::string out = "{";
  for (const auto& n : names)
    out += (out.size() > 1 ? ",\"" : "\"") + n + "\"";
  return out + "}";
}

}  // namespace

const char* depth_sql() {
  return kDepthSql;
}

std::unique_ptr<PeriodicService> make_depth_sampler(const detail::ConnectOptions& connect,
                                                    DepthSamplerConfig config,
                                                    detail::QueueObserver* observer) {
  auto queues = text_array(config.queues);
  return std::make_unique<PeriodicService>(
      "depth_sampler", connect, config.interval,
      [observer, queues = std::move(queues), types = std::move(config.types)](
          pqxx::connection& conn, std::int64_t) {
        std::map<std::string, detail::QueueDepth> by_queue;
        std::vector<detail::UnhandledJobs> unhandled;
        {
          pqxx::read_transaction tx(conn);
          for (const auto& r : tx.exec_params(kDepthSql, queues)) {
            const std::string queue = r[0].c_str();
            auto& d = by_queue[queue];
            d.queue = queue;
            const auto available = r[2].as<std::int64_t>();
            d.available += available;
            d.scheduled += r[3].as<std::int64_t>();
            d.running += r[4].as<std::int64_t>();
            const double oldest = r[5].as<double>();
            d.oldest_available_seconds = std::max(d.oldest_available_seconds, oldest);
            d.dead = r[6].as<std::int64_t>();  // the same on every row of the queue
            if (!r[1].is_null() && available > 0 &&
                std::find(types.begin(), types.end(), r[1].c_str()) == types.end()) {
              unhandled.push_back({queue, r[1].c_str(), available, oldest});
            }
          }
        }
        std::vector<detail::QueueDepth> depths;
        depths.reserve(by_queue.size());
        for (auto& [queue, d] : by_queue)
          depths.push_back(std::move(d));
        if (observer != nullptr) {
          observer->queue_depths(depths);
          observer->unhandled_jobs(unhandled);
        }
      });
}

}  // namespace baton::worker
