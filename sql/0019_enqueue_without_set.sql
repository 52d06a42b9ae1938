-- enqueue without a SET clause (issue 16's producers). On PostgreSQL 15 a function with a SET
-- clause puts the setting back when it returns by visiting every configuration variable the
-- server has, a few hundred structures in as many cache lines. Measured with cachegrind on one
-- backend (docs/performance.md): that walk was 3,400 instructions and 417 first-level cache
-- misses of each call. Alone they are cheap; under 32 producers on two cores, where each switch
-- of process leaves the caches to others, each miss goes farther.
--
-- enqueue still runs as its owner. Without a search_path of its own it runs on the caller's, so
-- its common job names everything with its schema: tables, functions, every operator as
-- OPERATOR(pg_catalog.x) on types that pg_catalog matches exactly, every type and the collation.
-- NULLIF and BETWEEN are spelled out (PostgreSQL looks their operators up by name). The SQL
-- functions it inlines, whose bodies are read on the caller's path too, do the same:
-- common_job_ok (new), name_ok, leader_busy and shard_of (rewritten, the same results), and
-- max_payload_bytes() and shard_count_constant(), whose bodies are a cast literal. Any other
-- job goes on to enqueue_checked, 0017's body unchanged, under baton's search_path as before.

DO $migration$
DECLARE
  functions text := $functions$

-- 0017's enqueue past its common job: each check in turn, each with its own message.
CREATE FUNCTION _BATON_SCHEMA_.enqueue_checked(
    queue text, type text, payload jsonb, priority int, run_at timestamptz, max_attempts int,
    partition_key text, idempotency_key text, timeout_ms int)
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
  IF ikey IS NULL THEN
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          partition_key, partition, timeout_ms, shard)
    VALUES (q, t, coalesce(enqueue_checked.payload, '{}'), coalesce(enqueue_checked.priority, 0),
            coalesce(enqueue_checked.run_at, now()), coalesce(enqueue_checked.max_attempts, 10),
            pkey, CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
            nullif(enqueue_checked.timeout_ms, 0),
            CASE WHEN pkey IS NULL
                 THEN _BATON_SCHEMA_.shard_of(NULL, _BATON_SCHEMA_.shard_count_constant())
                 ELSE _BATON_SCHEMA_.shard_of(pkey, _BATON_SCHEMA_.shard_count()) END)
    RETURNING j.id, NOT _BATON_SCHEMA_.leader_busy(_BATON_CHANNEL_, q, j.shard)
      INTO new_id, wake;
  ELSE
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          partition_key, partition, idempotency_key, timeout_ms,
                                          shard)
    VALUES (q, t, coalesce(enqueue_checked.payload, '{}'), coalesce(enqueue_checked.priority, 0),
            coalesce(enqueue_checked.run_at, now()), coalesce(enqueue_checked.max_attempts, 10),
            pkey, CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
            ikey, nullif(enqueue_checked.timeout_ms, 0),
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

-- leader_busy (0012) with its operators and collation named: inlined into enqueue's common job,
-- its body is read on the caller's search_path. The same keys and results.
CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.leader_busy(channel text, queue text, shard integer)
RETURNS boolean
LANGUAGE sql VOLATILE AS $f$
  SELECT pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtextextended(
           (channel OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) queue
            OPERATOR(pg_catalog.||) CASE WHEN shard OPERATOR(pg_catalog.>) 0
                                         THEN '#' OPERATOR(pg_catalog.||) shard::pg_catalog.text
                                         ELSE '' END) COLLATE pg_catalog."C", 0))
     AND pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtextextended(
           (channel OPERATOR(pg_catalog.||) '/*'
            OPERATOR(pg_catalog.||) CASE WHEN shard OPERATOR(pg_catalog.>) 0
                                         THEN '#' OPERATOR(pg_catalog.||) shard::pg_catalog.text
                                         ELSE '' END) COLLATE pg_catalog."C", 0))
$f$;

