-- shard_of and partition_of are plain SQL, inlined into the statement that calls them, where
-- their operators are looked up on that statement's search_path. pg_catalog has no
-- `bigint % integer` and no `float8 * integer`: it matches them only through a cast, and an
-- exact match found on the path wins over a cast. A role that may create objects in a schema on
-- a caller's path (public, in databases made before PostgreSQL 15) could plant one, and a caller
-- that reaches these functions outside baton's own definer functions (the C++ Client and Admin
-- set their path; a user's own SQL may not) would run it. Here every operator is pg_catalog's,
-- named as such, on the types it takes: the same results, from any search_path.

DO $migration$
DECLARE
  functions text := $functions$

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.shard_of(partition_key text, shards integer)
RETURNS integer
LANGUAGE sql VOLATILE AS $f$
  SELECT CASE
    WHEN shards IS NULL OR shards OPERATOR(pg_catalog.<=) 1 THEN 0
    WHEN partition_key IS NULL THEN
      pg_catalog.floor(pg_catalog.random() OPERATOR(pg_catalog.*)
                       shards::pg_catalog.float8)::pg_catalog.int4
    ELSE (((pg_catalog.hashtextextended(partition_key COLLATE "C", 0)
            OPERATOR(pg_catalog.%) shards::pg_catalog.int8)
           OPERATOR(pg_catalog.+) shards::pg_catalog.int8)
          OPERATOR(pg_catalog.%) shards::pg_catalog.int8)::pg_catalog.int4
  END
$f$;

CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.partition_of(p_key text, partitions integer)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $f$
  SELECT (((pg_catalog.hashtextextended(p_key, 0) OPERATOR(pg_catalog.%) partitions::pg_catalog.int8)
           OPERATOR(pg_catalog.+) partitions::pg_catalog.int8)
          OPERATOR(pg_catalog.%) partitions::pg_catalog.int8)::pg_catalog.int4
$f$;

$functions$;
BEGIN
  EXECUTE replace(functions, '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;
