// Operators' read queries (see inspect.h).
#include "baton/detail/inspect.h"

#include <date/date.h>

#include "baton/detail/schedule.h"

namespace baton::detail::inspect {
namespace {

constexpr const char* kStatsSql = R"sql(
WITH recent AS (
  SELECT queue,
         count(*) FILTER (WHERE finished_at > now() - interval '1 minute') AS done_1m,
         count(*) FILTER (WHERE finished_at > now() - interval '15 minutes') AS done_15m,
         round((percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at)))::numeric, 3) AS wait_p50_s,
         round((percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at)))::numeric, 3) AS wait_p95_s,
         round((percentile_cont(0.5) WITHIN GROUP (ORDER BY run_seconds))::numeric, 3) AS run_p50_s,
         round((percentile_cont(0.95) WITHIN GROUP (ORDER BY run_seconds))::numeric, 3) AS run_p95_s
    FROM job_history WHERE finished_at > now() - interval '15 minutes' GROUP BY queue),
failed AS (
  SELECT queue,
         count(*) FILTER (WHERE died_at > now() - interval '1 minute') AS dead_1m,
         count(*) FILTER (WHERE died_at > now() - interval '15 minutes') AS dead_15m
    FROM dead_jobs WHERE died_at > now() - interval '15 minutes' GROUP BY queue),
handled AS (
  -- The types the leaders (of every lock group) handle now.
  SELECT DISTINCT unnest(n.handles) AS type
    FROM nodes n JOIN locks l ON l.client_id = n.node_id AND l.expires_at > clock_timestamp()),
live AS (
  SELECT queue,
         count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS available,
         count(*) FILTER (WHERE state = 'available' AND run_at > now()) AS scheduled,
         count(*) FILTER (WHERE state = 'running') AS running,
         count(*) FILTER (WHERE state = 'available' AND run_at <= now()
                            AND type NOT IN (SELECT type FROM handled)) AS without_handler,
         round(extract(epoch FROM now() - min(run_at) FILTER (
           WHERE state = 'available' AND run_at <= now()))::numeric, 3) AS oldest_available_s
    FROM jobs GROUP BY queue),
hist AS (SELECT queue, count(*) AS completed FROM job_history GROUP BY queue),
dead AS (SELECT queue, count(*) AS dead FROM dead_jobs GROUP BY queue)
SELECT q.queue, coalesce(s.paused, false) AS paused,
       coalesce(l.available, 0) AS available, coalesce(l.scheduled, 0) AS scheduled,
       coalesce(l.running, 0) AS running, coalesce(h.completed, 0) AS completed,
       coalesce(d.dead, 0) AS dead, coalesce(l.without_handler, 0) AS without_handler,
       l.oldest_available_s,
       coalesce(r.done_1m, 0) AS completed_1m, coalesce(r.done_15m, 0) AS completed_15m,
       coalesce(f.dead_1m, 0) AS dead_1m, coalesce(f.dead_15m, 0) AS dead_15m,
       r.wait_p50_s, r.wait_p95_s, r.run_p50_s, r.run_p95_s
  FROM (SELECT queue FROM live UNION SELECT queue FROM hist UNION SELECT queue FROM dead
        UNION SELECT queue FROM queue_state WHERE paused) q
  LEFT JOIN live l USING (queue) LEFT JOIN hist h USING (queue) LEFT JOIN dead d USING (queue)
  LEFT JOIN recent r USING (queue) LEFT JOIN failed f USING (queue)
  LEFT JOIN queue_state s USING (queue)
 ORDER BY q.queue
)sql";

// A shard's lock row is "<lock_key>:<k>" (shard 0: the lock key itself).
constexpr const char* kLeadersSql = R"sql(
SELECT coalesce(substring(l.lock_key FROM ':([0-9]+)$')::int, 0) AS shard,
       l.client_id AS leader, l.epoch, l.region, l.lock_key,
       to_char(l.created_date, 'YYYY-MM-DD"T"HH24:MI:SS.MSOF') AS since,
       round(extract(epoch FROM clock_timestamp() - l.renewed_at)::numeric, 3) AS renewed_s_ago,
       l.expires_at > clock_timestamp() AS lease_valid, l.holder_host AS host,
       n.metrics_addr
  FROM locks l LEFT JOIN nodes n ON n.node_id = l.client_id
 ORDER BY l.region, regexp_replace(l.lock_key, ':[0-9]+$', ''), 1
)sql";

