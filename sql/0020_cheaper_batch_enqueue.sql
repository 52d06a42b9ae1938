-- A cheaper batch enqueue (issue 16: batch enqueue against COPY). enqueue_columns, the C++
-- Client's batches, gives the same answers and the same rows as 0012's in fewer steps a job:
--
-- * One pass over the columns tells a good batch from a bad one; the query that finds the first
--   problem (nine columns side by side, a CASE a job, a sort) runs only for a bad one.
-- * The columns are set side by side in a select list rather than by ROWS FROM, whose
--   functions each fill a tuple store first.
-- * A partition is looked up for a job with a partition key only (was: a join for every job).
--
-- Counted with valgrind on one backend (docs/performance.md), instructions a job of a batch of
-- 1,000: 79,300 before and 66,500 after without keys, 101,900 and 92,600 with a partition key
-- on every job; an INSERT of the same rows' three columns, 40,800.

DO $migration$
DECLARE
  functions text := $functions$

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue_columns(
    queues text[], types text[], payloads jsonb, priorities int[], delays_ms bigint[],
    max_attempts int[], run_at timestamptz[], partition_keys text[], idempotency_keys text[],
    timeouts_ms int[])
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  jobs_count int := cardinality(types);
  limit_bytes bigint := (SELECT s.value::bigint FROM _BATON_SCHEMA_.settings s
                          WHERE s.key = 'max_payload_bytes');
  bad_names boolean;
  shard_count int := _BATON_SCHEMA_.shard_count();
  problem text;
