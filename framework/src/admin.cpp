// Operators' actions (see baton/admin.h): each one transaction, recording who did it.
#include "baton/admin.h"

#include <pqxx/pqxx>

#include "baton/client.h"
#include "baton/detail/control.h"
#include "baton/detail/db.h"
#include "baton/detail/job_queries.h"

namespace baton {
namespace {

constexpr const char* kQueueKnownSql = R"sql(
SELECT EXISTS (SELECT 1 FROM @.queue_state WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM @.dead_jobs WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM @.jobs WHERE queue = $1)
)sql";

constexpr const char* kPauseSql = R"sql(
INSERT INTO @.queue_state (queue, paused, updated_by) VALUES ($1, $2, $3)
ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused, updated_at = now(),
                                  updated_by = excluded.updated_by
)sql";

constexpr const char* kOrderedSql = R"sql(
INSERT INTO @.queue_state (queue, partitions, updated_by) VALUES ($1, $2, $3)
ON CONFLICT (queue) DO UPDATE SET partitions = excluded.partitions, updated_at = now(),
                                  updated_by = excluded.updated_by
)sql";

// Back to the queue under the same id, with fresh attempts; the error history and the claim
// count (the fencing token) stay. A dead job whose idempotency key a live job holds now stays
// dead (requeueing it would break the key's promise).
constexpr const char* kDeadRetrySql = R"sql(
WITH d AS (
  DELETE FROM @.dead_jobs x
   WHERE (x.id = $1 OR ($1 = 0 AND ($2 = '' OR x.queue = $2)))
     AND NOT EXISTS (SELECT 1 FROM @.jobs j
                      WHERE j.queue = x.queue AND j.idempotency_key = x.idempotency_key)
  RETURNING *),
ins AS (
  INSERT INTO @.jobs (id, queue, partition_key, partition, type, payload, priority, max_attempts,
                      created_at, errors, claims, idempotency_key, shard)
  OVERRIDING SYSTEM VALUE
  SELECT id, queue, partition_key, @.job_partition(queue, partition_key), type, payload, priority,
         max_attempts, created_at, errors, claims, idempotency_key,
         @.shard_of(partition_key, @.shard_count())
    FROM d
  RETURNING id, queue),
wake AS (SELECT count(pg_catalog.pg_notify($3, q)) AS n FROM (SELECT DISTINCT queue AS q FROM ins) x)
SELECT count(*) FROM ins WHERE (SELECT n FROM wake) >= 0
)sql";

constexpr const char* kDiscardSql = "DELETE FROM @.dead_jobs WHERE id = $1";

constexpr const char* kPurgeSql = R"sql(
DELETE FROM @.dead_jobs WHERE died_at < now() - $1::bigint * interval '1 millisecond'
   AND ($2 = '' OR queue = $2)
)sql";

void check_queue(std::string_view queue) {
  try {
    detail::validate_name("queue", queue);
  } catch (const EnqueueError& e) {
    throw AdminError(e.what());
  }
}

}  // namespace

Admin::Admin(const std::string& database_url, std::string schema, std::string actor)
    : schema_(std::move(schema)), actor_(std::move(actor)) {
  detail::validate_schema_name(schema_);
  // No session settings (every statement names the schema), as a Client's: a long-lived tool's
  // Admin opens a new session by itself on the call after the server ended one, and a session
  // that comes back so must not be missing anything.
  owned_ = detail::connect({.url = database_url,
                            .schema = schema_,
                            .application_name = actor_,
                            .session_settings = false});
  conn_ = owned_.get();
}

Admin::Admin(pqxx::connection& conn, std::string schema, std::string actor)
    : conn_(&conn), schema_(std::move(schema)), actor_(std::move(actor)) {
  detail::validate_schema_name(schema_);
}

Admin::~Admin() = default;

// Every transaction below runs on a caller's session (an Admin from a URL sets nothing on its
// own), so each first searches baton's schema only (detail::search_schema_only).

bool Admin::set_paused(std::string_view queue, bool paused) {
  check_queue(queue);
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  const std::string q(queue);
  const bool known =
      tx.exec_params(detail::with_schema(kQueueKnownSql, schema_), q)[0][0].as<bool>();
  tx.exec_params(detail::with_schema(kPauseSql, schema_), q, paused, actor_);
  // Wakes the leader's poller, so a resumed queue's jobs start at once.
  tx.exec_params("SELECT pg_catalog.pg_notify($1, $2)", detail::jobs_channel(schema_), q);
  tx.commit();
  return known;
}

void Admin::declare_ordered(std::string_view queue, int partitions) {
  check_queue(queue);
  if (partitions < 1 || partitions > 4096) {
    throw AdminError("partitions " + std::to_string(partitions) + " is out of range; use 1..4096");
  }
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  tx.exec_params(detail::with_schema(kOrderedSql, schema_), std::string(queue), partitions, actor_);
  tx.commit();
}

bool Admin::retry_dead(std::int64_t id) {
  if (id <= 0) throw AdminError("a job id is a positive number");
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  const auto n = tx.exec_params(detail::with_schema(kDeadRetrySql, schema_), id, std::string(),
                                detail::jobs_channel(schema_))[0][0]
                     .as<std::int64_t>();
  tx.commit();
  return n > 0;
}

std::int64_t Admin::retry_dead_all(std::string_view queue) {
  if (!queue.empty()) check_queue(queue);
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  const auto n = tx.exec_params(detail::with_schema(kDeadRetrySql, schema_), std::int64_t{0},
                                std::string(queue), detail::jobs_channel(schema_))[0][0]
                     .as<std::int64_t>();
  tx.commit();
  return n;
}

bool Admin::discard_dead(std::int64_t id) {
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  const auto n = tx.exec_params(detail::with_schema(kDiscardSql, schema_), id).affected_rows();
  tx.commit();
  return n > 0;
}

std::int64_t Admin::purge_dead(std::chrono::milliseconds older_than, std::string_view queue) {
  if (!queue.empty()) check_queue(queue);
  if (older_than.count() < 0) throw AdminError("older-than must not be negative");
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  const auto n = tx.exec_params(detail::with_schema(kPurgeSql, schema_),
                                static_cast<std::int64_t>(older_than.count()), std::string(queue))
                     .affected_rows();
  tx.commit();
  return static_cast<std::int64_t>(n);
}

CancelResult Admin::cancel(std::int64_t id) {
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  const auto result = detail::cancel_job(tx, schema_, id);
  tx.commit();
  return result;
}

std::int64_t Admin::request_step_down(std::string_view node, std::string_view note) {
  pqxx::work tx(*conn_);
  detail::search_schema_only(tx, schema_);
  detail::ControlRequest request;
  request.target = node.empty() ? "*" : std::string(node);
  request.note = note.empty() ? actor_ : std::string(note);
  const auto id = detail::send_control(tx, schema_, request);
  tx.commit();
  return id;
}

}  // namespace baton
