// Rescuer (see rescuer.h).
#include "worker/rescuer.h"

#include <spdlog/spdlog.h>

namespace baton::worker {
namespace {

// Transactions of the other nodes of this lock group (the nodes row names shard 0's group), open
// longer than the database-side lease, of nodes that lead nothing: a deposed leader's (a follower
// has none). Their commits would be fenced; their row locks would
// hold up this leader's transactional handlers.
constexpr const char* kEndDeposedSql = R"sql(
SELECT count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(a.pid))
  FROM pg_catalog.pg_stat_activity a
 WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
   AND a.xact_start < clock_timestamp() - $2::bigint * interval '1 millisecond'
   AND a.application_name IN (SELECT n.node_id || '@' || $3 FROM nodes n
                               WHERE n.lock_group = $1 AND n.node_id <> $4
                                 -- A node that leads a shard is no deposed leader.
                                 AND NOT EXISTS (SELECT 1 FROM locks l
                                                  WHERE l.client_id = n.node_id
                                                    AND l.expires_at > clock_timestamp()))
)sql";

}  // namespace

std::unique_ptr<PeriodicService> make_rescuer(const detail::ConnectOptions& connect,
                                              const RescuerConfig& config,
                                              const detail::LockName& lock, std::string node_id,
                                              RescuerHooks hooks) {
  return std::make_unique<PeriodicService>(
      "rescuer", connect, config.interval,
      [config, node_group = config.node_group.empty() ? lock.group() : config.node_group, lock,
       node_id = std::move(node_id), hooks = std::move(hooks),
       connect_schema = connect.schema](pqxx::connection& conn, std::int64_t epoch) {
        const detail::Claimer me{lock, node_id, epoch};
        const auto r = detail::rescue_lost(conn, me, hooks.running_ids(), config.leaderless_grace);
        if (r.requeued + r.dead + r.cancelled > 0) {
          spdlog::warn(
              "rescued {} running jobs that no live run will finish (epoch={}): {} back in the "
              "queue, {} dead as crashed (no attempt left), {} cancelled as asked",
              r.requeued + r.dead + r.cancelled, epoch, r.requeued, r.dead, r.cancelled);
        }
        if (const auto n = detail::rescue_timed_out(conn, me, config.timeout_grace.count());
            n > 0) {
          spdlog::warn("rescued {} jobs that produced no outcome within their timeout", n);
        }
        for (const auto id : detail::cancel_requested(conn, me))
          hooks.cancel_job(id);
        if (config.move_strays_shards > 0) {
          if (const auto n = detail::move_stray_jobs(conn, config.move_strays_shards); n > 0) {
            spdlog::warn("moved {} waiting jobs of shards that no longer exist to shards of {}", n,
                         config.move_strays_shards);
          }
        }
        if (config.deposed_after.count() > 0) {
          pqxx::nontransaction tx(conn);
          const auto ended = tx.exec_params(kEndDeposedSql, node_group,
                                            static_cast<std::int64_t>(config.deposed_after.count()),
                                            connect_schema, node_id)[0][0]
                                 .as<std::int64_t>();
          if (ended > 0) {
            spdlog::warn("ended {} transaction(s) of deposed leaders of this lock group", ended);
          }
        }
      });
}

}  // namespace baton::worker
