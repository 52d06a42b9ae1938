// Job state changes. Each statement carries its fence: the claim checks the lock row's epoch in
// the same statement, and outcomes match only rows still running under the claiming epoch.
#include "baton/detail/job_store.h"

#include <algorithm>
#include <tuple>
#include <unordered_set>

#include "baton/detail/db.h"
#include "baton/detail/text.h"

namespace baton::detail {
namespace {

// What a claim returns of each job it takes (read by claimed_jobs), and so does the taking of an
// unanswered claim's jobs. Times as whole microseconds since 1970, from date_part (float8), not
// extract (numeric since PostgreSQL 14, and five of them a job cost 5 % of the claim); exact
// through 2100. The node works out the waits from them: a float column cost it a parse through
// a string stream per job.
constexpr const char* kClaimedColumns = R"sql(
RETURNING j.id, j.queue, j.type, j.payload::text, j.attempts, j.max_attempts,
          coalesce(j.timeout_ms, 0), (date_part('epoch', j.created_at) * 1000000)::bigint,
          j.claims, j.idempotency_key, (date_part('epoch', now()) * 1000000)::bigint, j.priority,
          (date_part('epoch', j.run_at) * 1000000)::bigint, j.partition IS NOT NULL
)sql";

// The claim. %s is empty, or FOR UPDATE SKIP LOCKED when rows held by another transaction must
// be skipped rather than waited for. %a is empty, or the condition that starts the index scan
// after a place in claim order ($11-$13, ClaimFilter::after; run_at in microseconds, so that
// no text form of a time depends on the session's DateStyle and time zone).
constexpr const char* kClaimSql = R"sql(
UPDATE jobs j
   SET state = 'running', attempts = j.attempts + 1, claims = j.claims + 1, claimed_at = now(),
       first_started_at = coalesce(j.first_started_at, now()),
       claimed_by = $1, claimed_epoch = $2, claim_group = $8
 WHERE j.ctid = ANY (ARRAY(
         SELECT ctid FROM jobs
          WHERE state = 'available' AND run_at <= now()
            AND (cardinality($5::text[]) = 0 OR queue = ANY ($5::text[]))
            AND NOT (queue = ANY ($7::text[]))
            -- Only types this node handles: during a rolling deploy that adds a type, an old
            -- leader leaves the new jobs waiting for a leader that knows them. (Compared
            -- bytewise: no collation to look up per comparison.)
            AND type COLLATE "C" = ANY ($9::text[])
            -- Looked up per job only while some queue is paused.
            AND (NOT EXISTS (SELECT 1 FROM queue_state WHERE paused)
                 OR NOT EXISTS (SELECT 1 FROM queue_state s WHERE s.queue = jobs.queue AND s.paused))
            -- In an ordered partition only its first job (by enqueue order) may run; a running
            -- or failing job is that first job, so it holds the partition until it finishes.
            AND (partition IS NULL OR id = (SELECT min(f.id) FROM jobs f
                                             WHERE f.queue = jobs.queue
                                               AND f.partition = jobs.partition))
            AND EXISTS (SELECT 1 FROM locks
                         WHERE lock_key = $3 AND region = $4 AND client_id = $1 AND epoch = $2)
            -- The claimer's shard only (0 in a deployment of one shard).
            AND shard = $10 %a
          ORDER BY shard, priority, run_at, id
          LIMIT $6 %s))
 -- The rows are found by address, all in one scan of the address list (a join with the subquery
 -- fetched them one at a time, each asking the file system for the table's size), and come back
 -- in address order: claimed_jobs puts them in claim order. The addresses were read by this
 -- statement, whose snapshot keeps those rows from being pruned, so none is reused before the
 -- update reaches it. Without SKIP LOCKED the subquery takes no row locks: only the leader
 -- claims, so normally there is nothing to skip, and a row lock per job cost a WAL record each.
 -- Should another claim take a row meanwhile (a deposed leader's, or this node's own cut claim
 -- still running on the server), this update waits for it, then re-checks the conditions below
 -- on the row's new version: one claimed is no longer available; one claimed, run and retried
 -- meanwhile is available again but not yet due. (On PostgreSQL 15.18 the address scan also
 -- finds the new version missing from the list; a release whose scan does not check addresses
 -- again relies on these conditions alone.)
 -- (`<> 'running'` means 'available', the only other state, in a form the claim index's
 -- predicate does not match: with statistics from a moment when the queue was nearly empty, the
 -- planner took a scan of that whole index for cheaper than the address list, and read 112k
 -- waiting jobs to claim 1,000.)
   AND j.state <> 'running' AND j.run_at <= now()
)sql";

// The jobs of a claim that committed but whose answer never came back (the session was cut
// while the claim committed): running under this claimer's epoch, claimed between its last
// answered claim ($4) and the reconnection ($5), both microseconds on the database clock. Taken
// as a claim is: stamped now (the hung-job rescue counts from claimed_at), row-locked meanwhile.
// The columns are the claim's. (One UPDATE over the running index by group and epoch: as a
// semi-join with jobs, its plan scanned the whole running index, 23 ms at 5M queued jobs.)
constexpr const char* kUnansweredClaimSql = R"sql(
UPDATE jobs j SET claimed_at = now()
 WHERE j.state = 'running' AND j.claim_group = $1 AND j.claimed_epoch = $2 AND j.claimed_by = $3
   AND (date_part('epoch', j.claimed_at) * 1000000)::bigint > $4
   AND (date_part('epoch', j.claimed_at) * 1000000)::bigint < $5
)sql";

