-- Shards: partitioned leadership (docs/concepts.md, "Shards").
--
-- * settings.shards is the deployment's shard count (1: one leader, as before). A job belongs to
--   one shard, fixed at enqueue by shard_of(): the hash of its partition key when it has one (so
--   an ordered partition stays on one shard), else a shard at random. Rows inserted without the
--   API (a plain INSERT) take the column's default, shard 0.
-- * Each shard is a lock row of its own ("<lock_key>" for shard 0, "<lock_key>:<k>" for the
--   others); its leader claims only its shard's jobs (jobs_claim_idx leads with the shard).
-- * Epochs come from one sequence, so that they stay unique across the shards' lock rows (a node
--   that leads two shards tells their runs apart by epoch) and still grow with every grant of a
--   row.
-- * The wake keys of shard k > 0 end in "#k" (shard 0 keeps 0010's keys).
-- * set_shards(n) changes the count; it refuses while a node of another count is live.

INSERT INTO settings VALUES ('shards', '1') ON CONFLICT DO NOTHING;

CREATE SEQUENCE epochs AS bigint;
SELECT setval('epochs', greatest((SELECT max(epoch) FROM locks), 1),
              (SELECT max(epoch) FROM locks) IS NOT NULL);

ALTER TABLE jobs ADD COLUMN shard integer NOT NULL DEFAULT 0;
DROP INDEX jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON jobs (shard, priority, run_at, id) WHERE state = 'available';

-- With shards, the leaders of a queue with a concurrency limit claim it one at a time: each
-- claim locks the queue's row here for its transaction. A row lock, not an advisory lock: only
-- roles that may update this table (nodes) can take it, so a stranger cannot stall the claims.
CREATE TABLE queue_gates (queue text COLLATE "C" PRIMARY KEY);

-- What a node says of its shards: the deployment's count as it knows it, and those it leads.
ALTER TABLE nodes ADD COLUMN shards integer;
ALTER TABLE nodes ADD COLUMN shards_led integer[];

DO $migration$
DECLARE
  functions text := $functions$

-- The deployment's shard count.
CREATE FUNCTION _BATON_SCHEMA_.shard_count() RETURNS integer
LANGUAGE sql STABLE AS $f$
  SELECT coalesce((SELECT s.value::integer FROM _BATON_SCHEMA_.settings s WHERE s.key = 'shards'), 1)
$f$;

-- The shard of a new job among `shards`: its partition key's, else one at random. (Plain SQL,
-- inlined.)
CREATE FUNCTION _BATON_SCHEMA_.shard_of(partition_key text, shards integer) RETURNS integer
LANGUAGE sql VOLATILE AS $f$
  SELECT CASE
    WHEN shards IS NULL OR shards <= 1 THEN 0
    WHEN partition_key IS NULL THEN pg_catalog.floor(pg_catalog.random() * shards)::integer
    ELSE (((pg_catalog.hashtextextended(partition_key COLLATE "C", 0) % shards) + shards)
          % shards)::integer
  END
$f$;

-- leader_busy (0010) for the wake keys of one shard.
CREATE FUNCTION _BATON_SCHEMA_.leader_busy(channel text, queue text, shard integer)
RETURNS boolean
LANGUAGE sql VOLATILE AS $f$
  SELECT pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtextextended(
           (channel || '/' || queue || CASE WHEN shard > 0 THEN '#' || shard ELSE '' END)
             COLLATE "C", 0))
     AND pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtextextended(
           (channel || '/*' || CASE WHEN shard > 0 THEN '#' || shard ELSE '' END)
             COLLATE "C", 0))
$f$;

