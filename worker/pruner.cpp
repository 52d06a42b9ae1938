// Pruner (see pruner.h).
#include "worker/pruner.h"

#include <spdlog/spdlog.h>

#include "baton/detail/job_store.h"

namespace baton::worker {

std::unique_ptr<PeriodicService> make_pruner(const detail::ConnectOptions& connect,
                                             PrunerConfig config) {
  return std::make_unique<PeriodicService>(
      "pruner", connect, config.interval, [config](pqxx::connection& conn, std::int64_t) {
        // At most 100 batches a tick, so one tick never runs for long.
        std::size_t total = 0;
        for (int i = 0; i < 100; ++i) {
          const auto n = detail::prune_history(conn, config.retention.count(), config.batch);
          total += n;
          if (n < static_cast<std::size_t>(config.batch)) break;
        }
        if (total > 0) spdlog::info("pruned {} history rows older than the retention", total);
      });
}

}  // namespace baton::worker
