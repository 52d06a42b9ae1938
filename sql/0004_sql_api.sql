-- The SQL API: producers in any language (or a trigger) enqueue with these functions. They are
-- the single definition of enqueue validation and defaults; the C++ client calls them too.
--
-- Errors carry stable SQLSTATEs:
--   BT001  a queue or type name breaks the naming rule
--   BT002  the payload is larger than the limit (settings.max_payload_bytes)
--   BT003  an option is out of range (priority, max_attempts, timeout, keys)
-- Every message says what to fix.

CREATE TABLE settings (
  key   text PRIMARY KEY,
  value text NOT NULL
);
INSERT INTO settings VALUES ('max_payload_bytes', '1048576');

CREATE FUNCTION check_name(what text, name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF name IS NULL OR name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'BT001',
      MESSAGE = format('%s name %s is not allowed', what, coalesce(quote_literal(name), 'NULL')),
      HINT = 'use 1..64 of A-Z a-z 0-9 _ . : -, starting with a letter or digit';
  END IF;
END
$$;

-- Checks jobs as enqueue_many would insert them; raises BT001..BT003 on the first bad one.
-- `jobs` is a JSON array of objects: queue, type, payload, priority, run_at, delay_ms,
-- max_attempts, partition_key, idempotency_key, timeout_ms (all but type optional).
CREATE FUNCTION validate_jobs(jobs jsonb) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  j jsonb;
  limit_bytes bigint := (SELECT value::bigint FROM settings WHERE key = 'max_payload_bytes');
  size bigint;
BEGIN
  IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION USING ERRCODE = 'BT003', MESSAGE = 'jobs must be a JSON array of objects';
  END IF;
  FOR j IN SELECT value FROM jsonb_array_elements(jobs) LOOP
    IF jsonb_typeof(j) IS DISTINCT FROM 'object' THEN
      RAISE EXCEPTION USING ERRCODE = 'BT003', MESSAGE = 'each job must be a JSON object';
    END IF;
    PERFORM check_name('queue', coalesce(j->>'queue', 'default'));
    PERFORM check_name('type', j->>'type');
    size := octet_length(coalesce(j->'payload', '{}'::jsonb)::text);
    IF size > limit_bytes THEN
      RAISE EXCEPTION USING ERRCODE = 'BT002',
        MESSAGE = format('payload is %s bytes; the limit is %s bytes', size, limit_bytes),
        HINT = 'store large data elsewhere and enqueue a reference to it';
    END IF;
    IF coalesce((j->>'priority')::int, 0) NOT BETWEEN -32768 AND 32767 THEN
      RAISE EXCEPTION USING ERRCODE = 'BT003',
        MESSAGE = format('priority %s is out of range', j->>'priority'),
        HINT = 'use -32768..32767 (lower runs first)';
    END IF;
    IF coalesce((j->>'max_attempts')::int, 10) NOT BETWEEN 1 AND 1000 THEN
      RAISE EXCEPTION USING ERRCODE = 'BT003',
        MESSAGE = format('max_attempts %s is out of range', j->>'max_attempts'),
        HINT = 'use 1..1000';
    END IF;
    IF coalesce((j->>'delay_ms')::bigint, 0) < 0 THEN
      RAISE EXCEPTION USING ERRCODE = 'BT003', MESSAGE = 'delay must not be negative';
    END IF;
    IF coalesce((j->>'delay_ms')::bigint, 0) > 3153600000000 THEN
      RAISE EXCEPTION USING ERRCODE = 'BT003', MESSAGE = 'delay is over 100 years',
        HINT = 'give run_at for a far-off date';
    END IF;
    IF coalesce((j->>'timeout_ms')::bigint, 0) NOT BETWEEN 0 AND 2000000000 THEN
      RAISE EXCEPTION USING ERRCODE = 'BT003',
        MESSAGE = format('timeout %s ms is out of range', j->>'timeout_ms'),
        HINT = 'use 0 (none) .. 2000000000 ms';
    END IF;
    IF octet_length(j->>'partition_key') > 256 OR octet_length(j->>'idempotency_key') > 256 THEN
      RAISE EXCEPTION USING ERRCODE = 'BT003',
        MESSAGE = 'partition_key and idempotency_key are at most 256 bytes';
    END IF;
  END LOOP;
END
$$;

-- Inserts validated jobs and wakes the leader once per queue. Returns the ids of the inserted
-- jobs in order; a job whose idempotency key is live already is skipped.
CREATE FUNCTION enqueue_many(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
  PERFORM validate_jobs(jobs);
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
    INSERT INTO jobs (queue, type, payload, priority, run_at, max_attempts, partition_key,
                      partition, idempotency_key, timeout_ms)
    SELECT queue, type, payload, priority, run_at, max_attempts, partition_key,
           job_partition(queue, partition_key), idempotency_key, timeout_ms
      FROM input ORDER BY ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue),
  wake AS (
    SELECT count(pg_notify(current_schema() || '_jobs', q)) AS n
      FROM (SELECT DISTINCT queue AS q FROM ins) d)
  SELECT id FROM ins WHERE (SELECT n FROM wake) >= 0 ORDER BY id;
END
$$;

-- One job. Returns its id, or the live job's id when the idempotency key is taken.
CREATE FUNCTION enqueue(queue text, type text, payload jsonb DEFAULT '{}',
                        priority int DEFAULT 0, run_at timestamptz DEFAULT NULL,
                        max_attempts int DEFAULT 10, partition_key text DEFAULT NULL,
                        idempotency_key text DEFAULT NULL, timeout_ms int DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
  new_id bigint;
BEGIN
  SELECT e INTO new_id FROM enqueue_many(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
    'queue', queue, 'type', type, 'payload', payload, 'priority', priority, 'run_at', run_at,
    'max_attempts', max_attempts, 'partition_key', partition_key,
    'idempotency_key', idempotency_key, 'timeout_ms', timeout_ms)))) AS e;
  IF new_id IS NULL AND idempotency_key IS NOT NULL THEN
    SELECT j.id INTO new_id FROM jobs j
     WHERE j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key;
  END IF;
  RETURN new_id;
