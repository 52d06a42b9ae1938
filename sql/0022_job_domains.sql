-- The jobs table's three rules on its values (a state is 'available' or 'running', max_attempts is
-- 1 to 1,000, a timeout is positive) become domains instead of CHECK constraints (issue 16's idle
-- latency and producers). PostgreSQL rebuilds a table's CHECK constraints from their stored text
-- for every statement that inserts or updates a row (stringToNode, then the expression planner),
-- and checks all three on every row it writes, whatever columns changed. A domain's rule is read
-- and planned once a session (the type cache), and checked only where a value of it is written.
-- Measured on the server, enqueue's INSERT and the claim's UPDATE each with its commit, the two
-- tables interleaved in one loop (docs/performance-log.md): 13-17 us less per INSERT, 15-19 us
-- less per claim, of 34-60 and 75-117 us.
--
-- The rules and the values they allow are the same: a row that breaks one is refused with
-- SQLSTATE 23514 (check_violation), as before, now naming the domain's constraint. Every role
-- that could write a row before still can: writing a value of a domain needs no privilege on it.
--
-- The table is not rewritten: the CHECK constraints go and the columns take domains without
-- rules, in one statement (binary compatible with their types, so the rows and the indexes on
-- other columns stay as they are; PostgreSQL builds again the three indexes whose predicate
-- names state); then the rules are added to the domains and checked against the rows, one read
-- of the table each. The jobs table is locked against every use from the first statement to the
-- commit, so no row can be written unchecked in between. The columns' statistics, which a change
-- of type drops, are gathered again at the end. Measured: 1.7 s at 1M jobs.
--
-- PostgreSQL does not change a column's type under a view, so the two views over jobs first
-- take bodies that name none of the three columns, with the same columns and types, and then
-- their own again: each keeps its identity, owner, grants (column grants too), options,
-- comments and the views built over it. Only roles of the owner's may use the domains: a role
-- that could use one could declare functions and operators over it, found before the built-in
-- ones by a query that compares the column on a path where that role may create objects.

CREATE DOMAIN job_state AS text;
CREATE DOMAIN job_max_attempts AS integer;
CREATE DOMAIN job_timeout_ms AS integer;
REVOKE USAGE ON DOMAIN job_state, job_max_attempts, job_timeout_ms FROM PUBLIC;

CREATE OR REPLACE VIEW queue_stats AS
SELECT queue, count(*) AS available, count(*) AS scheduled, count(*) AS running,
       NULL::numeric AS oldest_available_seconds
  FROM jobs GROUP BY queue;

CREATE OR REPLACE VIEW recent_failures AS
SELECT id, queue, type, attempts, NULL::integer AS max_attempts, last_error,
       run_at AS next_run_at, 'retrying' AS status
  FROM jobs WHERE last_error IS NOT NULL
UNION ALL
SELECT id, queue, type, attempts, max_attempts, last_error, NULL, 'dead: ' || reason
  FROM dead_jobs WHERE died_at > now() - interval '1 day';

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check,
                 DROP CONSTRAINT jobs_max_attempts_check,
                 DROP CONSTRAINT jobs_timeout_ms_check,
                 ALTER COLUMN state TYPE job_state,
                 ALTER COLUMN max_attempts TYPE job_max_attempts,
                 ALTER COLUMN timeout_ms TYPE job_timeout_ms;

ALTER DOMAIN job_state ADD CONSTRAINT job_state_check
  CHECK (VALUE IN ('available', 'running')) NOT VALID;
ALTER DOMAIN job_max_attempts ADD CONSTRAINT job_max_attempts_check
  CHECK (VALUE >= 1 AND VALUE <= 1000) NOT VALID;
ALTER DOMAIN job_timeout_ms ADD CONSTRAINT job_timeout_ms_check CHECK (VALUE > 0) NOT VALID;
ALTER DOMAIN job_state VALIDATE CONSTRAINT job_state_check;
ALTER DOMAIN job_max_attempts VALIDATE CONSTRAINT job_max_attempts_check;
ALTER DOMAIN job_timeout_ms VALIDATE CONSTRAINT job_timeout_ms_check;

-- As 0004 created them (their columns keep their types: text and integer).
CREATE OR REPLACE VIEW queue_stats AS
SELECT queue,
       count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS available,
       count(*) FILTER (WHERE state = 'available' AND run_at > now()) AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running,
       extract(epoch FROM now() - min(run_at) FILTER (
         WHERE state = 'available' AND run_at <= now())) AS oldest_available_seconds
  FROM jobs GROUP BY queue;

CREATE OR REPLACE VIEW recent_failures AS
SELECT id, queue, type, attempts, max_attempts::integer AS max_attempts, last_error,
       run_at AS next_run_at, 'retrying' AS status
  FROM jobs WHERE last_error IS NOT NULL
UNION ALL
SELECT id, queue, type, attempts, max_attempts, last_error, NULL, 'dead: ' || reason
  FROM dead_jobs WHERE died_at > now() - interval '1 day';

ANALYZE jobs (state, max_attempts, timeout_ms);
