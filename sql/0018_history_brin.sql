-- job_history's finished_at index becomes a BRIN index (issue 16's drain). Every finished job
-- added an entry to the B-tree, in the completion's statement; a BRIN index keeps one summary
-- (the least and greatest finished_at) per 32 pages of the table, and a row added to pages not
-- summarized yet costs it nothing. Rows are added in finished_at order, so the summaries are
-- narrow, and the queries by time (the pruner's, `batonctl stats`, the console's series) read
-- only the pages of their window, and the pages not summarized yet: those written since the
-- pruner's last tick, which summarizes them, or the last vacuum. (Not autosummarize: it asks
-- autovacuum for one summary per 32 pages written, and beyond 256 requests a minute, 8,000 rows
-- a second, the server logs a line for each request it drops.)
--
-- A summary only ever widens. Once the pruner has deleted a range's rows and a vacuum has freed
-- its pages, new rows fill them, and the range would keep its oldest time for ever: every prune
-- would read it. So the pruner deletes through prune_history, which first marks the ranges of the
-- rows it deletes as not summarized, and summarize_history (called by the pruner at each tick)
-- summarizes them again from what is left in them, plus a few more ranges in a rolling sweep, for
-- a range summarized while a long transaction could still see rows since deleted.

DROP INDEX job_history_finished_idx;
CREATE INDEX job_history_finished_idx ON job_history USING brin (finished_at)
  WITH (pages_per_range = 32);

DO $migration$
DECLARE
  functions text := $functions$

-- Deletes up to p_batch history rows finished more than p_retention_ms ago, after marking the
-- index ranges that hold them as not summarized. Returns how many it deleted, or -1 when it could
-- not mark them at once (a vacuum or another summarizing call holds the index): then it deleted
-- nothing, and the next tick tries again. Runs as the owner: only the owner may change summaries.
CREATE FUNCTION _BATON_SCHEMA_.prune_history(p_retention_ms bigint, p_batch integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp
SET lock_timeout = '100ms' AS $f$
DECLARE
  cutoff timestamptz;
  victims tid[];
  n bigint;
BEGIN
  IF p_retention_ms IS NULL OR p_retention_ms < 0 OR p_batch IS NULL OR p_batch < 1 THEN
    RAISE EXCEPTION 'prune_history: the retention must be 0 ms or more and the batch 1 or more, not % and %',
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
  BEGIN
    PERFORM pg_catalog.brin_desummarize_range('job_history_finished_idx'::regclass, r.block)
       FROM (SELECT DISTINCT ((v::text::point)[0])::bigint AS block
               FROM pg_catalog.unnest(victims) v) r;
  EXCEPTION WHEN lock_not_available THEN
    RETURN -1;
  END;
  DELETE FROM job_history WHERE ctid = ANY (victims) AND finished_at < cutoff;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$f$;

-- Summarizes every range of job_history's finished_at index that is not summarized (those
-- written since, and those prune_history marked, from the rows left in them), then summarizes
-- again up to p_ranges ranges from block p_from. Returns the block for the next call to go on
-- from (0 after the table's end), or p_from unchanged when a vacuum or another summarizing call
-- holds the index.
CREATE FUNCTION _BATON_SCHEMA_.summarize_history(p_from bigint, p_ranges integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp
SET lock_timeout = '100ms' AS $f$
DECLARE
  idx regclass := 'job_history_finished_idx'::regclass;
  per bigint;
  pages bigint;
  block bigint;
BEGIN
  SELECT coalesce((SELECT o.option_value::bigint
                     FROM pg_catalog.pg_options_to_table(c.reloptions) o
                    WHERE o.option_name = 'pages_per_range'), 128)
    INTO per FROM pg_catalog.pg_class c WHERE c.oid = idx;
  PERFORM pg_catalog.brin_summarize_new_values(idx);
  pages := pg_catalog.pg_relation_size('job_history'::regclass)
           / pg_catalog.current_setting('block_size')::bigint;
  block := CASE WHEN p_from >= 0 AND p_from < pages THEN p_from / per * per ELSE 0 END;
  FOR i IN 1 .. greatest(coalesce(p_ranges, 0), 0) LOOP
    EXIT WHEN block >= pages;
    PERFORM pg_catalog.brin_desummarize_range(idx, block);
    PERFORM pg_catalog.brin_summarize_range(idx, block);
    block := block + per;
  END LOOP;
  RETURN CASE WHEN block >= pages THEN 0 ELSE block END;
EXCEPTION WHEN lock_not_available THEN
  RETURN p_from;
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
