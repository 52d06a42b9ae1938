-- Hardening against every role that can connect (issue: a producer must never become the owner).
--
-- enqueue and enqueue_many run as the schema's owner (SECURITY DEFINER). PostgreSQL searches the
-- caller's temporary schema FIRST for tables and types unless pg_temp is named in search_path, so
-- a caller could shadow `jobs`, `settings` or `queue_state` with temp tables of its own (with
-- triggers that then run as the owner). Every function is created again here:
--   * search_path is baton's schema, then pg_temp last (for functions that can be inlined, which
--     a SET clause would prevent, every name is schema-qualified instead);
--   * every table and function in the bodies is named with its schema;
--   * nobody holds EXECUTE without a grant.
-- The bodies name the schema as _BATON_SCHEMA_, replaced by the quoted schema name below.
-- The rules, messages and SQLSTATEs are those of 0004 and 0007, unchanged.

DO $migration$
DECLARE
  functions text := $functions$

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.name_ok(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $f$
  SELECT name IS NOT NULL AND octet_length(name) BETWEEN 1 AND 64
     AND pg_catalog.ltrim(name,
           'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
     AND pg_catalog.ltrim(pg_catalog.left(name, 1),
           'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789') = ''
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.check_name(what text, name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
BEGIN
  IF NOT _BATON_SCHEMA_.name_ok(name) THEN
    RAISE EXCEPTION USING ERRCODE = 'BT001',
      MESSAGE = format('%s name %s is not allowed', what, coalesce(quote_literal(name), 'NULL')),
      HINT = 'use 1..64 of A-Z a-z 0-9 _ . : -, starting with a letter or digit';
  END IF;
END
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.job_problem(j jsonb, limit_bytes bigint,
                                                     check_names boolean) RETURNS text
LANGUAGE sql STABLE AS $f$
  SELECT CASE
    WHEN pg_catalog.jsonb_typeof(j) IS DISTINCT FROM 'object' THEN
      'BT003|each job must be a JSON object|'
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
    WHEN coalesce((j->>'priority')::int, 0) NOT BETWEEN -32768 AND 32767 THEN
      pg_catalog.format('BT003|priority %s is out of range|', j->>'priority') ||
        'use -32768..32767 (lower runs first)'
    WHEN coalesce((j->>'max_attempts')::int, 10) NOT BETWEEN 1 AND 1000 THEN
      pg_catalog.format('BT003|max_attempts %s is out of range|use 1..1000', j->>'max_attempts')
    WHEN coalesce((j->>'delay_ms')::bigint, 0) < 0 THEN
      'BT003|delay must not be negative|'
    WHEN coalesce((j->>'delay_ms')::bigint, 0) > 3153600000000 THEN
      'BT003|delay is over 100 years|give run_at for a far-off date'
    WHEN coalesce((j->>'timeout_ms')::bigint, 0) NOT BETWEEN 0 AND 2000000000 THEN
      pg_catalog.format('BT003|timeout %s ms is out of range|', j->>'timeout_ms') ||
        'use 0 (none) .. 2000000000 ms'
    WHEN pg_catalog.octet_length(j->>'partition_key') > 256
      OR pg_catalog.octet_length(j->>'idempotency_key') > 256 THEN
      'BT003|partition_key and idempotency_key are at most 256 bytes|'
  END
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.partition_of(p_key text, partitions integer)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $f$
  SELECT (((pg_catalog.hashtextextended(p_key, 0) % partitions) + partitions) % partitions)::integer
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.job_partition(p_queue text, p_key text) RETURNS integer
LANGUAGE sql STABLE SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
  SELECT _BATON_SCHEMA_.partition_of(p_key, (SELECT s.partitions FROM _BATON_SCHEMA_.queue_state s
                                              WHERE s.queue = p_queue))
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.validate_jobs(jobs jsonb) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  limit_bytes bigint := (SELECT s.value::bigint FROM _BATON_SCHEMA_.settings s
                          WHERE s.key = 'max_payload_bytes');
  problem text;
  parts text[];
  bad_names boolean;
BEGIN
  IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION USING ERRCODE = 'BT003', MESSAGE = 'jobs must be a JSON array of objects';
  END IF;
  bad_names := EXISTS (
    SELECT 1 FROM (SELECT DISTINCT coalesce(e->>'queue', 'default') AS queue, e->>'type' AS type
                     FROM jsonb_array_elements(jobs) AS a(e)
                    WHERE jsonb_typeof(e) = 'object'
                   OFFSET 0) n
     WHERE NOT _BATON_SCHEMA_.name_ok(queue) OR NOT _BATON_SCHEMA_.name_ok(type));
  SELECT p INTO problem
    FROM jsonb_array_elements(jobs) WITH ORDINALITY AS a(e, ord),
         LATERAL (SELECT _BATON_SCHEMA_.job_problem(e, limit_bytes, bad_names) AS p) q
   WHERE p IS NOT NULL
   ORDER BY ord LIMIT 1;
  IF problem IS NOT NULL THEN
    parts := regexp_match(problem, '^([^|]*)\|(.*)\|([^|]*)$');
    IF parts[3] = '' THEN
      RAISE EXCEPTION USING ERRCODE = parts[1], MESSAGE = parts[2];
    END IF;
    RAISE EXCEPTION USING ERRCODE = parts[1], MESSAGE = parts[2], HINT = parts[3];
  END IF;
END
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
    SELECT count(pg_notify(current_schema() || '_jobs', q)) AS n
      FROM (SELECT DISTINCT queue AS q FROM ins) d)
  SELECT id FROM ins WHERE (SELECT n FROM wake) >= 0 ORDER BY id;
END
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue(
    queue text, type text, payload jsonb DEFAULT '{}', priority int DEFAULT 0,
    run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 10, partition_key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL, timeout_ms int DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  new_id bigint;
BEGIN
  SELECT e INTO new_id FROM _BATON_SCHEMA_.enqueue_many(jsonb_build_array(jsonb_strip_nulls(
    jsonb_build_object('queue', queue, 'type', type, 'payload', payload, 'priority', priority,
                       'run_at', run_at, 'max_attempts', max_attempts,
                       'partition_key', partition_key, 'idempotency_key', idempotency_key,
                       'timeout_ms', timeout_ms)))) AS e;
  IF new_id IS NULL AND idempotency_key IS NOT NULL THEN
    SELECT j.id INTO new_id FROM _BATON_SCHEMA_.jobs j
     WHERE j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key;
  END IF;
  RETURN new_id;
END
$f$;

-- Step-down requests: only a role that may INSERT here (an operator's) can ask a leader to step
-- down. NOTIFY on the leader channel is a wake-up only: anyone may send one, and it makes the
-- leader read this table, nothing more. Who asked is the session's user, whatever the row says.
CREATE TABLE _BATON_SCHEMA_.control_requests (
  id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind         text        NOT NULL CHECK (kind IN ('step_down')),
  target       text        NOT NULL,  -- a node id, or '*' for whichever node leads
  lock_group   text,                  -- "<region>/<lock_key>", or NULL for every group
  note         text,
  requested_by text        NOT NULL DEFAULT session_user,
  requested_at timestamptz NOT NULL DEFAULT now(),
  handled_at   timestamptz,
  handled_by   text,
  outcome      text
);
CREATE INDEX control_requests_pending_idx ON _BATON_SCHEMA_.control_requests (requested_at)
  WHERE handled_at IS NULL;

CREATE FUNCTION _BATON_SCHEMA_.stamp_request() RETURNS trigger
LANGUAGE plpgsql SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
BEGIN
  NEW.requested_by := session_user;
  NEW.requested_at := now();
  NEW.handled_at := NULL;
  NEW.handled_by := NULL;
  NEW.outcome := NULL;
  RETURN NEW;
END
$f$;
CREATE TRIGGER control_requests_stamp BEFORE INSERT ON _BATON_SCHEMA_.control_requests
  FOR EACH ROW EXECUTE FUNCTION _BATON_SCHEMA_.stamp_request();

$functions$;
BEGIN
  EXECUTE replace(functions, '_BATON_SCHEMA_', quote_ident(current_schema()));
  -- EXECUTE only by grant. (The migration runner repeats this after every migration, so that
  -- functions added later are covered too: PostgreSQL grants EXECUTE to PUBLIC by default, and
  -- per-schema default privileges cannot take that back.)
  EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM PUBLIC', current_schema());
END
$migration$;

-- A job that crashed its node on its last attempt is dead with reason `crashed` (the rescue
-- moves it); nothing else about the tables changes here.