// Whether a session of ours that was cut ($1 pid, $2 its backend_start in microseconds) is still
// in a transaction on the server: a claim it sent may yet commit. (A pooler may have lent the
// server session on: then it is not ours, or it is this one.)
constexpr const char* kCutSessionBusySql = R"sql(
SELECT count(*) FROM pg_catalog.pg_stat_activity a
 WHERE a.pid = $1 AND (extract(epoch FROM a.backend_start) * 1000000)::bigint = $2
   AND a.pid <> pg_catalog.pg_backend_pid() AND a.xact_start IS NOT NULL
)sql";
// The server session behind this connection (not libpq's idea of it: a pooler tells its clients
// a key of its own), and the database time now.
constexpr const char* kSessionSql = R"sql(
SELECT a.pid, (extract(epoch FROM a.backend_start) * 1000000)::bigint,
       (extract(epoch FROM now()) * 1000000)::bigint
  FROM pg_catalog.pg_stat_activity a WHERE a.pid = pg_catalog.pg_backend_pid()
)sql";

// A queue's cluster-wide concurrency gate (shards): the claims of a limited queue lock its
// queue_gates row for the length of their transaction (created on first use), and count the
// queue's running jobs on every shard. Only roles that may update queue_gates can hold it.
constexpr const char* kQueueGateSql =
    "INSERT INTO queue_gates AS g (queue) VALUES ($1) "
    "ON CONFLICT (queue) DO UPDATE SET queue = excluded.queue";
constexpr const char* kQueueRunningSql =
    "SELECT count(*) FROM jobs WHERE state = 'running' AND queue = $1";

// Shard 0's leader moves waiting jobs whose shard no longer exists (the count shrank, or a
// producer enqueued with the old count while it changed) to their shard under the count.
constexpr const char* kStraysSql = R"sql(
UPDATE jobs SET shard = shard_of(partition_key, $1)
 WHERE id = ANY (ARRAY(SELECT id FROM jobs WHERE state = 'available' AND shard >= $1 LIMIT 10000
               FOR UPDATE SKIP LOCKED))
)sql";

// Running jobs that no live run will finish (see rescue_lost in job_store.h), then their fate:
// back to the queue, dead (the lost run was the last attempt), or cancelled (it was asked).
// $1 group, $2 epoch, $3 ids this node still runs, $4 leaderless grace in ms.
// The other groups that have running jobs are found one index descent each (`before`, `after`),
// stepping over this group's range: a scan of the running index without a condition on the group
// walked every entry left by the jobs this group ran since the last vacuum (201 ms at 5M jobs,
// every 2 s). Only the jobs of a group whose lease ran out are read.
constexpr const char* kRescueSql = R"sql(
WITH RECURSIVE before(g) AS (
  SELECT (SELECT min(claim_group) FROM jobs WHERE state = 'running' AND claim_group < $1)
  UNION ALL
  SELECT (SELECT min(j.claim_group) FROM jobs j
           WHERE j.state = 'running' AND j.claim_group > b.g AND j.claim_group < $1)
    FROM before b WHERE b.g IS NOT NULL),
after(g) AS (
  SELECT (SELECT min(claim_group) FROM jobs WHERE state = 'running' AND claim_group > $1)
  UNION ALL
  SELECT (SELECT min(j.claim_group) FROM jobs j WHERE j.state = 'running' AND j.claim_group > a.g)
    FROM after a WHERE a.g IS NOT NULL),
leaderless AS (
  SELECT o.g FROM (SELECT g FROM before UNION ALL SELECT g FROM after) o
   WHERE o.g IS NOT NULL
     AND NOT EXISTS (
       SELECT 1 FROM locks l
        WHERE l.region || '/' || l.lock_key = o.g
          AND l.expires_at > clock_timestamp() - $4::bigint * interval '1 millisecond')),
-- The running jobs that no live run will finish, listed, then locked by id. Every step finds its
-- rows through an index by a list (= ANY of an ARRAY), never by a join with the table: with
-- statistics from a moment when the queue was nearly empty, the planner took the table as one
-- row and joined it as the outer side, reading every running job each time (3 s at 190k running
-- jobs, every 2 s, while nothing was lost).
candidates AS (
  SELECT id, claims FROM jobs
   WHERE state = 'running' AND claim_group = $1 AND claimed_epoch < $2
     AND NOT (id = ANY ($3::bigint[]))
  UNION ALL
  SELECT id, claims FROM jobs
   WHERE state = 'running' AND claim_group = ANY (ARRAY(SELECT g FROM leaderless))
  UNION ALL
  -- A running job without a group (written by hand): no lease holds it.
  SELECT id, claims FROM jobs WHERE state = 'running' AND claim_group IS NULL),
-- Each candidate's claim count, at the candidate's place in the sorted id list.
listed AS (
  SELECT array_agg(id ORDER BY id) AS ids, array_agg(claims ORDER BY id) AS claims
    FROM candidates),
