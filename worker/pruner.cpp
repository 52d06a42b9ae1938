// Pruner (see pruner.h).
#include "worker/pruner.h"

#include <spdlog/spdlog.h>

#include "baton/detail/job_store.h"

namespace baton::worker {

namespace {
// Index ranges of history summarized again each tick by the sweep: 64 ranges of 32 pages read
// 16 MB a tick, and go through 100 million rows of history in about a day of ticks.
constexpr int kSweepRanges = 64;
}  // namespace

std::unique_ptr<PeriodicService> make_pruner(const detail::ConnectOptions& connect,
                                             PrunerConfig config) {
  return std::make_unique<PeriodicService>(
      "pruner", connect, config.interval,
      [config, sweep = std::int64_t{0}](pqxx::connection& conn, std::int64_t) mutable {
        // First the ranges the last tick's deletes left unsummarized: their deleted rows are
        // gone from every snapshot by now (unless a transaction has been open since).
        sweep = detail::summarize_history(conn, sweep, kSweepRanges);
        // At most 100 batches a tick, so one tick never runs for long.
        std::size_t total = 0;
        bool held = false;
        for (int i = 0; i < 100; ++i) {
          const auto p = detail::prune_history(conn, config.retention.count(), config.batch);
          total += p.rows;
          held = held || p.history_held;
          if (!p.more || p.history_held) break;
        }
        if (total > 0) spdlog::info("pruned {} history rows older than the retention", total);
        if (held) {
          spdlog::info(
              "history's finished_at index was held (by a vacuum); its old rows wait for the next "
              "tick");
        }
      });
}

}  // namespace baton::worker