BEGIN
  IF jsonb_typeof(payloads) IS DISTINCT FROM 'array' OR jobs_count IS NULL
     OR jsonb_array_length(payloads) <> jobs_count
     OR EXISTS (SELECT 1 FROM unnest(ARRAY[cardinality(queues), cardinality(priorities),
                                           cardinality(delays_ms), cardinality(max_attempts),
                                           cardinality(run_at), cardinality(partition_keys),
                                           cardinality(idempotency_keys),
                                           cardinality(timeouts_ms)]) AS l(len)
                 WHERE l.len IS DISTINCT FROM jobs_count) THEN
    RAISE EXCEPTION USING ERRCODE = 'BT003',
      MESSAGE = 'enqueue_columns takes one element per job in every column',
      HINT = 'payloads is a JSON array; the other columns are arrays of the same length';
  END IF;
  -- Names are checked once per distinct name (bytewise); only when one is bad are they checked
  -- job by job, so that the first job with a problem is the one reported, as enqueue_many does.
  bad_names := EXISTS (
    SELECT 1 FROM (SELECT DISTINCT u.q COLLATE "C" AS q, u.t COLLATE "C" AS t
                     FROM unnest(queues, types) AS u(q, t) OFFSET 0) d
     WHERE NOT _BATON_SCHEMA_.name_ok(d.q) OR NOT _BATON_SCHEMA_.name_ok(d.t));
  -- Nearly every batch is good, and one pass over the columns says so. Only when it finds
  -- something does the query below look job by job for the first problem.
  IF bad_names
     OR EXISTS (SELECT 1
                  FROM (SELECT jsonb_array_elements(payloads) AS payload,
                               unnest(priorities) AS priority, unnest(max_attempts) AS attempts,
                               unnest(delays_ms) AS delay_ms, unnest(timeouts_ms) AS timeout_ms,
                               unnest(partition_keys) AS partition_key,
                               unnest(idempotency_keys) AS idempotency_key) c
                 WHERE _BATON_SCHEMA_.typed_problem(c.payload, c.priority, c.attempts,
                                                    c.delay_ms, c.timeout_ms, c.partition_key,
                                                    c.idempotency_key, limit_bytes)
                       IS NOT NULL) THEN
    SELECT q.p INTO problem
      FROM ROWS FROM (unnest(queues), unnest(types), jsonb_array_elements(payloads),
                      unnest(priorities), unnest(max_attempts), unnest(delays_ms),
                      unnest(timeouts_ms), unnest(partition_keys), unnest(idempotency_keys))
             WITH ORDINALITY
             AS c(queue, type, payload, priority, max_attempts, delay_ms, timeout_ms,
                  partition_key, idempotency_key, ord),
           LATERAL (SELECT CASE
                      WHEN bad_names AND NOT _BATON_SCHEMA_.name_ok(c.queue) THEN
                        pg_catalog.format('BT001|queue name %s is not allowed|',
                                          coalesce(pg_catalog.quote_literal(c.queue), 'NULL')) ||
                          'use 1..64 of A-Z a-z 0-9 _ . : -, starting with a letter or digit'
                      WHEN bad_names AND NOT _BATON_SCHEMA_.name_ok(c.type) THEN
                        pg_catalog.format('BT001|type name %s is not allowed|',
                                          coalesce(pg_catalog.quote_literal(c.type), 'NULL')) ||
                          'use 1..64 of A-Z a-z 0-9 _ . : -, starting with a letter or digit'
                      ELSE _BATON_SCHEMA_.typed_problem(c.payload, c.priority, c.max_attempts,
                                                        c.delay_ms, c.timeout_ms, c.partition_key,
                                                        c.idempotency_key, limit_bytes)
                    END AS p) q
     WHERE q.p IS NOT NULL
     ORDER BY c.ord LIMIT 1;
  END IF;
  IF problem IS NOT NULL THEN
    PERFORM _BATON_SCHEMA_.raise_problem(problem);
  END IF;
  RETURN QUERY
  WITH input AS (
    SELECT u.queue COLLATE "C" AS queue, u.type COLLATE "C" AS type, u.payload,
           coalesce(u.priority, 0) AS priority,
           coalesce(u.run_at, now() + coalesce(u.delay_ms, 0) * interval '1 millisecond')
             AS run_at,
           coalesce(u.max_attempts, 10) AS max_attempts,
           u.partition_key COLLATE "C" AS partition_key,
           u.idempotency_key COLLATE "C" AS idempotency_key,
           nullif(u.timeout_ms, 0) AS timeout_ms, u.ord
      FROM (SELECT unnest(queues) AS queue, unnest(types) AS type,
                   jsonb_array_elements(payloads) AS payload, unnest(priorities) AS priority,
                   unnest(delays_ms) AS delay_ms, unnest(max_attempts) AS max_attempts,
                   unnest(run_at) AS run_at, unnest(partition_keys) AS partition_key,
                   unnest(idempotency_keys) AS idempotency_key,
                   unnest(timeouts_ms) AS timeout_ms,
                   generate_series(1, jobs_count) AS ord) u),
  ins AS (
    INSERT INTO _BATON_SCHEMA_.jobs (queue, type, payload, priority, run_at, max_attempts,
                                     partition_key, partition, idempotency_key, timeout_ms,
                                     shard)
    SELECT i.queue, i.type, i.payload, i.priority, i.run_at, i.max_attempts, i.partition_key,
           CASE WHEN i.partition_key IS NOT NULL THEN
             (SELECT _BATON_SCHEMA_.partition_of(i.partition_key, s.partitions)
                FROM _BATON_SCHEMA_.queue_state s WHERE s.queue = i.queue)
           END,
           i.idempotency_key, i.timeout_ms, _BATON_SCHEMA_.shard_of(i.partition_key, shard_count)
      FROM input i
     ORDER BY i.ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, shard),
  wake AS (
    SELECT count(pg_notify(c.channel, d.q)) AS n
      FROM (SELECT DISTINCT queue AS q, shard AS k FROM ins) d,
           (SELECT current_schema() || '_jobs' AS channel) c
     WHERE NOT _BATON_SCHEMA_.leader_busy(c.channel, d.q, d.k))
  SELECT id FROM ins WHERE (SELECT n FROM wake) >= 0 ORDER BY id;
END
$f$;

$functions$;
BEGIN
  EXECUTE replace(functions, '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;