-- shard_of (0016) with its collation named too: enqueue's common job inlines it on the caller's
-- search_path. The same shards.
CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.shard_of(partition_key text, shards integer)
RETURNS integer
LANGUAGE sql VOLATILE AS $f$
  SELECT CASE
    WHEN shards IS NULL OR shards OPERATOR(pg_catalog.<=) 1 THEN 0
    WHEN partition_key IS NULL THEN
      pg_catalog.floor(pg_catalog.random() OPERATOR(pg_catalog.*)
                       shards::pg_catalog.float8)::pg_catalog.int4
    ELSE (((pg_catalog.hashtextextended(partition_key COLLATE pg_catalog."C", 0)
            OPERATOR(pg_catalog.%) shards::pg_catalog.int8)
           OPERATOR(pg_catalog.+) shards::pg_catalog.int8)
          OPERATOR(pg_catalog.%) shards::pg_catalog.int8)::pg_catalog.int4
  END
$f$;

-- name_ok (0014) with its operators and collation named: common_job_ok inlines it on the
-- caller's search_path. The same rule.
CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.name_ok(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $f$
  SELECT name IS NOT NULL
     AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.>=) 1
     AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 64
     AND name COLLATE pg_catalog."C" OPERATOR(pg_catalog.~) '^[A-Za-z0-9][-A-Za-z0-9_.:]*$'
$f$;

-- Whether a job without a partition key or an idempotency key passes every check of enqueue
-- (name_ok for its queue and type, the payload limit, the ranges; a NULL option passes, as it
-- takes its default). Plain SQL with every operator, type and collation named, inlined into
-- enqueue's common job. (Kept out of enqueue's own text: a function whose text is long has its
-- catalog row compressed, defaults included, and every call that leaves arguments out
-- decompressed them: 10,000 instructions a call.)
CREATE FUNCTION _BATON_SCHEMA_.common_job_ok(queue text, type text, payload jsonb, priority int,
                                             max_attempts int, timeout_ms int)
RETURNS boolean
LANGUAGE sql STABLE AS $f$
  SELECT _BATON_SCHEMA_.name_ok(queue) AND _BATON_SCHEMA_.name_ok(type)
     AND (pg_catalog.octet_length(coalesce(payload, '{}')::pg_catalog.text)
            OPERATOR(pg_catalog.>) _BATON_SCHEMA_.max_payload_bytes()
          OR priority OPERATOR(pg_catalog.<) -32768 OR priority OPERATOR(pg_catalog.>) 32767
          OR max_attempts OPERATOR(pg_catalog.<) 1 OR max_attempts OPERATOR(pg_catalog.>) 1000
          OR timeout_ms OPERATOR(pg_catalog.<) 0
          OR timeout_ms OPERATOR(pg_catalog.>) 2000000000) IS NOT TRUE
$f$;

-- The common job as 0017 inserted it: the same row, shard and wake keys. Nothing in it is
-- looked up on the caller's search_path.
CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.enqueue(
    queue text, type text, payload jsonb DEFAULT '{}', priority int DEFAULT 0,
    run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 10, partition_key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL, timeout_ms int DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $f$
#variable_conflict use_column
DECLARE
  new_id bigint;
  wake boolean;
BEGIN
  IF partition_key IS NULL AND idempotency_key IS NULL
     AND _BATON_SCHEMA_.common_job_ok(queue, type, payload, priority, max_attempts,
                                      timeout_ms) THEN
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          timeout_ms, shard)
    VALUES (enqueue.queue, enqueue.type, coalesce(enqueue.payload, '{}'),
            coalesce(enqueue.priority, 0), coalesce(enqueue.run_at, pg_catalog.now()),
            coalesce(enqueue.max_attempts, 10),
            CASE WHEN enqueue.timeout_ms OPERATOR(pg_catalog.=) 0 THEN NULL
                 ELSE enqueue.timeout_ms END,
            _BATON_SCHEMA_.shard_of(NULL, _BATON_SCHEMA_.shard_count_constant()))
    RETURNING j.id,
              NOT _BATON_SCHEMA_.leader_busy(_BATON_CHANNEL_::pg_catalog.text, j.queue, j.shard)
      INTO new_id, wake;
    IF wake THEN
      PERFORM pg_catalog.pg_notify(_BATON_CHANNEL_::pg_catalog.text, enqueue.queue);
    END IF;
    RETURN new_id;
  END IF;
  RETURN _BATON_SCHEMA_.enqueue_checked(queue, type, payload, priority, run_at, max_attempts,
                                        partition_key, idempotency_key, timeout_ms);
END
$f$;

$functions$;
BEGIN
  EXECUTE replace(replace(functions, '_BATON_CHANNEL_', quote_literal(current_schema() || '_jobs')),
                  '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;