// Role and status come from the lease and last_seen, not from what a node last wrote: a killed
// leader stops being "leader" when its lease runs out and "live" when it stops touching its row.
constexpr const char* kNodesSql = R"sql(
SELECT n.node_id, n.host, n.pid,
       CASE WHEN EXISTS (SELECT 1 FROM locks l WHERE l.client_id = n.node_id
                            AND l.expires_at > clock_timestamp()) THEN 'leader'
            WHEN n.role = 'stopped' THEN 'stopped'
            WHEN n.last_seen > now() - $1::int * interval '1 second' THEN 'follower'
            ELSE '-' END AS role,
       CASE WHEN n.role = 'stopped' THEN 'stopped'
            WHEN n.last_seen > now() - $1::int * interval '1 second' THEN 'live'
            ELSE 'dead' END AS status,
       n.lock_group,
       (SELECT count(*) FROM locks l WHERE l.client_id = n.node_id
           AND l.expires_at > clock_timestamp()) AS leads,
       n.epoch AS last_epoch, n.version,
       round(extract(epoch FROM now() - n.last_seen)::numeric, 1) AS last_seen_s_ago,
       n.metrics_addr
  FROM nodes n
 WHERE n.last_seen > now() - interval '1 hour'
 ORDER BY n.node_id
)sql";

constexpr const char* kJobSql = R"sql(
SELECT 'live' AS status, id, queue, type, partition_key, partition, payload, priority, state,
       CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelling'
            WHEN state = 'running' THEN 'running'
            WHEN run_at > now() THEN 'scheduled' ELSE 'available' END AS now,
       run_at, attempts, max_attempts, created_at, first_started_at, claimed_at, claimed_by,
       claimed_epoch, claim_group, idempotency_key, cancel_requested_at, last_error, errors
  FROM jobs WHERE id = $1
)sql";

constexpr const char* kHistoryJobSql = R"sql(
SELECT 'finished' AS status, id, queue, type, partition_key, payload, priority, attempts,
       created_at, run_at, first_started_at, started_at, finished_at, run_seconds, node, epoch,
       outcome, idempotency_key, last_error, errors
  FROM job_history WHERE id = $1
)sql";

constexpr const char* kDeadShowSql = R"sql(
SELECT 'dead' AS status, id, queue, type, partition_key, payload, priority, attempts,
       max_attempts, reason, created_at, first_started_at, died_at, node, epoch,
       idempotency_key, last_error, errors
  FROM dead_jobs WHERE id = $1
)sql";

constexpr const char* kDeadListSql = R"sql(
SELECT id, queue, type, attempts, reason, to_char(died_at, 'YYYY-MM-DD"T"HH24:MI:SS') AS died_at,
       left(last_error, 120) AS last_error
  FROM dead_jobs WHERE ($1 = '' OR queue = $1) ORDER BY died_at DESC, id DESC LIMIT $2
)sql";

constexpr const char* kQueueListSql = R"sql(
SELECT q.queue, coalesce(s.paused, false) AS paused, s.partitions,
       (SELECT count(*) FROM jobs j WHERE j.queue = q.queue) AS jobs,
       s.updated_by, to_char(s.updated_at, 'YYYY-MM-DD"T"HH24:MI:SS') AS updated_at
  FROM (SELECT DISTINCT queue FROM jobs UNION SELECT queue FROM queue_state) q
  LEFT JOIN queue_state s USING (queue)
 ORDER BY q.queue
)sql";

constexpr const char* kSagasSql = R"sql(
SELECT s.id, s.type, s.version,
       (SELECT string_agg(i.property || '=' || i.value, ' ' ORDER BY i.property)
          FROM saga_index i WHERE i.saga_id = s.id) AS indexed,
       to_char(s.updated_at, 'YYYY-MM-DD"T"HH24:MI:SS') AS updated_at,
       to_char(s.completed_at, 'YYYY-MM-DD"T"HH24:MI:SS') AS completed_at
  FROM sagas s
 WHERE ($1 = '' OR s.type = $1) AND ($2 OR s.completed_at IS NULL)
 ORDER BY s.updated_at DESC LIMIT $3
)sql";

constexpr const char* kSagaSql = R"sql(
SELECT id, type, version, created_at, updated_at, completed_at,
       (SELECT jsonb_object_agg(property, value) FROM saga_index WHERE saga_id = s.id) AS indexed,
       data
  FROM sagas s WHERE id::text = $1
)sql";

constexpr const char* kSchedulesSql = R"sql(
SELECT s.name, s.spec, s.type, s.queue, s.missed, s.active,
       to_char(s.last_tick, 'YYYY-MM-DD"T"HH24:MI:SSOF') AS last_tick,
       CASE WHEN s.last_job_id IS NULL THEN NULL
            WHEN EXISTS (SELECT 1 FROM job_history h WHERE h.id = s.last_job_id
                            AND h.outcome = 'completed') THEN 'completed'
            WHEN EXISTS (SELECT 1 FROM job_history h WHERE h.id = s.last_job_id) THEN 'cancelled'
            WHEN EXISTS (SELECT 1 FROM dead_jobs d WHERE d.id = s.last_job_id) THEN 'dead'
            WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.last_job_id AND j.last_error IS NOT NULL)
              THEN 'failing'
            WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.last_job_id) THEN 'pending'
            ELSE 'pruned' END AS last_run,
       s.last_job_id,
       extract(epoch FROM now())::bigint AS now_epoch
  FROM periodic_schedules s ORDER BY s.name
)sql";

