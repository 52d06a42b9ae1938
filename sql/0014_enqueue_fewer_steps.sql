-- A single-job enqueue with fewer steps per call (issue 16's producers). Measured with
-- bench/enqueue_cost, one session committing one call per transaction: each PL/pgSQL expression
-- is set up again in every transaction, and one that calls a STABLE or VOLATILE function takes
-- a snapshot first.
--
-- * name_ok matches a regular expression instead of trimming the allowed characters twice: the
--   trims compared every character with every allowed one, about 3 us per name. The rule is the
--   same: 1..64 bytes of A-Z a-z 0-9 _ . : -, starting with a letter or digit. An unbounded `*`
--   with the length checked apart: a bounded repeat ({0,63}) cost as much as the trims.
-- * enqueue checks both names in one expression, and its other arguments in one condition;
--   typed_problem writes the message only when that condition holds. It computes the shard and
--   tries the wake keys inside its INSERT (the shard in VALUES, the keys in RETURNING) instead
--   of in three statements of their own. The channel is a literal written here: the function's
--   fixed search_path made current_schema() the schema it was created in.
-- Nothing else changes: the same checks in the same order, the same messages and SQLSTATEs, the
-- same row, and the wake keys tried after the row is in, as before.

DO $migration$
DECLARE
  functions text := $functions$

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.name_ok(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $f$
  SELECT name IS NOT NULL AND pg_catalog.octet_length(name) BETWEEN 1 AND 64
     AND name COLLATE "C" OPERATOR(pg_catalog.~) '^[A-Za-z0-9][-A-Za-z0-9_.:]*$'
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
  wake boolean;
BEGIN
  -- NULL is not the default queue. The queue's problem is reported first.
  IF NOT (_BATON_SCHEMA_.name_ok(q) AND _BATON_SCHEMA_.name_ok(t)) THEN
    PERFORM _BATON_SCHEMA_.check_name('queue', q);
    PERFORM _BATON_SCHEMA_.check_name('type', t);
  END IF;
  -- typed_problem's conditions (its delay is 0 here), without its messages: set up in every
  -- transaction, its CASE of formatted messages cost more than the checks themselves. It names
  -- the problem when one of them holds. Simple expressions (no sub-SELECT): PL/pgSQL evaluates
  -- them without the executor.
  IF pg_catalog.octet_length(coalesce(payload, '{}')::text) > _BATON_SCHEMA_.max_payload_bytes()
     OR priority NOT BETWEEN -32768 AND 32767 OR max_attempts NOT BETWEEN 1 AND 1000
     OR timeout_ms NOT BETWEEN 0 AND 2000000000
     OR pg_catalog.octet_length(pkey) > 256 OR pg_catalog.octet_length(ikey) > 256 THEN
    problem := _BATON_SCHEMA_.typed_problem(coalesce(payload, '{}'), priority, max_attempts, 0,
                                            timeout_ms, pkey, ikey,
                                            _BATON_SCHEMA_.max_payload_bytes());
    -- NULL when the payload limit was raised between the two readings: the job is within it.
    IF problem IS NOT NULL THEN
      PERFORM _BATON_SCHEMA_.raise_problem(problem);
    END IF;
  END IF;
  -- Either INSERT computes the job's shard in VALUES (only a job without a partition key takes
  -- the constant count, 0013) and tries the wake keys in RETURNING, once the row is in.
  IF ikey IS NULL THEN
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          partition_key, partition, timeout_ms, shard)
    VALUES (q, t, coalesce(enqueue.payload, '{}'), coalesce(enqueue.priority, 0),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.max_attempts, 10), pkey,
            CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
            nullif(enqueue.timeout_ms, 0),
            CASE WHEN pkey IS NULL
                 THEN _BATON_SCHEMA_.shard_of(NULL, _BATON_SCHEMA_.shard_count_constant())
                 ELSE _BATON_SCHEMA_.shard_of(pkey, _BATON_SCHEMA_.shard_count()) END)
    RETURNING j.id, NOT _BATON_SCHEMA_.leader_busy(_BATON_CHANNEL_, q, j.shard)
      INTO new_id, wake;
  ELSE
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          partition_key, partition, idempotency_key, timeout_ms,
                                          shard)
    VALUES (q, t, coalesce(enqueue.payload, '{}'), coalesce(enqueue.priority, 0),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.max_attempts, 10), pkey,
            CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
            ikey, nullif(enqueue.timeout_ms, 0),
            CASE WHEN pkey IS NULL
                 THEN _BATON_SCHEMA_.shard_of(NULL, _BATON_SCHEMA_.shard_count_constant())
                 ELSE _BATON_SCHEMA_.shard_of(pkey, _BATON_SCHEMA_.shard_count()) END)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id, NOT _BATON_SCHEMA_.leader_busy(_BATON_CHANNEL_, q, j.shard)
      INTO new_id, wake;
    IF new_id IS NULL THEN
      SELECT j.id INTO new_id FROM _BATON_SCHEMA_.jobs j
       WHERE j.queue = q AND j.idempotency_key = ikey;
      RETURN new_id;
    END IF;
  END IF;
  IF wake THEN
    PERFORM pg_notify(_BATON_CHANNEL_, q);
  END IF;
  RETURN new_id;
END
$f$;

$functions$;
BEGIN
  EXECUTE replace(replace(functions, '_BATON_CHANNEL_', quote_literal(current_schema() || '_jobs')),
                  '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;
