-- The least a function API that keeps producers off the jobs table costs: a SECURITY DEFINER
-- PL/pgSQL function with a fixed search_path that inserts the row and checks nothing. Between it
-- and a plain INSERT is the price of the shape; between baton's enqueue and it, baton's checks
-- and wake-up. Created in the schema named by the psql variable `schema`:
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