-- Locked only as the claim that was found lost: a row changed since this statement's snapshot
-- is checked again on its new version, and a job requeued and claimed again meanwhile (by
-- another node's rescue, then its group's new leader) is a live run, whatever its state and
-- group say. The claim count tells: it grows with every claim and is never reset.
-- (`<> 'available'`, as for outcomes: the running index's statistics would make its whole scan
-- look cheaper than the list.)
stale AS (
  SELECT id, %f AS fate FROM jobs j
   WHERE state <> 'available' AND id = ANY ((SELECT ids FROM listed)::bigint[])
     AND claims = (SELECT l.claims FROM listed l)[width_bucket(id, (SELECT ids FROM listed))]
   FOR UPDATE SKIP LOCKED),
gone AS (
  DELETE FROM jobs j WHERE j.id = ANY (ARRAY(SELECT id FROM stale WHERE fate <> 'requeue'))
  RETURNING j.*, %e AS error, %f AS fate),
dead AS (
  INSERT INTO dead_jobs (id, queue, partition_key, type, payload, priority, attempts,
                         max_attempts, created_at, first_started_at, died_at, node, epoch, reason,
                         last_error, errors, claims, idempotency_key)
  SELECT id, queue, partition_key, type, payload, priority, attempts, max_attempts, created_at,
         first_started_at, now(), claimed_by, claimed_epoch, 'crashed', error,
         errors || jsonb_build_array(jsonb_build_object(
           'attempt', attempts, 'at', now(), 'node', claimed_by, 'epoch', claimed_epoch,
           'error', error)),
         claims, idempotency_key
    FROM gone WHERE fate = 'dead'
  RETURNING id),
cancelled AS (
  INSERT INTO job_history (id, queue, partition_key, type, payload, priority, attempts,
                           created_at, run_at, first_started_at, started_at, finished_at,
                           run_seconds, node, epoch, outcome, idempotency_key, last_error,
                           errors)
  SELECT id, queue, partition_key, type, payload, priority, attempts, created_at, run_at,
         first_started_at, claimed_at, now(), NULL, claimed_by, claimed_epoch, 'cancelled',
         idempotency_key, error, nullif(errors, '[]')
    FROM gone WHERE fate = 'cancelled'
  RETURNING id),
back AS (
  UPDATE jobs j
     SET state = 'available', claimed_by = NULL, claimed_at = NULL,
         errors = j.errors || jsonb_build_array(jsonb_build_object(
           'attempt', j.attempts, 'at', now(), 'node', j.claimed_by, 'epoch', j.claimed_epoch,
           'error', %e))
   WHERE j.id = ANY (ARRAY(SELECT id FROM stale WHERE fate = 'requeue'))
  RETURNING j.id)
SELECT (SELECT count(*) FROM back), (SELECT count(*) FROM dead), (SELECT count(*) FROM cancelled)
)sql";

// A lost run's fate (%f) and the error it leaves (%e), from its job's row `j`.
std::string rescue_sql() {
  std::string sql = kRescueSql;
  const std::pair<const char*, const char*> parts[] = {
      {"%f",
       "CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' "
       "WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'requeue' END"},
      {"%e",
       "'attempt ' || j.attempts || ' of ' || j.max_attempts || ' ended with its node (' || "
       "coalesce(j.claimed_by, '?') || ', epoch ' || j.claimed_epoch || ') before it recorded an "
       "outcome: the node crashed, was killed or lost its database'"}};
  for (const auto& [mark, text] : parts) {
    for (auto at = sql.find(mark); at != std::string::npos; at = sql.find(mark, at))
      sql.replace(at, 2, text);
  }
  return sql;
}

// This group's running jobs whose handler produced no outcome within its timeout plus a grace (a
// hung handler): another attempt if they have one left, else dead. $1 grace ms, $2 group.
// Statements that pick rows with a subquery take its ids as a list (= ANY of an ARRAY), never as
// `id IN (subquery)`: that is a semi-join, and with statistics from a moment when the table was
// nearly empty the planner scanned the whole table as its outer side, running the subquery again
// for each row (14 s for 15,000 running jobs, 5,000 of them with a timeout).
constexpr const char* kTimedOutRetrySql = R"sql(
UPDATE jobs
   SET state = 'available', run_at = now(), claimed_by = NULL, claimed_at = NULL,
       last_error = 'timeout: no outcome within ' || timeout_ms || 'ms',
       errors = errors || jsonb_build_array(jsonb_build_object(
                  'attempt', attempts, 'at', now(), 'node', claimed_by, 'epoch', claimed_epoch,
                  'error', 'timeout: no outcome within ' || timeout_ms || 'ms'))
 WHERE id = ANY (ARRAY(SELECT id FROM jobs
               WHERE state = 'running' AND claim_group = $2 AND timeout_ms IS NOT NULL
                 AND attempts < max_attempts
                 AND claimed_at < now() - (timeout_ms + $1) * interval '1 millisecond'
                 FOR UPDATE SKIP LOCKED))
)sql";

constexpr const char* kTimedOutDeadSql = R"sql(
WITH d AS (
  DELETE FROM jobs
   WHERE id = ANY (ARRAY(SELECT id FROM jobs
                 WHERE state = 'running' AND claim_group = $2 AND timeout_ms IS NOT NULL
                   AND attempts >= max_attempts
                   AND claimed_at < now() - (timeout_ms + $1) * interval '1 millisecond'
                   FOR UPDATE SKIP LOCKED))
  RETURNING *)
