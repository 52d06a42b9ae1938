-- A job's lifecycle, made exact:
--   * claim_group: the lock group (region/lock_key) whose leader claimed a running job. Epochs
--     are per lock row, so every statement that compares epochs compares them within one group.
--   * claims: how many times the job was claimed, never reset (not even by `dead retry`, which
--     resets attempts). With claimed_epoch it names exactly one claim: the fencing token that
--     every outcome must match.
--   * cancel_requested_at: a producer or operator asked to cancel the job while it ran.
--   * idempotency_key is kept in history and dead_jobs, so a job's status can be asked by key
--     after it finished.
-- And stricter enqueue input: unknown keys and explicit NULL names are refused.

ALTER TABLE jobs ADD COLUMN claim_group text;
ALTER TABLE jobs ADD COLUMN claims integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cancel_requested_at timestamptz;
-- Jobs running under an older epoch before this migration belong to the default group.
UPDATE jobs SET claim_group = 'default/baton-leader' WHERE state = 'running';

ALTER TABLE dead_jobs ADD COLUMN claims integer NOT NULL DEFAULT 0;
ALTER TABLE dead_jobs ADD COLUMN idempotency_key text;
ALTER TABLE job_history ADD COLUMN idempotency_key text;
ALTER TABLE job_history ADD COLUMN last_error text;
CREATE INDEX job_history_key_idx ON job_history (queue, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
CREATE INDEX dead_jobs_key_idx ON dead_jobs (queue, idempotency_key)
  WHERE idempotency_key IS NOT NULL;

-- The rescue looks up running jobs by group and epoch.
DROP INDEX jobs_running_idx;
CREATE INDEX jobs_running_idx ON jobs (claim_group, claimed_epoch) WHERE state = 'running';

-- Nodes say which lock group they stand in (for `batonctl nodes` and for ending the open
-- transactions of a deposed leader of the same group).
ALTER TABLE nodes ADD COLUMN lock_group text;
-- And which job types they handle, so that `batonctl stats` can show jobs that wait for a leader
-- with a handler (a rolling deploy that adds a type).
ALTER TABLE nodes ADD COLUMN handles text[];

DO $migration$
DECLARE
  functions text := $functions$

-- The keys a job object of enqueue_many may have.
CREATE FUNCTION _BATON_SCHEMA_.job_keys() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $f$
  SELECT '{queue,type,payload,priority,run_at,delay_ms,max_attempts,partition_key,idempotency_key,timeout_ms}'::pg_catalog.text[]
$f$;

-- True when a job's option is absent (or null) or a whole number in lo..hi. A JSON string, a
-- fraction or a number too large for its column is refused before any cast can fail or wrap.
CREATE FUNCTION _BATON_SCHEMA_.whole_in(v jsonb, lo numeric, hi numeric) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $f$
  SELECT v IS NULL OR pg_catalog.jsonb_typeof(v) = 'null'
      OR (pg_catalog.jsonb_typeof(v) = 'number'
          AND v::pg_catalog.numeric = pg_catalog.trunc(v::pg_catalog.numeric)
          AND v::pg_catalog.numeric BETWEEN lo AND hi)
$f$;

-- As in 0008, plus: a key that enqueue does not know is refused (a misspelt "delay" would
-- otherwise run the job at once), so is an explicit null or non-text queue or type, and every
-- number must be a whole number in its range (a JSON string or a fraction is refused, and
-- nothing wraps around).
CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.job_problem(j jsonb, limit_bytes bigint,
                                                     check_names boolean) RETURNS text
LANGUAGE sql STABLE AS $f$
  SELECT CASE
    WHEN pg_catalog.jsonb_typeof(j) IS DISTINCT FROM 'object' THEN
      'BT003|each job must be a JSON object|'
    WHEN j - _BATON_SCHEMA_.job_keys() <> '{}'::pg_catalog.jsonb THEN
      pg_catalog.format('BT003|unknown key %s|',
        (SELECT pg_catalog.quote_literal(min(k))
           FROM pg_catalog.jsonb_object_keys(j - _BATON_SCHEMA_.job_keys()) k)) ||
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

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue(
    queue text, type text, payload jsonb DEFAULT '{}', priority int DEFAULT 0,
    run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 10, partition_key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL, timeout_ms int DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  new_id bigint;
BEGIN
  -- NULL is not the default queue: jsonb_strip_nulls below would make it one.
  PERFORM _BATON_SCHEMA_.check_name('queue', queue);
  PERFORM _BATON_SCHEMA_.check_name('type', type);
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

-- A job's status, wherever it is now: live (available, scheduled, running, cancelling), finished
-- (completed, cancelled) or dead. No row when the id was never a job, or its history was pruned.
CREATE FUNCTION _BATON_SCHEMA_.job_status(p_id bigint)
RETURNS TABLE (id bigint, queue text, type text, status text, attempts integer,
               max_attempts integer, run_at timestamptz, created_at timestamptz,
               finished_at timestamptz, last_error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
  SELECT j.id, j.queue, j.type,
         CASE WHEN j.state = 'running' AND j.cancel_requested_at IS NOT NULL THEN 'cancelling'
              WHEN j.state = 'running' THEN 'running'
              WHEN j.run_at > now() THEN 'scheduled' ELSE 'available' END,
         j.attempts, j.max_attempts, j.run_at, j.created_at, NULL::timestamptz, j.last_error
    FROM _BATON_SCHEMA_.jobs j WHERE j.id = p_id
  UNION ALL
  SELECT h.id, h.queue, h.type, h.outcome, h.attempts, NULL, h.run_at, h.created_at,
         h.finished_at, h.last_error
    FROM _BATON_SCHEMA_.job_history h WHERE h.id = p_id
  UNION ALL
  SELECT d.id, d.queue, d.type, 'dead', d.attempts, d.max_attempts, NULL, d.created_at, d.died_at,
         d.last_error
    FROM _BATON_SCHEMA_.dead_jobs d WHERE d.id = p_id
  LIMIT 1
$f$;

-- The job a producer enqueued with this idempotency key: the live one, else the newest finished
-- or dead one.
CREATE FUNCTION _BATON_SCHEMA_.job_id_by_key(p_queue text, p_key text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
  SELECT coalesce(
    (SELECT j.id FROM _BATON_SCHEMA_.jobs j WHERE j.queue = p_queue AND j.idempotency_key = p_key),
    (SELECT max(x.id) FROM (
       SELECT h.id FROM _BATON_SCHEMA_.job_history h
        WHERE h.queue = p_queue AND h.idempotency_key = p_key
       UNION ALL
       SELECT d.id FROM _BATON_SCHEMA_.dead_jobs d
        WHERE d.queue = p_queue AND d.idempotency_key = p_key) x))
$f$;

-- Cancels a job. Returns what happened:
--   cancelled   it had not started: it is in job_history with outcome 'cancelled' now
--   cancelling  it is running: its handler sees ctx.cancelled(); when the run ends, the job goes
--               to history as cancelled (or completed, if the handler finished anyway)
--   finished    it had finished (completed, cancelled or dead): nothing to do
--   not_found   no such job
-- The leader is woken on the jobs channel with 'cancel <id>'.
CREATE FUNCTION _BATON_SCHEMA_.cancel(p_id bigint) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  j _BATON_SCHEMA_.jobs%ROWTYPE;
BEGIN
  SELECT * INTO j FROM _BATON_SCHEMA_.jobs WHERE id = p_id FOR UPDATE;
  IF NOT FOUND THEN
    IF EXISTS (SELECT 1 FROM _BATON_SCHEMA_.job_history WHERE id = p_id)
       OR EXISTS (SELECT 1 FROM _BATON_SCHEMA_.dead_jobs WHERE id = p_id) THEN
      RETURN 'finished';
    END IF;
    RETURN 'not_found';
  END IF;
  IF j.state = 'running' THEN
    UPDATE _BATON_SCHEMA_.jobs SET cancel_requested_at = coalesce(cancel_requested_at, now())
     WHERE id = p_id;
    PERFORM pg_notify(current_schema() || '_jobs', 'cancel ' || p_id);
    RETURN 'cancelling';
  END IF;
  DELETE FROM _BATON_SCHEMA_.jobs WHERE id = p_id;
  INSERT INTO _BATON_SCHEMA_.job_history (id, queue, partition_key, type, payload, priority,
                                          attempts, created_at, run_at, first_started_at,
                                          started_at, finished_at, run_seconds, node, epoch,
                                          outcome, idempotency_key, last_error)
  VALUES (j.id, j.queue, j.partition_key, j.type, j.payload, j.priority, j.attempts,
          j.created_at, j.run_at, j.first_started_at, NULL, now(), NULL, NULL, NULL, 'cancelled',
          j.idempotency_key, j.last_error);
  -- The next job of an ordered partition may run now.
  IF j.partition IS NOT NULL THEN
    PERFORM pg_notify(current_schema() || '_jobs', j.queue);
  END IF;
  RETURN 'cancelled';
END
$f$;

$functions$;
BEGIN
  EXECUTE replace(functions, '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;