// The next tick of a stored spec ("every Ns" or "<cron> <tz>") after `now`, or "-".
std::string next_tick(const std::string& spec, long long now) {
  try {
    std::unique_ptr<Schedule> s;
    if (spec.rfind("every ", 0) == 0) {
      s = every(std::chrono::seconds(std::stoll(spec.substr(6))));
    } else {
      const auto tz_at = spec.rfind(' ');
      s = cron(spec.substr(0, tz_at), spec.substr(tz_at + 1));
    }
    return date::format("%FT%TZ", s->next_after(SysSeconds(std::chrono::seconds(now))));
  } catch (const std::exception&) {
    return "-";  // a spec this binary cannot read
  }
}

}  // namespace

pqxx::result queue_stats(pqxx::transaction_base& tx) {
  return tx.exec(kStatsSql);
}

pqxx::result leaders(pqxx::transaction_base& tx) {
  return tx.exec(kLeadersSql);
}

pqxx::result nodes(pqxx::transaction_base& tx) {
  return tx.exec_params(kNodesSql, kLiveSeconds);
}

pqxx::result job(pqxx::transaction_base& tx, std::int64_t id) {
  auto rows = tx.exec_params(kJobSql, id);
  if (rows.empty()) rows = tx.exec_params(kHistoryJobSql, id);
  if (rows.empty()) rows = tx.exec_params(kDeadShowSql, id);
  return rows;
}

pqxx::result dead_list(pqxx::transaction_base& tx, const std::string& queue, int limit) {
  return tx.exec_params(kDeadListSql, queue, limit);
}

pqxx::result dead_show(pqxx::transaction_base& tx, std::int64_t id) {
  return tx.exec_params(kDeadShowSql, id);
}

pqxx::result queue_list(pqxx::transaction_base& tx) {
  return tx.exec(kQueueListSql);
}

pqxx::result sagas(pqxx::transaction_base& tx, const std::string& type, bool with_completed,
                   int limit) {
  return tx.exec_params(kSagasSql, type, with_completed, limit);
}

pqxx::result saga(pqxx::transaction_base& tx, const std::string& id) {
  return tx.exec_params(kSagaSql, id);
}

nlohmann::ordered_json schedules(pqxx::transaction_base& tx) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& r : tx.exec(kSchedulesSql)) {
    nlohmann::ordered_json row;
    for (const char* k : {"name", "spec", "type", "queue", "missed"})
      row[k] = r[k].c_str();
    const bool active = std::string_view(r["active"].c_str()) == "t";
    row["active"] = active;
    row["last_tick"] =
        r["last_tick"].is_null() ? nullptr : nlohmann::ordered_json(r["last_tick"].c_str());
    row["next_tick"] = active ? next_tick(r["spec"].c_str(), r["now_epoch"].as<long long>()) : "-";
    row["last_run"] =
        r["last_run"].is_null() ? nullptr : nlohmann::ordered_json(r["last_run"].c_str());
    row["last_job_id"] = r["last_job_id"].is_null()
                             ? nullptr
                             : nlohmann::ordered_json(r["last_job_id"].as<long long>());
    out.push_back(std::move(row));
  }
  return out;
}

nlohmann::ordered_json to_json(const pqxx::result& rows) {
  constexpr pqxx::oid kBool = 16, kInt2 = 21, kInt4 = 23, kInt8 = 20, kFloat4 = 700, kFloat8 = 701,
                      kNumeric = 1700, kJson = 114, kJsonb = 3802;
  auto out = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (const auto& f : r) {
      const auto type = f.type();
      if (f.is_null()) {
        o[f.name()] = nullptr;
      } else if (type == kBool) {
        o[f.name()] = std::string_view(f.c_str()) == "t";
      } else if (type == kInt2 || type == kInt4 || type == kInt8) {
        o[f.name()] = f.as<long long>();
      } else if (type == kFloat4 || type == kFloat8 || type == kNumeric) {
        o[f.name()] = f.as<double>();
      } else if (type == kJson || type == kJsonb) {
        o[f.name()] = nlohmann::ordered_json::parse(f.c_str(), nullptr, false);
      } else {
        o[f.name()] = f.c_str();
      }
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace baton::detail::inspect