INSERT INTO dead_jobs (id, queue, partition_key, type, payload, priority, attempts, max_attempts,
                       created_at, first_started_at, died_at, node, epoch, reason, last_error,
                       errors, claims, idempotency_key)
SELECT id, queue, partition_key, type, payload, priority, attempts, max_attempts, created_at,
       first_started_at, now(), claimed_by, claimed_epoch, 'timeout',
       'timeout: no outcome within ' || timeout_ms || 'ms', errors, claims, idempotency_key
  FROM d
)sql";

constexpr const char* kCancelRequestedSql = R"sql(
SELECT id FROM jobs
 WHERE state = 'running' AND claim_group = $1 AND claimed_epoch = $2
   AND cancel_requested_at IS NOT NULL
)sql";

// Deletes one batch of sagas completed longer than the retention ago (history rows go through
// prune_history, sql/0018); small batches keep locks short.
constexpr const char* kPruneSagasSql = R"sql(
DELETE FROM sagas
 WHERE id = ANY (ARRAY(SELECT id FROM sagas
               WHERE completed_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2))
)sql";

// The leadership timeline (the console's) is kept as long as the history.
constexpr const char* kPruneLeadershipSql = R"sql(
DELETE FROM leadership_events
 WHERE id = ANY (ARRAY(SELECT id FROM leadership_events
               WHERE at < now() - $1::bigint * interval '1 millisecond' LIMIT $2))
)sql";

// Outcomes find their rows by primary key. They test `state <> 'available'` (the only other state
// is 'running') rather than `state = 'running'` so that the planner cannot use the partial index
// jobs_running_idx: its statistics are often from a moment when few jobs ran (right after a large
// enqueue), and a plan that scans every running job once per outcome is quadratic in the batch.
// Every outcome matches the claim that produced it: epoch and token (the job's claim count).
// Nor is there a join with the outcomes: with statistics from a moment when the queue was nearly
// empty, the planner took the table as one row and joined it as the outer side, reading every
// outcome again for each running job (18 s for 5,000 outcomes beside 5,800 running jobs). One
// scan of the primary key by the id list has no such plan; the ids come sorted and distinct, and
// width_bucket finds each one's place in the list (a binary search) to read its epoch, token and
// run time. $1 ids, $2 epochs, $3 run seconds, $4 tokens.
constexpr const char* kCompleteSql = R"sql(
WITH done AS (
  DELETE FROM jobs j
   WHERE j.id = ANY ($1::bigint[]) AND j.state <> 'available'
     AND j.claimed_epoch = ($2::bigint[])[width_bucket(j.id, $1::bigint[])]
     AND j.claims = ($4::bigint[])[width_bucket(j.id, $1::bigint[])]
  RETURNING j.*, ($3::float8[])[width_bucket(j.id, $1::bigint[])] AS run_seconds)
INSERT INTO job_history (id, queue, partition_key, type, payload, priority, attempts, created_at,
                         run_at, first_started_at, started_at, finished_at, run_seconds, node,
                         epoch, outcome, idempotency_key, last_error, errors)
SELECT id, queue, partition_key, type, payload, priority, attempts, created_at, run_at,
       first_started_at, claimed_at, now(), run_seconds, claimed_by, claimed_epoch, 'completed',
       idempotency_key, last_error, nullif(errors, '[]')
  FROM done
RETURNING id
)sql";

// kCompleteSql for a dense batch, whose ids span less than twice their number ($5 the first id,
// $6 the last): one scan of the primary key over that range, each id checked against the list
// (width_bucket again, as a filter), instead of one descent of the index per id. A drain
// completes nearly every batch this way (its ids were claimed in id order), and the range read
// 8 buffers a job where the list read 12. The range scan reads every entry in the span, so a
// sparse batch (jobs claimed far apart, retried, delayed) keeps the list.
const std::string& complete_dense_sql() {
  static const std::string sql = [] {
    std::string s = kCompleteSql;
    const std::string list = "WHERE j.id = ANY ($1::bigint[])";
    s.replace(s.find(list), list.size(),
              "WHERE j.id BETWEEN $5 AND $6\n"
              "     AND ($1::bigint[])[width_bucket(j.id, $1::bigint[])] = j.id");
    return s;
  }();
  return sql;
}

// A reference to the current transaction, for transaction_status: its id, and the start of the
// server that gave it (after a failover or a restart, the same number can name another
// transaction, or none). Reading it assigns the transaction an id, as its first write would.
#define BATON_TRANSACTION_REF                        \
  "pg_catalog.pg_current_xact_id()::text || '@' || " \
  "extract(epoch FROM pg_catalog.pg_postmaster_start_time())::text"

// The completion of kCompleteSql in a handler's transaction, also returning that reference.
const std::string& complete_in_sql() {
  static const std::string sql =
      std::string(kCompleteSql, std::string_view(kCompleteSql).rfind("RETURNING id")) +
      "RETURNING id, " BATON_TRANSACTION_REF "\n";
  return sql;
}

constexpr const char* kBeginSql = "BEGIN; SELECT " BATON_TRANSACTION_REF;

#undef BATON_TRANSACTION_REF

