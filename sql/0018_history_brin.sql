-- job_history's finished_at index becomes a BRIN index (issue 16's drain). Every finished job
-- added an entry to the B-tree, in the completion's statement; a BRIN index keeps one summary
-- (the least and greatest finished_at) per 32 pages of the table. A row added to pages not
-- summarized yet costs it nothing; in a summarized range, only a row later than the range's
-- greatest time changes the summary, and a completion's rows all carry one time. Rows are added
-- in finished_at order, so the summaries are narrow, and the queries by time (the pruner's,
-- `batonctl stats`, the console's series) read only the pages of their window, and the pages not
-- summarized yet: those written since the pruner's last tick, which summarizes them, or the last
-- vacuum. (Not autosummarize: it asks autovacuum for one summary per 32 pages written, and beyond
-- 256 requests a minute, 8,000 rows a second, the server logs a line for each request it drops.)
--
-- A summary only ever widens. Once the pruner has deleted a range's rows and a vacuum has freed
-- its pages, new rows fill them, and the range would keep its oldest time for ever: every prune
-- would read it. So prune_history records the ranges it deletes from, and summarize_history (at
-- the start of each pruner tick) summarizes them again from what is left in them: once a tick
-- after the delete, when the deleted rows are gone from every snapshot but a long transaction's
-- (or a standby's, through hot_standby_feedback, or a replication slot's), and again an hour
-- after it. It also summarizes again a few ranges more each tick, in a sweep through the table,
-- for a range whose deleted rows some snapshot could still see an hour later.

-- The new index is built before the old one goes: the build lets readers of history on, and the
-- drop's exclusive lock lasts only to the migration's commit.
CREATE INDEX job_history_finished_brin ON job_history USING brin (finished_at)
  WITH (pages_per_range = 32);
DROP INDEX job_history_finished_idx;
ALTER INDEX job_history_finished_brin RENAME TO job_history_finished_idx;

-- Ranges (their first block) that prune_history deleted rows from, to be summarized again: at
-- the next tick (then `again` is set) and an hour after the last delete in them (then the row
-- goes). Only the two functions below (the owner's) touch it.
CREATE TABLE history_pruned_ranges (
  block     bigint      PRIMARY KEY,
  pruned_at timestamptz NOT NULL DEFAULT now(),
  again     boolean     NOT NULL DEFAULT false
);

DO $migration$
DECLARE
  functions text := $functions$

-- Deletes up to p_batch (1 to 100,000) history rows finished more than p_retention_ms ago, and
-- records the index ranges they were in. Returns how many it deleted. Runs as the owner: the
-- record is the owner's.
CREATE FUNCTION _BATON_SCHEMA_.prune_history(p_retention_ms bigint, p_batch integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  cutoff timestamptz;
  per bigint;
  victims tid[];
  n bigint;
BEGIN
  IF p_retention_ms IS NULL OR p_retention_ms < 0 OR p_batch IS NULL OR p_batch < 1
     OR p_batch > 100000 THEN
    RAISE EXCEPTION 'prune_history: the retention must be 0 ms or more and the batch 1 to 100000, not % and %',
      p_retention_ms, p_batch USING ERRCODE = '22023';
  END IF;
  cutoff := now() - p_retention_ms * interval '1 millisecond';
  -- (No row locks: a row that another pruner deletes meanwhile keeps its address until this
  -- transaction ends, and the DELETE below skips it.)
  SELECT pg_catalog.array_agg(h.ctid) INTO victims
    FROM (SELECT ctid FROM job_history WHERE finished_at < cutoff LIMIT p_batch) h;
  IF victims IS NULL THEN
    RETURN 0;
  END IF;
  per := _BATON_SCHEMA_.history_pages_per_range();
  INSERT INTO history_pruned_ranges (block)
  SELECT DISTINCT ((v::text::point)[0])::bigint / per * per FROM pg_catalog.unnest(victims) v
  ON CONFLICT (block) DO UPDATE SET pruned_at = now(), again = false;
  DELETE FROM job_history WHERE ctid = ANY (victims) AND finished_at < cutoff;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$f$;

CREATE FUNCTION _BATON_SCHEMA_.history_pages_per_range() RETURNS bigint
LANGUAGE sql STABLE SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
  SELECT coalesce((SELECT o.option_value::bigint
                     FROM pg_catalog.pg_options_to_table(c.reloptions) o
                    WHERE o.option_name = 'pages_per_range'), 128)
    FROM pg_catalog.pg_class c WHERE c.oid = 'job_history_finished_idx'::regclass
$f$;

-- Summarizes again the ranges prune_history recorded (from the rows left in them: those not
-- summarized since, and those whose last delete is an hour old, which it then forgets), then
-- every range not summarized yet (the pages written since), then up to p_ranges (at most 1,024)
-- ranges
-- more from block p_from (a negative p_from: a block chosen at random). Returns the block for the
-- next call to go on from (0 after the table's end), or NULL when another session held history
-- (a vacuum, for one): then the recorded ranges wait for the next call.
CREATE FUNCTION _BATON_SCHEMA_.summarize_history(p_from bigint, p_ranges integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp
SET lock_timeout = '100ms' AS $f$
DECLARE
  idx regclass := 'job_history_finished_idx'::regclass;
  per bigint := _BATON_SCHEMA_.history_pages_per_range();
  pages bigint;
  block bigint;
BEGIN
  FOR block IN
      WITH hour_old AS (
        DELETE FROM history_pruned_ranges r WHERE r.again AND r.pruned_at < now() - interval '1 hour'
        RETURNING r.block),
      fresh AS (
        UPDATE history_pruned_ranges r SET again = true WHERE NOT r.again RETURNING r.block)
      SELECT h.block FROM hour_old h UNION SELECT f.block FROM fresh f
  LOOP
    PERFORM pg_catalog.brin_desummarize_range(idx, block);
    PERFORM pg_catalog.brin_summarize_range(idx, block);
  END LOOP;
  PERFORM pg_catalog.brin_summarize_new_values(idx);
  pages := pg_catalog.pg_relation_size('job_history'::regclass)
           / pg_catalog.current_setting('block_size')::bigint;
  block := CASE WHEN p_from < 0 THEN pg_catalog.floor(pg_catalog.random() * pages)::bigint
                WHEN p_from < pages THEN p_from ELSE 0 END / per * per;
  FOR i IN 1 .. least(greatest(coalesce(p_ranges, 0), 0), 1024) LOOP
    EXIT WHEN block >= pages;
    PERFORM pg_catalog.brin_desummarize_range(idx, block);
    PERFORM pg_catalog.brin_summarize_range(idx, block);
    block := block + per;
  END LOOP;
  RETURN CASE WHEN block >= pages THEN 0 ELSE block END;
EXCEPTION WHEN lock_not_available THEN
  RETURN NULL;
END
$f$;

$functions$;
BEGIN
  EXECUTE replace(functions, '_BATON_SCHEMA_', quote_ident(current_schema()));
  EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM PUBLIC', current_schema());
END
$migration$;

-- Roles that prune history (nodes: they may delete from it) call the two functions, so that an
-- upgrade keeps a cluster under restricted roles pruning. The grants for new deployments are in
-- docs/security.md.
DO $grant$
DECLARE
  g record;
BEGIN
  FOR g IN SELECT DISTINCT a.grantee::regrole::text AS role
             FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
            WHERE c.oid = 'job_history'::regclass AND a.grantee <> 0
              AND a.grantee <> c.relowner AND a.privilege_type = 'DELETE'
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION prune_history(bigint, integer), '
                   'summarize_history(bigint, integer) TO %s', g.role);
  END LOOP;
END
$grant$;
