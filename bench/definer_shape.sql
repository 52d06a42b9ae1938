-- The least a function API that keeps producers off the jobs table costs: a SECURITY DEFINER
-- PL/pgSQL function with a fixed search_path that inserts the row and checks nothing. Between it
-- and a plain INSERT is the price of the shape; between baton's enqueue and it, baton's checks
-- and wake-up. bench_insert_defaults is the same with enqueue's parameters and defaults: a call
-- that leaves arguments out costs their defaults in its parse and plan. Created in the schema
-- named by the psql variable `schema`:
--   psql -v schema=NAME -f bench/definer_shape.sql
SET search_path = :"schema", pg_temp;
CREATE FUNCTION bench_insert(queue text, type text, payload jsonb) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
DECLARE
  new_id bigint;
BEGIN
  INSERT INTO jobs AS j (queue, type, payload)
  VALUES (bench_insert.queue, bench_insert.type, bench_insert.payload)
  RETURNING j.id INTO new_id;
  RETURN new_id;
END
$f$;

CREATE FUNCTION bench_insert_defaults(
    queue text, type text, payload jsonb DEFAULT '{}', priority int DEFAULT 0,
    run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 10, partition_key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL, timeout_ms int DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
DECLARE
  new_id bigint;
BEGIN
  INSERT INTO jobs AS j (queue, type, payload)
  VALUES (bench_insert_defaults.queue, bench_insert_defaults.type, bench_insert_defaults.payload)
  RETURNING j.id INTO new_id;
  RETURN new_id;
END
$f$;