// What became of a referenced transaction: 'committed', 'aborted', 'in progress' (its session
// has not ended it: it may yet commit), or 'unknown': another server (a standby promoted since,
// or a restart), or too old for the server to tell. An id this server has not handed out yet
// would make pg_xact_status fail; every id it handed out is below its next one.
constexpr const char* kTransactionStatusSql = R"sql(
SELECT CASE
  WHEN pg_catalog.split_part($1, '@', 2)
       IS DISTINCT FROM extract(epoch FROM pg_catalog.pg_postmaster_start_time())::text
    OR pg_catalog.split_part($1, '@', 1)::pg_catalog.xid8 >= pg_catalog.pg_current_xact_id()
  THEN 'unknown'
  ELSE coalesce(pg_catalog.pg_xact_status(pg_catalog.split_part($1, '@', 1)::pg_catalog.xid8),
                'unknown')
END
)sql";

// A job claimed but never started goes back as it was before the claim; one whose cancellation
// was asked meanwhile goes to history as cancelled instead. Found as completions are (see
// kCompleteSql): $1 ids, sorted and distinct, $2 epochs, $3 tokens.
constexpr const char* kReleaseSql = R"sql(
WITH back AS (
  UPDATE jobs j
     SET state = 'available', attempts = j.attempts - 1, claimed_by = NULL, claimed_at = NULL,
         first_started_at = CASE WHEN j.attempts = 1 THEN NULL ELSE j.first_started_at END
   WHERE j.id = ANY ($1::bigint[]) AND j.state <> 'available'
     AND j.claimed_epoch = ($2::bigint[])[width_bucket(j.id, $1::bigint[])]
     AND j.claims = ($3::bigint[])[width_bucket(j.id, $1::bigint[])]
     AND j.cancel_requested_at IS NULL
  RETURNING j.id),
gone AS (
  DELETE FROM jobs j
   WHERE j.id = ANY ($1::bigint[]) AND j.state <> 'available'
     AND j.claimed_epoch = ($2::bigint[])[width_bucket(j.id, $1::bigint[])]
     AND j.claims = ($3::bigint[])[width_bucket(j.id, $1::bigint[])]
     AND j.cancel_requested_at IS NOT NULL
  RETURNING j.*),
cancelled AS (
  INSERT INTO job_history (id, queue, partition_key, type, payload, priority, attempts,
                           created_at, run_at, first_started_at, started_at, finished_at,
                           run_seconds, node, epoch, outcome, idempotency_key, last_error,
                           errors)
  SELECT id, queue, partition_key, type, payload, priority, attempts - 1, created_at, run_at,
         first_started_at, NULL, now(), NULL, claimed_by, claimed_epoch, 'cancelled',
         idempotency_key, last_error, nullif(errors, '[]')
    FROM gone
  RETURNING id)
SELECT (SELECT count(*) FROM back) + (SELECT count(*) FROM cancelled)
)sql";

// A failed run of a job whose cancellation was asked: it ends here, in history as cancelled.
// $1 id, $2 epoch, $3 token, $4 error.
constexpr const char* kCancelledSql = R"sql(
WITH c AS (
  DELETE FROM jobs
   WHERE id = $1 AND state <> 'available' AND claimed_epoch = $2 AND claims = $3
     AND cancel_requested_at IS NOT NULL
  RETURNING *)
INSERT INTO job_history (id, queue, partition_key, type, payload, priority, attempts, created_at,
                         run_at, first_started_at, started_at, finished_at, run_seconds, node,
                         epoch, outcome, idempotency_key, last_error, errors)
SELECT id, queue, partition_key, type, payload, priority, attempts, created_at, run_at,
       first_started_at, claimed_at, now(), extract(epoch FROM now() - claimed_at)::float8,
       claimed_by, claimed_epoch, 'cancelled', idempotency_key, $4, nullif(errors, '[]')
  FROM c
)sql";

// $1 id, $2 epoch, $3 delay ms, $4 error, $5 token.
constexpr const char* kRetrySql = R"sql(
UPDATE jobs
   SET state = 'available', run_at = now() + $3::bigint * interval '1 millisecond',
       last_error = $4,
       errors = errors || jsonb_build_array(jsonb_build_object(
                  'attempt', attempts, 'at', now(), 'node', claimed_by, 'epoch', claimed_epoch,
                  'error', $4::text)),
       claimed_by = NULL, claimed_at = NULL
 WHERE id = $1 AND state <> 'available' AND claimed_epoch = $2 AND claims = $5
)sql";

// $1 id, $2 epoch, $3 reason, $4 error, $5 token.
constexpr const char* kDeadSql = R"sql(
WITH d AS (
  DELETE FROM jobs
   WHERE id = $1 AND state <> 'available' AND claimed_epoch = $2 AND claims = $5
  RETURNING *)
INSERT INTO dead_jobs (id, queue, partition_key, type, payload, priority, attempts, max_attempts,
                       created_at, first_started_at, died_at, node, epoch, reason, last_error,
                       errors, claims, idempotency_key)
SELECT id, queue, partition_key, type, payload, priority, attempts, max_attempts, created_at,
       first_started_at, now(), claimed_by, claimed_epoch, $3, $4,
       errors || jsonb_build_array(jsonb_build_object(
         'attempt', attempts, 'at', now(), 'node', claimed_by, 'epoch', claimed_epoch,
         'error', $4::text)),
       claims, idempotency_key
  FROM d
)sql";

