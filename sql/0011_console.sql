-- What the console shows that no table kept until now: the leadership timeline. Every grant (in
-- the grant's own transaction, so a leader's epoch is never without its row) and every release a
-- leader could still write. A leader that died or lost its database writes nothing; the grant
-- that follows names the node it replaced and how long ago that node last renewed.
CREATE TABLE leadership_events (
  id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at             timestamptz NOT NULL DEFAULT clock_timestamp(),
  lock_key       text        NOT NULL,
  region         text        NOT NULL,
  epoch          bigint      NOT NULL,
  node_id        text        NOT NULL,
  host           text,
  event          text        NOT NULL CHECK (event IN ('granted', 'released')),
  -- granted: first, again (the same node), after_release, lease_expired, session_ended (the
  -- holder's session ended before its lease did: a killed process); released: why.
  reason         text        NOT NULL,
  previous_node  text,
  previous_epoch bigint,
  previous_renewed_s_ago double precision
);
CREATE INDEX leadership_events_at_idx ON leadership_events (at);


-- Roles that already write the lock row (the nodes') write its timeline, and roles that read it
-- (operators') read the timeline, so that an upgrade keeps a cluster under restricted roles
-- leading. The grants for new deployments are in docs/security.md.
DO $grant$
DECLARE
  g record;
BEGIN
  FOR g IN SELECT DISTINCT a.grantee::regrole::text AS role, a.privilege_type AS privilege
             FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
            WHERE c.oid = 'locks'::regclass AND a.grantee <> 0 AND a.grantee <> c.relowner
              AND a.privilege_type IN ('SELECT', 'INSERT') LOOP
    IF g.privilege = 'INSERT' THEN
      EXECUTE format('GRANT SELECT, INSERT, DELETE ON leadership_events TO %s', g.role);
    ELSE
      EXECUTE format('GRANT SELECT ON leadership_events TO %s', g.role);
    END IF;
  END LOOP;
END
$grant$;

-- A finished job keeps the errors of its earlier attempts (NULL when it had none), so that its
-- story stays whole after it completes.
ALTER TABLE job_history ADD COLUMN errors jsonb;

-- baton.cancel() of a job that never ran keeps its earlier attempts' errors too (as 0009 wrote
-- it, but for the errors column).
DO $migration$
DECLARE
  functions text := $functions$
CREATE OR REPLACE FUNCTION _BATON_SCHEMA_.cancel(p_id bigint) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = _BATON_SCHEMA_, pg_temp AS $f$
DECLARE
  j _BATON_SCHEMA_.jobs%ROWTYPE;
BEGIN
  SELECT * INTO j FROM _BATON_SCHEMA_.jobs WHERE id = p_id FOR UPDATE;
  IF NOT FOUND THEN
    IF EXISTS (SELECT 1 FROM _BATON_SCHEMA_.job_history WHERE id = p_id)
       OR EXISTS (SELECT 1 FROM _BATON_SCHEMA_.dead_jobs WHERE id = p_id) THEN
      RETURN 'finished';
    END IF;
    RETURN 'not_found';
  END IF;
  IF j.state = 'running' THEN
    UPDATE _BATON_SCHEMA_.jobs SET cancel_requested_at = coalesce(cancel_requested_at, now())
     WHERE id = p_id;
    PERFORM pg_notify(current_schema() || '_jobs', 'cancel ' || p_id);
    RETURN 'cancelling';
  END IF;
  DELETE FROM _BATON_SCHEMA_.jobs WHERE id = p_id;
  INSERT INTO _BATON_SCHEMA_.job_history (id, queue, partition_key, type, payload, priority,
                                          attempts, created_at, run_at, first_started_at,
                                          started_at, finished_at, run_seconds, node, epoch,
                                          outcome, idempotency_key, last_error, errors)
  VALUES (j.id, j.queue, j.partition_key, j.type, j.payload, j.priority, j.attempts,
          j.created_at, j.run_at, j.first_started_at, NULL, now(), NULL, NULL, NULL, 'cancelled',
          j.idempotency_key, j.last_error, nullif(j.errors, '[]'));
  -- The next job of an ordered partition may run now.
  IF j.partition IS NOT NULL THEN
    PERFORM pg_notify(current_schema() || '_jobs', j.queue);
  END IF;
  RETURN 'cancelled';
END
$f$;
$functions$;
BEGIN
  EXECUTE replace(functions, '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;