END
$$;

-- Read-only views for operators and dashboards.
CREATE VIEW queue_stats AS
SELECT queue,
       count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS available,
       count(*) FILTER (WHERE state = 'available' AND run_at > now()) AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running,
       extract(epoch FROM now() - min(run_at) FILTER (
         WHERE state = 'available' AND run_at <= now())) AS oldest_available_seconds
  FROM jobs GROUP BY queue;

CREATE VIEW recent_failures AS
SELECT id, queue, type, attempts, max_attempts, last_error, run_at AS next_run_at,
       'retrying' AS status
  FROM jobs WHERE last_error IS NOT NULL
UNION ALL
SELECT id, queue, type, attempts, max_attempts, last_error, NULL, 'dead: ' || reason
  FROM dead_jobs WHERE died_at > now() - interval '1 day';

-- Pin the functions to baton's schema, and let only roles granted EXECUTE call them.
DO $$
BEGIN
  EXECUTE format('ALTER FUNCTION enqueue_many(jsonb) SET search_path = %I', current_schema());
  EXECUTE format('ALTER FUNCTION enqueue(text, text, jsonb, int, timestamptz, int, text, text, int) '
                 'SET search_path = %I', current_schema());
  EXECUTE format('ALTER FUNCTION check_name(text, text) SET search_path = %I', current_schema());
  EXECUTE format('ALTER FUNCTION validate_jobs(jsonb) SET search_path = %I', current_schema());
END
$$;
REVOKE ALL ON FUNCTION enqueue_many(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION enqueue(text, text, jsonb, int, timestamptz, int, text, text, int) FROM PUBLIC;
