-- baton's views become security barriers. An operator may grant a dashboard's role SELECT on
-- queue_stats and recent_failures and nothing else, so that it sees counts and recent failures
-- but no payloads and no older history. Without a barrier PostgreSQL may run a condition of the
-- reader's query before the view's own, as part of the same scan: a function of the reader's,
-- declared cheap, then sees every row of the tables under the view and may raise or record it.
-- So it did with recent_failures: a reader read every dead job older than the view's day, with
-- its error and reason (the test
-- HostileRoles.AReaderOfTheViewsSeesNoRowTheyLeaveOutThroughAFunctionOfItsOwn).
--
-- With security_barrier the view's own conditions run first; a reader's condition is run before
-- them only if every function in it is LEAKPROOF (the built-in comparisons of text and numbers
-- are, so a filter on a queue still reaches the scan and its index).
--
-- The option alone does not protect a view that is a UNION ALL: PostgreSQL 15 merges such a
-- view's branches into the query that reads it and pushes the reader's conditions into each
-- branch, barrier or not (with the option set alone, the test's reader still read the old dead
-- jobs). So recent_failures reads its union from a subquery, the same rows and columns, and the
-- barrier is the view's, above the union.
-- CREATE OR REPLACE keeps the view itself: its owner, grants, comment and the views over it;
-- the options a deployment set on it are kept too (below).
--
-- What a barrier does not hide: that rows the view leaves out exist, and how many (EXPLAIN
-- ANALYZE counts the rows its filter removed; a query's time grows with them). A reader who may
-- not learn even that needs a SECURITY DEFINER function of the deployment's own instead.
--
-- queue_stats showed nothing it leaves out (every queue is a group of it) and takes the barrier
-- too, so that every view of the schema is one.

ALTER VIEW queue_stats SET (security_barrier = true);

-- CREATE OR REPLACE VIEW sets the view's options to the ones it names, so the options the view
-- has are read first and set again with the barrier.
DO $$
DECLARE
  kept text;
BEGIN
  SELECT pg_catalog.string_agg(pg_catalog.format('%I = %L', o.option_name, o.option_value), ', ')
    INTO kept
    FROM pg_catalog.pg_class c, pg_catalog.pg_options_to_table(c.reloptions) o
   WHERE c.oid = 'recent_failures'::pg_catalog.regclass AND o.option_name <> 'security_barrier';

  CREATE OR REPLACE VIEW recent_failures AS
  SELECT f.id, f.queue, f.type, f.attempts, f.max_attempts, f.last_error, f.next_run_at,
         f.status
    FROM (SELECT id, queue, type, attempts, max_attempts::integer AS max_attempts, last_error,
                 run_at AS next_run_at, 'retrying' AS status
            FROM jobs WHERE last_error IS NOT NULL
          UNION ALL
          SELECT id, queue, type, attempts, max_attempts, last_error, NULL, 'dead: ' || reason
            FROM dead_jobs WHERE died_at > now() - interval '1 day') AS f;

  EXECUTE 'ALTER VIEW recent_failures SET (security_barrier = true'
          || COALESCE(', ' || kept, '') || ')';
END
$$;
