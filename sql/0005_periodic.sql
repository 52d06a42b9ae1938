-- Periodic schedules, declared in code on the nodes. The leader enqueues each due tick as an
-- ordinary job, claiming the tick by moving last_tick forward in the same transaction as the
-- enqueue: two leaders (or a leader and its successor) can never both enqueue one tick.
CREATE TABLE periodic_schedules (
  name             text        PRIMARY KEY,
  spec             text        NOT NULL,  -- "every 60s" or "<cron> <time zone>"
  type             text        NOT NULL,
  queue            text        NOT NULL,
  missed           text        NOT NULL,  -- latest | all | skip
  active           boolean     NOT NULL DEFAULT true,  -- false once no leader declares it
  last_tick        timestamptz,           -- the newest tick handled (enqueued or skipped)
  last_enqueued_at timestamptz,
  last_job_id      bigint,
  updated_at       timestamptz NOT NULL DEFAULT now()
);
