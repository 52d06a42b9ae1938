-- A single-job enqueue that takes the common job in fewer steps (issue 16's producers). A job
-- without a partition key or an idempotency key whose checks all pass (nearly every call) is
-- inserted by the function's first statement: one condition for all its checks, then an INSERT
-- of only the columns such a job sets. Every other call goes on to the body of 0014 unchanged:
-- the same checks in the same order, the same messages and SQLSTATEs, the same rows.
--
-- Measured with bench/enqueue_cost (one session, one call per transaction): PL/pgSQL sets up
-- every expression it evaluates again in each transaction, and 0014's common job evaluated the
-- four copies of its arguments, two conditions, the choice of INSERT, and an INSERT whose VALUES
-- computed a partition and a shard for a key it did not have.

DO $migration$
DECLARE
  functions text := $functions$

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue(
    queue text, type text, payload jsonb DEFAULT '{}', priority int DEFAULT 0,
    run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 10, partition_key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL, timeout_ms int DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
#variable_conflict use_column
DECLARE
  -- The caller's text, compared bytewise whatever collation it came with.
  q text COLLATE "C";
  t text COLLATE "C";
  pkey text COLLATE "C";
  ikey text COLLATE "C";
  new_id bigint;
  problem text;
  wake boolean;
BEGIN
  -- The common job: no partition key, no idempotency key, and every check below passes (a NULL
  -- check passes, as below). The same conditions as the checks, joined into one; the same row
  -- as the INSERT below makes for such a job; the wake keys tried the same way.
  IF partition_key IS NULL AND idempotency_key IS NULL
     AND _BATON_SCHEMA_.name_ok(queue) AND _BATON_SCHEMA_.name_ok(type)
     AND (pg_catalog.octet_length(coalesce(payload, '{}')::text) > _BATON_SCHEMA_.max_payload_bytes()
          OR priority NOT BETWEEN -32768 AND 32767 OR max_attempts NOT BETWEEN 1 AND 1000
          OR timeout_ms NOT BETWEEN 0 AND 2000000000) IS NOT TRUE THEN
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          timeout_ms, shard)
    VALUES (enqueue.queue, enqueue.type, coalesce(enqueue.payload, '{}'),
            coalesce(enqueue.priority, 0), coalesce(enqueue.run_at, now()),
            coalesce(enqueue.max_attempts, 10), nullif(enqueue.timeout_ms, 0),
            _BATON_SCHEMA_.shard_of(NULL, _BATON_SCHEMA_.shard_count_constant()))
    RETURNING j.id, NOT _BATON_SCHEMA_.leader_busy(_BATON_CHANNEL_, j.queue, j.shard)
      INTO new_id, wake;
    IF wake THEN
      PERFORM pg_notify(_BATON_CHANNEL_, enqueue.queue);
    END IF;
    RETURN new_id;
  END IF;
  -- Any other job: each check in turn, each with its own message.
  q := queue;
  t := type;
  pkey := partition_key;
  ikey := idempotency_key;
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