// The claim's columns (and the unanswered claim's) as jobs.
std::vector<ClaimedJob> claimed_jobs(const pqxx::result& rows, const Claimer& claimer,
                                     const std::string& schema) {
  const auto claimed = std::chrono::steady_clock::now();
  std::vector<ClaimedJob> out;
  out.reserve(rows.size());
  for (const auto& r : rows) {
    ClaimedJob c;
    c.job.id = r[0].as<std::int64_t>();
    c.job.queue = r[1].c_str();
    c.job.type = r[2].c_str();
    c.job.payload = r[3].c_str();
    c.job.attempt = r[4].as<int>();
    c.job.max_attempts = r[5].as<int>();
    c.job.epoch = claimer.epoch;
    c.timeout_ms = r[6].as<int>();
    const auto created_us = r[7].as<std::int64_t>();
    c.job.enqueued_at = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::microseconds(created_us)));
    c.claimed = claimed;
    c.token = r[8].as<std::int64_t>();
    // The same for every attempt on every node and epoch: the producer's key, or the job's id
    // in this deployment.
    c.job.idempotency_key = r[9].is_null() ? "baton:" + schema + ":" + std::to_string(c.job.id)
                                           : std::string(r[9].c_str());
    c.claimed_at_us = r[10].as<std::int64_t>();
    c.key = {r[11].as<int>(), r[12].as<std::int64_t>(), c.job.id};
    c.partitioned = r[13].as<bool>();
    c.wait_seconds = static_cast<double>(c.claimed_at_us - c.key.run_at_us) / 1e6;
    c.since_enqueue_seconds = static_cast<double>(c.claimed_at_us - created_us) / 1e6;
    out.push_back(std::move(c));
  }
  // The claim's rows come back in address order; they start in claim order.
  std::sort(out.begin(), out.end(),
            [](const ClaimedJob& a, const ClaimedJob& b) { return a.key < b.key; });
  return out;
}

}  // namespace

std::string claim_statement(bool skip_locked, bool after) {
  std::string sql = std::string(kClaimSql) + kClaimedColumns;
  sql.replace(sql.find("%a"), 2,
              after ? "AND (priority, run_at, id) > ($11::int, pg_catalog.to_timestamp(0) + "
                      "$12::bigint * interval '1 microsecond', $13::bigint)"
                    : "");
  sql.replace(sql.find("%s"), 2, skip_locked ? "FOR UPDATE SKIP LOCKED" : "");
  return sql;
}

std::vector<ClaimedJob> claim_jobs(pqxx::connection& conn, const Claimer& claimer, int limit,
                                   const ClaimFilter& filter, const std::string& schema) {
  // Prepared: the claim is planned once per connection, not once per batch.
  static constexpr const char* kNames[2][2] = {{"baton_claim", "baton_claim_after"},
                                               {"baton_claim_skip", "baton_claim_skip_after"}};
  const bool after = filter.after.has_value();
  const char* name = kNames[filter.skip_locked ? 1 : 0][after ? 1 : 0];
  conn.prepare(name, claim_statement(filter.skip_locked, after));
  auto claim = [&](pqxx::transaction_base& tx) {
    return after ? tx.exec_prepared(name, claimer.node_id, claimer.epoch, claimer.lock.lock_key,
                                    claimer.lock.region, text_array(filter.queues), limit,
                                    text_array(filter.except), claimer.lock.group(),
                                    text_array(filter.types), filter.shard, filter.after->priority,
                                    filter.after->run_at_us, filter.after->id)
                 : tx.exec_prepared(name, claimer.node_id, claimer.epoch, claimer.lock.lock_key,
                                    claimer.lock.region, text_array(filter.queues), limit,
                                    text_array(filter.except), claimer.lock.group(),
                                    text_array(filter.types), filter.shard);
  };
  if (filter.cluster_limit == 0) {
    // One statement, committed on its own: one round trip instead of three (BEGIN, the claim,
    // COMMIT), each a wake-up of the server and of the poller.
    pqxx::nontransaction tx(conn);
    return claimed_jobs(claim(tx), claimer, schema);
  }
  pqxx::work tx(conn);
  // Shard leaders claim a limited queue one at a time, each seeing the others' running jobs.
  tx.exec_params(kQueueGateSql, filter.queues.at(0));
  const auto running =
      tx.exec_params(kQueueRunningSql, filter.queues.at(0))[0][0].as<std::int64_t>();
  limit = static_cast<int>(
      std::min<std::int64_t>(limit, std::max<std::int64_t>(0, filter.cluster_limit - running)));
  if (limit == 0) {
    tx.commit();
    return {};
  }
  auto rows = claim(tx);
  tx.commit();
  return claimed_jobs(rows, claimer, schema);
}

std::vector<ClaimedJob> unanswered_claim(pqxx::connection& conn, const Claimer& claimer,
                                         std::int64_t after_us, std::int64_t before_us,
                                         const std::string& schema) {
  pqxx::work tx(conn);
  auto rows =
      tx.exec_params(std::string(kUnansweredClaimSql) + kClaimedColumns, claimer.lock.group(),
                     claimer.epoch, claimer.node_id, after_us, before_us);
  tx.commit();
  return claimed_jobs(rows, claimer, schema);
}

ServerSession server_session(pqxx::connection& conn) {
  pqxx::nontransaction tx(conn);
  const auto r = tx.exec(kSessionSql);
  if (r.empty()) return {};
  return {r[0][0].as<int>(), r[0][1].as<std::int64_t>(), r[0][2].as<std::int64_t>()};
}

