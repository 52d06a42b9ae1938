// Pruner (see pruner.h).
#include "worker/pruner.h"

#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

#include "baton/detail/db.h"
#include "baton/detail/job_store.h"

namespace baton::worker {

namespace {
// Index ranges of history summarized again each tick by the sweep: 64 ranges of 32 pages read
// 16 MB a tick, and go through 100 million rows of history (about 100 bytes each, 10 GB) in
// about 10 hours of ticks.
constexpr int kSweepRanges = 64;
}  // namespace

std::unique_ptr<PeriodicService> make_pruner(const detail::ConnectOptions& connect,
                                             PrunerConfig config) {
  // The sweep starts at a block chosen at random (-1), so that a node that leads only for a
  // while still reaches every part of history, in turn with the nodes before it.
  return std::make_unique<PeriodicService>(
      "pruner", connect, config.interval,
      [config, sweep = std::int64_t{-1}, held = false](pqxx::connection& conn,
                                                       std::int64_t) mutable {
        // First the ranges the last ticks' deletes were in (see sql/0018). The deletes run
        // whatever becomes of this; a failure here fails the tick after them, so that the
        // service logs it and counts it (baton_database_errors_total{component="pruner"}).
        std::string summary_failed;
        try {
          const auto next = detail::summarize_history(conn, sweep, kSweepRanges);
          if (!next && !held) {
            spdlog::info(
                "pruner: another session holds job_history (a vacuum?); its index summaries "
                "wait, the deletes go on");
          }
          if (next && held) spdlog::info("pruner: history's index summaries made again");
          held = !next;
          if (next) sweep = *next;
        } catch (const std::exception& e) {
          if (detail::is_connection_error(e)) throw;
          summary_failed = e.what();
        }
        // At most 100 batches a tick, so one tick never runs for long.
        std::size_t total = 0;
        for (int i = 0; i < 100; ++i) {
          const auto p = detail::prune_history(conn, config.retention.count(), config.batch);
          total += p.rows;
          if (!p.more) break;
        }
        if (total > 0) spdlog::info("pruned {} history rows older than the retention", total);
        if (!summary_failed.empty()) {
          throw std::runtime_error("could not summarize history's finished_at index (" +
                                   summary_failed + "); the deletes went on");
        }
      });
}

}  // namespace baton::worker
