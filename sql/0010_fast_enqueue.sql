-- Faster enqueue, and producers that do not wait for each other.
--
-- * job_problem could not be inlined (a sub-SELECT in its body), so validate_jobs ran it through
--   the SQL-function executor once per job: 35 of the 60 ms that enqueue_many took for 1,000
--   jobs. The unknown key's name now comes from a function of its own, called only for a job that
--   has one; the rules and messages are those of 0009.
-- * A NOTIFY makes its transaction take PostgreSQL's notification lock at commit and hold it
--   through the commit, so concurrent producers that notify commit one at a time. A producer now
--   notifies only when a leader may be asleep. The protocol (see worker/poller.h):
--     - a leader that found no work takes, on its LISTENing session, an exclusive session advisory
--       lock on the wake key of each queue it consumes (key "<channel>/*" when it consumes every
--       queue), claims once more, and only then sleeps; it lets go of the keys when it wakes;
--     - a producer, in its enqueue transaction, tries a shared transaction lock on the wake keys
--       of its queue and of "*": when it gets both, no leader sleeps on them, and none can start
--       to before this transaction ends (so the leader's last claim will see the job); when it
--       does not, it notifies as before.
--   A session that holds a wake key shared for long only makes the leader poll more often (every
--   50 ms at most); one that holds it exclusively only makes producers notify as before.
-- * Names are checked and hashed under the "C" collation: a text argument carries its caller's
--   collation into a function, and under a nondeterministic one (a producer may create one in
--   pg_temp) ltrim(name, allowed) = '' held for names with ignorable characters.

DO $migration$
DECLARE
  functions text := $functions$

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.name_ok(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $f$
  SELECT name IS NOT NULL AND octet_length(name) BETWEEN 1 AND 64
     AND pg_catalog.ltrim(name COLLATE "C",
           'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
     AND pg_catalog.ltrim(pg_catalog.left(name COLLATE "C", 1),
           'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789') = ''
$f$;

-- The first key of a job object that enqueue_many does not know, quoted.
CREATE FUNCTION _BATON_SCHEMA_.first_unknown_key(j jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $f$
  SELECT pg_catalog.quote_literal(min(k))
    FROM pg_catalog.jsonb_object_keys(j - _BATON_SCHEMA_.job_keys()) k
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.job_problem(j jsonb, limit_bytes bigint,
                                                     check_names boolean) RETURNS text
LANGUAGE sql STABLE AS $f$
  SELECT CASE
    WHEN pg_catalog.jsonb_typeof(j) IS DISTINCT FROM 'object' THEN
      'BT003|each job must be a JSON object|'
    WHEN j - _BATON_SCHEMA_.job_keys() <> '{}'::pg_catalog.jsonb THEN
      pg_catalog.format('BT003|unknown key %s|',
        _BATON_SCHEMA_.first_unknown_key(j)) ||
        'the keys are ' || pg_catalog.array_to_string(_BATON_SCHEMA_.job_keys(), ', ')
    WHEN j ? 'queue' AND pg_catalog.jsonb_typeof(j->'queue') IS DISTINCT FROM 'string' THEN
      'BT001|queue name must be a string (leave the key out for the default queue)|'
    WHEN j ? 'type' AND pg_catalog.jsonb_typeof(j->'type') IS DISTINCT FROM 'string' THEN
      'BT001|type name must be a string|'
    WHEN check_names AND NOT _BATON_SCHEMA_.name_ok(coalesce(j->>'queue', 'default')) THEN
      pg_catalog.format('BT001|queue name %s is not allowed|', pg_catalog.quote_literal(j->>'queue')) ||
        'use 1..64 of A-Z a-z 0-9 _ . : -, starting with a letter or digit'
    WHEN check_names AND NOT _BATON_SCHEMA_.name_ok(j->>'type') THEN
      pg_catalog.format('BT001|type name %s is not allowed|',
                        coalesce(pg_catalog.quote_literal(j->>'type'), 'NULL')) ||
        'use 1..64 of A-Z a-z 0-9 _ . : -, starting with a letter or digit'
    WHEN pg_catalog.octet_length(coalesce(j->'payload', '{}'::pg_catalog.jsonb)::text) > limit_bytes THEN
      pg_catalog.format('BT002|payload is %s bytes; the limit is %s bytes|',
             pg_catalog.octet_length(coalesce(j->'payload', '{}'::pg_catalog.jsonb)::text), limit_bytes) ||
        'store large data elsewhere and enqueue a reference to it'
    WHEN NOT _BATON_SCHEMA_.whole_in(j->'priority', -32768, 32767) THEN
      pg_catalog.format('BT003|priority %s is out of range|', j->'priority') ||
        'use a whole number in -32768..32767 (lower runs first)'
    WHEN NOT _BATON_SCHEMA_.whole_in(j->'max_attempts', 1, 1000) THEN
      pg_catalog.format('BT003|max_attempts %s is out of range|use a whole number in 1..1000',
                        j->'max_attempts')
    WHEN NOT _BATON_SCHEMA_.whole_in(j->'delay_ms', -9223372036854775808, 9223372036854775807) THEN
      pg_catalog.format('BT003|delay_ms %s is not a whole number of milliseconds|', j->'delay_ms')
    WHEN coalesce((j->>'delay_ms')::bigint, 0) < 0 THEN
      'BT003|delay must not be negative|'
    WHEN coalesce((j->>'delay_ms')::bigint, 0) > 3153600000000 THEN
      'BT003|delay is over 100 years|give run_at for a far-off date'
    WHEN NOT _BATON_SCHEMA_.whole_in(j->'timeout_ms', 0, 2000000000) THEN
      pg_catalog.format('BT003|timeout %s ms is out of range|', j->'timeout_ms') ||
        'use a whole number in 0 (none) .. 2000000000 ms'
    WHEN j ? 'partition_key' AND pg_catalog.jsonb_typeof(j->'partition_key') NOT IN ('string', 'null')
      OR j ? 'idempotency_key' AND pg_catalog.jsonb_typeof(j->'idempotency_key') NOT IN ('string', 'null')
      OR j ? 'run_at' AND pg_catalog.jsonb_typeof(j->'run_at') NOT IN ('string', 'null') THEN
      'BT003|partition_key, idempotency_key and run_at must be strings|'
    WHEN pg_catalog.octet_length(j->>'partition_key') > 256
      OR pg_catalog.octet_length(j->>'idempotency_key') > 256 THEN
      'BT003|partition_key and idempotency_key are at most 256 bytes|'
  END
$f$;

-- True when no leader can be asleep on `queue` until this transaction ends: this transaction
-- then holds the queue's wake key and the "*" key shared. False: notify `channel`.
CREATE FUNCTION _BATON_SCHEMA_.leader_busy(channel text, queue text) RETURNS boolean
LANGUAGE sql VOLATILE AS $f$
  SELECT pg_catalog.pg_try_advisory_xact_lock_shared(
           pg_catalog.hashtextextended((channel || '/' || queue) COLLATE "C", 0))
     AND pg_catalog.pg_try_advisory_xact_lock_shared(
           pg_catalog.hashtextextended((channel || '/*') COLLATE "C", 0))
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue_many(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
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
                                     partition_key, partition, idempotency_key, timeout_ms)
    SELECT i.queue, i.type, i.payload, i.priority, i.run_at, i.max_attempts, i.partition_key,
           _BATON_SCHEMA_.partition_of(i.partition_key, s.partitions), i.idempotency_key,
           i.timeout_ms
      FROM input i LEFT JOIN _BATON_SCHEMA_.queue_state s ON s.queue = i.queue
     ORDER BY i.ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue),
  wake AS (
    SELECT count(pg_notify(c.channel, d.q)) AS n
      FROM (SELECT DISTINCT queue AS q FROM ins) d,
           (SELECT current_schema() || '_jobs' AS channel) c
     WHERE NOT _BATON_SCHEMA_.leader_busy(c.channel, d.q))
  SELECT id FROM ins WHERE (SELECT n FROM wake) >= 0 ORDER BY id;
END
$f$;

-- Raises a problem of job_problem's form ('<SQLSTATE>|<message>|<hint>').
CREATE FUNCTION _BATON_SCHEMA_.raise_problem(problem text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  -- The problem may quote a caller's text in the caller's collation: match it bytewise.
  parts text[] := regexp_match(problem COLLATE "C", '^([^|]*)\|(.*)\|([^|]*)$');
BEGIN
  IF parts[3] = '' THEN
    RAISE EXCEPTION USING ERRCODE = parts[1], MESSAGE = parts[2];
  END IF;
  RAISE EXCEPTION USING ERRCODE = parts[1], MESSAGE = parts[2], HINT = parts[3];
END
$f$;

-- The problem with one job's typed options, in job_problem's form, or NULL. NULL options take
-- their defaults. (Inlined where it is called: no sub-SELECT.)
CREATE FUNCTION _BATON_SCHEMA_.typed_problem(payload jsonb, priority int, max_attempts int,
                                             delay_ms bigint, timeout_ms int,
                                             partition_key text, idempotency_key text,
                                             limit_bytes bigint) RETURNS text
LANGUAGE sql STABLE AS $f$
  SELECT CASE
    WHEN pg_catalog.octet_length(payload::text) > limit_bytes THEN
      pg_catalog.format('BT002|payload is %s bytes; the limit is %s bytes|',
                        pg_catalog.octet_length(payload::text), limit_bytes) ||
        'store large data elsewhere and enqueue a reference to it'
    WHEN priority NOT BETWEEN -32768 AND 32767 THEN
      pg_catalog.format('BT003|priority %s is out of range|', priority) ||
        'use a whole number in -32768..32767 (lower runs first)'
    WHEN max_attempts NOT BETWEEN 1 AND 1000 THEN
      pg_catalog.format('BT003|max_attempts %s is out of range|use a whole number in 1..1000',
                        max_attempts)
    WHEN delay_ms < 0 THEN
      'BT003|delay must not be negative|'
    WHEN delay_ms > 3153600000000 THEN
      'BT003|delay is over 100 years|give run_at for a far-off date'
    WHEN timeout_ms NOT BETWEEN 0 AND 2000000000 THEN
      pg_catalog.format('BT003|timeout %s ms is out of range|', timeout_ms) ||
        'use a whole number in 0 (none) .. 2000000000 ms'
    WHEN pg_catalog.octet_length(partition_key) > 256
      OR pg_catalog.octet_length(idempotency_key) > 256 THEN
      'BT003|partition_key and idempotency_key are at most 256 bytes|'
  END
$f$;

-- enqueue_many for typed columns, one element per job: the C++ Client's batches. Typed values
-- need no checks of their JSON form, so a batch costs about what its INSERT does. A NULL
-- element takes the default (the queue and type have none); `payloads` is a JSON array. The
-- rules, messages and SQLSTATEs are enqueue_many's.
CREATE FUNCTION _BATON_SCHEMA_.enqueue_columns(
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
                                     partition_key, partition, idempotency_key, timeout_ms)
    SELECT i.queue, i.type, i.payload, i.priority, i.run_at, i.max_attempts, i.partition_key,
           _BATON_SCHEMA_.partition_of(i.partition_key, s.partitions), i.idempotency_key,
           i.timeout_ms
      FROM input i LEFT JOIN _BATON_SCHEMA_.queue_state s ON s.queue = i.queue
     ORDER BY i.ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue),
  wake AS (
    SELECT count(pg_notify(c.channel, d.q)) AS n
      FROM (SELECT DISTINCT queue AS q FROM ins) d,
           (SELECT current_schema() || '_jobs' AS channel) c
     WHERE NOT _BATON_SCHEMA_.leader_busy(c.channel, d.q))
  SELECT id FROM ins WHERE (SELECT n FROM wake) >= 0 ORDER BY id;
END
$f$;

-- One job, typed: checked and inserted directly, not through enqueue_many's JSON (a quarter of
-- the CPU time). Same arguments, rules, messages and answer as before, except that a payload's
-- JSON nulls are kept (0009 stripped them, at any depth), as enqueue_many keeps them.
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
BEGIN
  -- NULL is not the default queue.
  IF NOT _BATON_SCHEMA_.name_ok(q) THEN
    PERFORM _BATON_SCHEMA_.check_name('queue', q);
  END IF;
  IF NOT _BATON_SCHEMA_.name_ok(t) THEN
    PERFORM _BATON_SCHEMA_.check_name('type', t);
  END IF;
  SELECT s.value::bigint INTO limit_bytes FROM _BATON_SCHEMA_.settings s
   WHERE s.key = 'max_payload_bytes';
  -- A simple expression (no sub-SELECT): PL/pgSQL evaluates it without the executor.
  problem := _BATON_SCHEMA_.typed_problem(coalesce(payload, '{}'), priority, max_attempts, 0,
                                          timeout_ms, pkey, ikey, limit_bytes);
  IF problem IS NOT NULL THEN
    PERFORM _BATON_SCHEMA_.raise_problem(problem);
  END IF;
  INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                        partition_key, partition, idempotency_key, timeout_ms)
  VALUES (q, t, coalesce(enqueue.payload, '{}'), coalesce(enqueue.priority, 0),
          coalesce(enqueue.run_at, now()), coalesce(enqueue.max_attempts, 10), pkey,
          CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
          ikey, nullif(enqueue.timeout_ms, 0))
  ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
  RETURNING j.id INTO new_id;
  IF new_id IS NULL THEN
    IF ikey IS NOT NULL THEN
      SELECT j.id INTO new_id FROM _BATON_SCHEMA_.jobs j
       WHERE j.queue = q AND j.idempotency_key = ikey;
    END IF;
    RETURN new_id;
  END IF;
  channel := current_schema() || '_jobs';
  IF NOT _BATON_SCHEMA_.leader_busy(channel, q) THEN
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