-- Sets the shard count. Jobs waiting on a shard that no longer exists, and waiting jobs with a
-- partition key, move to their shard under the new count (running ones move when they come back
-- to the queue: shard 0's leader moves strays). Refused while a node of another count is live
-- (its nodes row seen within 5 s and not stopped), other than `node_id` (the node asking).
-- Returns how many jobs moved.
CREATE FUNCTION _BATON_SCHEMA_.set_shards(n integer, node_id text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  others text;
  moved bigint;
BEGIN
  IF n IS NULL OR n NOT BETWEEN 1 AND 64 THEN
    RAISE EXCEPTION USING ERRCODE = 'BT003', MESSAGE = pg_catalog.format('%s shards is out of range', n),
      HINT = 'use a whole number in 1..64';
  END IF;
  PERFORM 1 FROM _BATON_SCHEMA_.settings s WHERE s.key = 'shards' FOR UPDATE;
  SELECT pg_catalog.string_agg(pg_catalog.format('%s (%s)', d.node_id, coalesce(d.shards, 1)), ', '
                               ORDER BY d.node_id)
    INTO others
    FROM _BATON_SCHEMA_.nodes d
   WHERE d.role <> 'stopped' AND d.last_seen > now() - interval '5 seconds'
     AND coalesce(d.shards, 1) <> n AND d.node_id IS DISTINCT FROM set_shards.node_id;
  IF others IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'BT004',
      MESSAGE = pg_catalog.format('nodes with another shard count are running: %s', others),
      HINT = 'stop every node first (the count changes with all nodes stopped), then start them '
             'all with the new --shards';
  END IF;
  INSERT INTO _BATON_SCHEMA_.settings AS s VALUES ('shards', n::text)
  ON CONFLICT (key) DO UPDATE SET value = excluded.value;
  UPDATE _BATON_SCHEMA_.jobs j SET shard = _BATON_SCHEMA_.shard_of(j.partition_key, n)
   WHERE j.state = 'available'
     AND (j.shard >= n
          OR (j.partition_key IS NOT NULL AND j.shard <> _BATON_SCHEMA_.shard_of(j.partition_key, n)));
  GET DIAGNOSTICS moved = ROW_COUNT;
  RETURN moved;
END
$f$;
REVOKE ALL ON FUNCTION _BATON_SCHEMA_.set_shards(integer, text) FROM PUBLIC;

-- 0010's enqueue functions, each writing the job's shard and waking that shard's leader.
CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue_many(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  shard_count int := _BATON_SCHEMA_.shard_count();
BEGIN
  PERFORM _BATON_SCHEMA_.validate_jobs(jobs);
  RETURN QUERY
  WITH input AS (
    SELECT coalesce(e->>'queue', 'default') AS queue, e->>'type' AS type,
           coalesce(e->'payload', '{}'::jsonb) AS payload,
           coalesce((e->>'priority')::int, 0) AS priority,
           coalesce((e->>'run_at')::timestamptz,
                    now() + coalesce((e->>'delay_ms')::bigint, 0) * interval '1 millisecond')
             AS run_at,
           coalesce((e->>'max_attempts')::int, 10) AS max_attempts,
           e->>'partition_key' AS partition_key, e->>'idempotency_key' AS idempotency_key,
           nullif((e->>'timeout_ms')::int, 0) AS timeout_ms, ord
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS a(e, ord)),
  ins AS (
    INSERT INTO _BATON_SCHEMA_.jobs (queue, type, payload, priority, run_at, max_attempts,
                                     partition_key, partition, idempotency_key, timeout_ms,
                                     shard)
    SELECT i.queue, i.type, i.payload, i.priority, i.run_at, i.max_attempts, i.partition_key,
           _BATON_SCHEMA_.partition_of(i.partition_key, s.partitions), i.idempotency_key,
           i.timeout_ms, _BATON_SCHEMA_.shard_of(i.partition_key, shard_count)
      FROM input i LEFT JOIN _BATON_SCHEMA_.queue_state s ON s.queue = i.queue
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
      FROM ROWS FROM (unnest(queues), unnest(types), jsonb_array_elements(payloads),
                      unnest(priorities), unnest(delays_ms), unnest(max_attempts), unnest(run_at),
                      unnest(partition_keys), unnest(idempotency_keys), unnest(timeouts_ms))
             WITH ORDINALITY
             AS u(queue, type, payload, priority, delay_ms, max_attempts, run_at, partition_key,
                  idempotency_key, timeout_ms, ord)),
  ins AS (
    INSERT INTO _BATON_SCHEMA_.jobs (queue, type, payload, priority, run_at, max_attempts,
                                     partition_key, partition, idempotency_key, timeout_ms,
                                     shard)
    SELECT i.queue, i.type, i.payload, i.priority, i.run_at, i.max_attempts, i.partition_key,
           _BATON_SCHEMA_.partition_of(i.partition_key, s.partitions), i.idempotency_key,
           i.timeout_ms, _BATON_SCHEMA_.shard_of(i.partition_key, shard_count)
      FROM input i LEFT JOIN _BATON_SCHEMA_.queue_state s ON s.queue = i.queue
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

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue(
    queue text, type text, payload jsonb DEFAULT '{}', priority int DEFAULT 0,
    run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 10, partition_key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL, timeout_ms int DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
#variable_conflict use_column
DECLARE
  -- The caller's text, compared bytewise whatever collation it came with.
  q text COLLATE "C" := queue;
  t text COLLATE "C" := type;
  pkey text COLLATE "C" := partition_key;
  ikey text COLLATE "C" := idempotency_key;
  new_id bigint;
  problem text;
  channel text;
  limit_bytes bigint;
  shard_count int;
  new_shard int;
BEGIN
  -- NULL is not the default queue.
  IF NOT _BATON_SCHEMA_.name_ok(q) THEN
    PERFORM _BATON_SCHEMA_.check_name('queue', q);
  END IF;
  IF NOT _BATON_SCHEMA_.name_ok(t) THEN
    PERFORM _BATON_SCHEMA_.check_name('type', t);
  END IF;
  SELECT max(s.value) FILTER (WHERE s.key = 'max_payload_bytes'),
         coalesce(max(s.value) FILTER (WHERE s.key = 'shards'), '1')
    INTO limit_bytes, shard_count
    FROM _BATON_SCHEMA_.settings s WHERE s.key IN ('max_payload_bytes', 'shards');
  -- A simple expression (no sub-SELECT): PL/pgSQL evaluates it without the executor.
  problem := _BATON_SCHEMA_.typed_problem(coalesce(payload, '{}'), priority, max_attempts, 0,
                                          timeout_ms, pkey, ikey, limit_bytes);
  IF problem IS NOT NULL THEN
    PERFORM _BATON_SCHEMA_.raise_problem(problem);
  END IF;
  INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                        partition_key, partition, idempotency_key, timeout_ms,
                                        shard)
  VALUES (q, t, coalesce(enqueue.payload, '{}'), coalesce(enqueue.priority, 0),
          coalesce(enqueue.run_at, now()), coalesce(enqueue.max_attempts, 10), pkey,
          CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
          ikey, nullif(enqueue.timeout_ms, 0), _BATON_SCHEMA_.shard_of(pkey, shard_count))
  ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
  RETURNING j.id, j.shard INTO new_id, new_shard;
  IF new_id IS NULL THEN
    IF ikey IS NOT NULL THEN
      SELECT j.id INTO new_id FROM _BATON_SCHEMA_.jobs j
       WHERE j.queue = q AND j.idempotency_key = ikey;
    END IF;
    RETURN new_id;
  END IF;
  channel := current_schema() || '_jobs';
  IF NOT _BATON_SCHEMA_.leader_busy(channel, q, new_shard) THEN
    PERFORM pg_notify(channel, q);
  END IF;
  RETURN new_id;
END
$f$;

$functions$;
BEGIN
  EXECUTE replace(functions, '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;

-- Roles that write the lock row (nodes) draw its epochs and take the queue gates, and roles that
-- insert jobs (nodes, operators' `dead retry`) map them to shards, so that an upgrade keeps a
-- cluster under restricted roles running. The grants for new deployments are in
-- docs/security.md.
DO $grant$
DECLARE
  g record;
BEGIN
  FOR g IN SELECT DISTINCT a.grantee::regrole::text AS role, c.relname::text AS tab
             FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
            WHERE c.oid IN ('locks'::regclass, 'jobs'::regclass) AND a.grantee <> 0
              AND a.grantee <> c.relowner
              AND a.privilege_type = CASE WHEN c.relname = 'locks' THEN 'UPDATE' ELSE 'INSERT' END
  LOOP
    IF g.tab = 'locks' THEN
      EXECUTE format('GRANT USAGE, UPDATE ON SEQUENCE epochs TO %s', g.role);
      EXECUTE format('GRANT SELECT, INSERT, UPDATE ON queue_gates TO %s', g.role);
    ELSE
      EXECUTE format('GRANT EXECUTE ON FUNCTION shard_of(text, integer), shard_count() TO %s',
                     g.role);
    END IF;
  END LOOP;
END
$grant$;