bool cut_session_busy(pqxx::connection& conn, const ServerSession& cut) {
  if (cut.pid == 0) return false;
  pqxx::nontransaction tx(conn);
  return tx.exec_params(kCutSessionBusySql, cut.pid, cut.started_us)[0][0].as<std::int64_t>() > 0;
}

Rescued rescue_lost(pqxx::connection& conn, const Claimer& claimer,
                    const std::vector<std::int64_t>& still_running,
                    std::chrono::milliseconds leaderless_grace) {
  static const std::string kRescue = rescue_sql();
  pqxx::work tx(conn);
  const auto r =
      tx.exec_params(kRescue, claimer.lock.group(), claimer.epoch, int_array(still_running),
                     static_cast<std::int64_t>(leaderless_grace.count()))[0];
  tx.commit();
  return {static_cast<std::size_t>(r[0].as<std::int64_t>()),
          static_cast<std::size_t>(r[1].as<std::int64_t>()),
          static_cast<std::size_t>(r[2].as<std::int64_t>())};
}

std::vector<std::int64_t> cancel_requested(pqxx::connection& conn, const Claimer& claimer) {
  pqxx::read_transaction tx(conn);
  std::vector<std::int64_t> ids;
  for (const auto& r : tx.exec_params(kCancelRequestedSql, claimer.lock.group(), claimer.epoch))
    ids.push_back(r[0].as<std::int64_t>());
  return ids;
}

std::size_t rescue_timed_out(pqxx::connection& conn, const Claimer& claimer,
                             std::int64_t grace_ms) {
  pqxx::work tx(conn);
  std::size_t n = tx.exec_params(kTimedOutRetrySql, grace_ms, claimer.lock.group()).affected_rows();
  n += tx.exec_params(kTimedOutDeadSql, grace_ms, claimer.lock.group()).affected_rows();
  tx.commit();
  return n;
}

long long wake_limited_queues(pqxx::transaction_base& tx, std::string_view schema,
                              const std::vector<std::string>& queues) {
  // $1 channel, $2 queues. A shard whose leader is busy (or that no one leads) takes no wake.
  static constexpr const char* kWakeSql = R"sql(
SELECT count(pg_catalog.pg_notify($1, q)) FROM pg_catalog.unnest($2::text[]) q
 WHERE EXISTS (SELECT FROM pg_catalog.generate_series(0, @.shard_count() - 1) s
                WHERE NOT @.leader_busy($1, q, s))
)sql";
  return tx
      .exec_params(with_schema(kWakeSql, schema), jobs_channel(schema), text_array(queues))[0][0]
      .as<long long>(0);
}

std::optional<std::int64_t> summarize_history(pqxx::connection& conn, std::int64_t from,
                                              int ranges) {
  pqxx::work tx(conn);
  const auto next = tx.exec_params("SELECT summarize_history($1, $2)", from, ranges)[0][0];
  std::optional<std::int64_t> out;
  if (!next.is_null()) out = next.as<std::int64_t>();
  tx.commit();
  return out;
}

Pruned prune_history(pqxx::connection& conn, std::int64_t retention_ms, int batch) {
  pqxx::work tx(conn);
  const auto history =
      tx.exec_params("SELECT prune_history($1, $2)", retention_ms, batch)[0][0].as<std::int64_t>();
  const auto sagas = tx.exec_params(kPruneSagasSql, retention_ms, batch).affected_rows();
  const auto events = tx.exec_params(kPruneLeadershipSql, retention_ms, batch).affected_rows();
  tx.commit();
  const auto full = static_cast<std::size_t>(batch);
  Pruned p;
  p.rows = static_cast<std::size_t>(history) + sagas + events;
  p.more = history >= batch || sagas >= full || events >= full;
  return p;
}

bool complete_in(pqxx::work& tx, const Completion& done, std::string* xid) {
  const auto r = tx.exec_params(xid != nullptr ? complete_in_sql().c_str() : kCompleteSql,
                                int_array({done.id}), int_array({done.epoch}),
                                double_array({done.run_seconds}), int_array({done.token}));
  if (r.size() != 1) return false;
  if (xid != nullptr) *xid = r[0][1].c_str();
  return true;
}

std::string transaction_status(pqxx::connection& conn, const std::string& xid) {
  pqxx::nontransaction tx(conn);
  return tx.exec_params(kTransactionStatusSql, xid)[0][0].c_str();
}

namespace {

// The outcomes in id order, one per job, as the statements look an id's values up by its place in
// the list. Of two outcomes for one job, the later claim's is kept (the higher token: a job's
// claims only ever count up, while epochs are per lock group and a job can change groups): the
// other belongs to a claim the job has left, and goes to `stale`.
template <typename Outcome>
std::vector<const Outcome*> by_id(const std::vector<Outcome>& all,
                                  std::vector<const Outcome*>& stale) {
  std::vector<const Outcome*> sorted;
  sorted.reserve(all.size());
  for (const auto& o : all)
    sorted.push_back(&o);
  std::sort(sorted.begin(), sorted.end(), [](const Outcome* a, const Outcome* b) {
    return std::tie(a->id, a->token, a->epoch) < std::tie(b->id, b->token, b->epoch);
  });
  std::vector<const Outcome*> kept;
  kept.reserve(sorted.size());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (i + 1 < sorted.size() && sorted[i + 1]->id == sorted[i]->id) {
      stale.push_back(sorted[i]);
    } else {
      kept.push_back(sorted[i]);
    }
  }
  return kept;
}

}  // namespace

