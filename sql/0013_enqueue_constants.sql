-- A cheaper single-job enqueue, for many producers at once (issue 16's 32-producer figure).
--
-- * The settings that enqueue reads (max_payload_bytes, shards) become constants: two SQL
--   functions, max_payload_bytes() and shard_count_constant(), whose bodies a trigger on
--   `settings` rewrites after every change. A function of a
--   constant is inlined into each caller's cached plan, and PostgreSQL replans the callers when
--   it is replaced, in every session, at its next transaction. Reading the table instead ran a
--   query per enqueue (a plan check, locks, an index scan), about a tenth of the call, and every
--   producer pinned the same buffer. The trigger locks the table against other writers first,
--   so two writers at once end in a deadlock error for one of them, never in a stale body, and
--   it refuses to run under a snapshot older than its statement (REPEATABLE READ and above).
-- * Only a job without a partition key takes the constant count: a stale one puts it on a shard
--   that no longer exists (the strays sweep moves it) or spreads it a little less. A job with a
--   key, and every other caller, keep shard_count(), which reads the table: a producer in a long
--   transaction must not place an ordered partition under a count that set_shards has changed
--   meanwhile.
-- * A job without an idempotency key is inserted without ON CONFLICT: a speculative insertion
--   takes a lock and writes a second WAL record per row, for a key that cannot conflict.

DO $migration$
DECLARE
  functions text := $functions$

CREATE FUNCTION _BATON_SCHEMA_.max_payload_bytes() RETURNS bigint
LANGUAGE sql STABLE AS $f$ SELECT 1048576::bigint $f$;
CREATE FUNCTION _BATON_SCHEMA_.shard_count_constant() RETURNS integer
LANGUAGE sql STABLE AS $f$ SELECT 1 $f$;

-- Rewrites max_payload_bytes() and shard_count_constant() from the settings rows.
CREATE FUNCTION _BATON_SCHEMA_.settings_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  limit_text text;
  shards_text text;
  limit_bytes bigint;
  shards integer;
  bad boolean := false;
BEGIN
  LOCK TABLE _BATON_SCHEMA_.settings IN SHARE ROW EXCLUSIVE MODE;
  IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION USING ERRCODE = '0A000',
      MESSAGE = 'baton settings are changed in READ COMMITTED transactions only',
      HINT = 'a transaction''s older snapshot could miss another writer''s change; run the '
             'change in its own transaction (the default isolation)';
  END IF;
  SELECT max(s.value) FILTER (WHERE s.key = 'max_payload_bytes'),
         max(s.value) FILTER (WHERE s.key = 'shards')
    INTO limit_text, shards_text
    FROM _BATON_SCHEMA_.settings s WHERE s.key IN ('max_payload_bytes', 'shards');
  BEGIN
    limit_bytes := limit_text::bigint;
    shards := shards_text::integer;
  EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range THEN
    bad := true;
  END;
  IF bad OR limit_bytes < 0 OR shards NOT BETWEEN 1 AND 64 THEN
    RAISE EXCEPTION USING ERRCODE = 'BT003',
      MESSAGE = pg_catalog.format('settings: max_payload_bytes %s or shards %s is not allowed',
                                  coalesce(pg_catalog.quote_literal(limit_text), 'NULL'),
                                  coalesce(pg_catalog.quote_literal(shards_text), 'NULL')),
      HINT = 'max_payload_bytes is a whole number of bytes, 0 or more (no row: no limit); '
             'shards is a whole number in 1..64, set with batonctl shards';
  END IF;
  -- Literals cast to catalog types: the bodies name no operator that a caller's search_path
  -- could resolve. No row: no limit, as when enqueue read the table.
  EXECUTE pg_catalog.format(
    'CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.max_payload_bytes() RETURNS bigint '
    'LANGUAGE sql STABLE AS %L', pg_catalog.format('SELECT %L::pg_catalog.int8', limit_bytes));
  EXECUTE pg_catalog.format(
    'CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.shard_count_constant() RETURNS integer '
    'LANGUAGE sql STABLE AS %L', pg_catalog.format('SELECT %L::pg_catalog.int4', coalesce(shards, 1)));
  RETURN NULL;
END
$f$;

CREATE TRIGGER settings_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
  ON _BATON_SCHEMA_.settings FOR EACH STATEMENT EXECUTE FUNCTION _BATON_SCHEMA_.settings_changed();

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
  new_shard int;
BEGIN
  -- NULL is not the default queue.
  IF NOT _BATON_SCHEMA_.name_ok(q) THEN
    PERFORM _BATON_SCHEMA_.check_name('queue', q);
  END IF;
  IF NOT _BATON_SCHEMA_.name_ok(t) THEN
    PERFORM _BATON_SCHEMA_.check_name('type', t);
  END IF;
  -- Simple expressions (no sub-SELECT): PL/pgSQL evaluates them without the executor.
  problem := _BATON_SCHEMA_.typed_problem(coalesce(payload, '{}'), priority, max_attempts, 0,
                                          timeout_ms, pkey, ikey,
                                          _BATON_SCHEMA_.max_payload_bytes());
  IF problem IS NOT NULL THEN
    PERFORM _BATON_SCHEMA_.raise_problem(problem);
  END IF;
  IF pkey IS NULL THEN
    new_shard := _BATON_SCHEMA_.shard_of(NULL, _BATON_SCHEMA_.shard_count_constant());
  ELSE
    new_shard := _BATON_SCHEMA_.shard_of(pkey, _BATON_SCHEMA_.shard_count());
  END IF;
  IF ikey IS NULL THEN
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          partition_key, partition, timeout_ms, shard)
    VALUES (q, t, coalesce(enqueue.payload, '{}'), coalesce(enqueue.priority, 0),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.max_attempts, 10), pkey,
            CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
            nullif(enqueue.timeout_ms, 0), new_shard)
    RETURNING j.id INTO new_id;
  ELSE
    INSERT INTO _BATON_SCHEMA_.jobs AS j (queue, type, payload, priority, run_at, max_attempts,
                                          partition_key, partition, idempotency_key, timeout_ms,
                                          shard)
    VALUES (q, t, coalesce(enqueue.payload, '{}'), coalesce(enqueue.priority, 0),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.max_attempts, 10), pkey,
            CASE WHEN pkey IS NOT NULL THEN _BATON_SCHEMA_.job_partition(q, pkey) END,
            ikey, nullif(enqueue.timeout_ms, 0), new_shard)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
      SELECT j.id INTO new_id FROM _BATON_SCHEMA_.jobs j
       WHERE j.queue = q AND j.idempotency_key = ikey;
      RETURN new_id;
    END IF;
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

-- The functions' bodies from the rows as they are now.
UPDATE settings SET value = value WHERE key = 'max_payload_bytes';
