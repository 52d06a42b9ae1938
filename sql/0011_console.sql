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