std::size_t apply_outcomes(pqxx::connection& conn, const std::vector<Completion>& done,
                           const std::vector<Failure>& failed, std::vector<std::int64_t>* fenced,
                           const std::vector<Release>& released, std::size_t* released_applied,
                           std::string* in_doubt) {
  conn.prepare("baton_complete", kCompleteSql);
  conn.prepare("baton_complete_dense", complete_dense_sql());
  auto apply = [&](pqxx::transaction_base& tx) {
    std::size_t applied = 0;
    if (!done.empty()) {
      std::vector<const Completion*> stale;
      const auto kept = by_id(done, stale);
      std::vector<std::int64_t> ids, epochs, tokens;
      std::vector<double> run;
      for (const auto* d : kept) {
        ids.push_back(d->id);
        epochs.push_back(d->epoch);
        tokens.push_back(d->token);
        run.push_back(d->run_seconds);
      }
      // (The span in unsigned arithmetic: exact for any two ids, the last no less than the first.)
      const bool dense = !ids.empty() && static_cast<std::uint64_t>(ids.back()) -
                                                 static_cast<std::uint64_t>(ids.front()) <
                                             2 * static_cast<std::uint64_t>(ids.size());
      const auto rows =
          dense ? tx.exec_prepared("baton_complete_dense", int_array(ids), int_array(epochs),
                                   double_array(run), int_array(tokens), ids.front(), ids.back())
                : tx.exec_prepared("baton_complete", int_array(ids), int_array(epochs),
                                   double_array(run), int_array(tokens));
      std::unordered_set<std::int64_t> completed;
      for (const auto& r : rows)
        completed.insert(r[0].as<std::int64_t>());
      applied += completed.size();
      if (fenced != nullptr) {
        for (const auto* d : kept) {
          if (completed.count(d->id) == 0) fenced->push_back(d->id);
        }
        for (const auto* d : stale)
          fenced->push_back(d->id);
      }
    }
    for (const auto& f : failed) {
      const std::string error = clean_text(f.error, 4000);
      auto n = tx.exec_params(kCancelledSql, f.id, f.epoch, f.token, error).affected_rows();
      if (n == 0) {
        n = f.dead
                ? tx.exec_params(kDeadSql, f.id, f.epoch, f.reason, error, f.token).affected_rows()
                : tx.exec_params(kRetrySql, f.id, f.epoch, f.retry_delay_ms, error, f.token)
                      .affected_rows();
      }
      applied += n;
      if (n == 0 && fenced != nullptr) fenced->push_back(f.id);
    }
    if (!released.empty()) {
      std::vector<const Release*> stale;  // ignored, as releases that no longer match are
      std::vector<std::int64_t> ids, epochs, tokens;
      for (const auto* r : by_id(released, stale)) {
        ids.push_back(r->id);
        epochs.push_back(r->epoch);
        tokens.push_back(r->token);
      }
      const auto n =
          tx.exec_params(kReleaseSql, int_array(ids), int_array(epochs), int_array(tokens))[0][0]
              .as<std::int64_t>();
      if (released_applied != nullptr) *released_applied = static_cast<std::size_t>(n);
    }
    return applied;
  };
  // In a transaction even when the completions alone are one statement: a batch cut while its
  // statement runs is then rolled back, not committed unanswered, so that the batch sent again
  // does not find its own jobs gone and report them fenced. Only a COMMIT whose answer is lost
  // leaves that in doubt; its transaction's id, read in the same round trip as BEGIN, tells the
  // caller later (transaction_status). Hence BEGIN and COMMIT by hand: pqxx::work cannot send
  // a statement with its BEGIN.
  pqxx::nontransaction tx(conn);
  std::string xid;
  std::size_t applied = 0;
  try {
    xid = tx.exec(kBeginSql)[0][0].c_str();
    applied = apply(tx);
  } catch (const std::exception& e) {
    // A refused or cancelled statement leaves the transaction aborted (BEGIN ran even if the
    // SELECT with it did not): end it, or every later statement on this connection fails. A
    // lost connection ends it on the server by itself.
    if (conn.is_open()) {
      try {
        tx.exec("ROLLBACK");
      } catch (const std::exception& rollback) {
        // The connection cannot be trusted to be outside a transaction: its owner must drop it.
        throw pqxx::broken_connection("a write failed (" + one_line(e.what()) +
                                      ") and so did its ROLLBACK (" + one_line(rollback.what()) +
                                      ")");
      }
    }
    throw;
  }
  try {
    tx.exec("COMMIT");
  } catch (const std::exception& e) {
    // A refused COMMIT (a deferred check) rolled back; a lost connection may have committed.
    if (in_doubt != nullptr && (is_connection_error(e) || !conn.is_open())) *in_doubt = xid;
    throw;
  }
  return applied;
}

std::size_t move_stray_jobs(pqxx::connection& conn, int shards) {
  pqxx::nontransaction tx(conn);
  return tx.exec_params(kStraysSql, shards).affected_rows();
}

}  // namespace baton::detail
