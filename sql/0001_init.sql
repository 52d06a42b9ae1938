-- baton schema, version 1. Runs with search_path set to baton's schema, so names are unqualified.
-- Every time in these tables comes from the database clock (now(), clock_timestamp()).

-- The leader lock row, modeled on Spring Integration's INT_LOCK (lock_key, region, client_id,
-- created_date), extended with a fencing epoch and a lease measured on the database clock.
CREATE TABLE locks (
  lock_key     text        NOT NULL,
  region       text        NOT NULL,
  client_id    text        NOT NULL,
  created_date timestamptz NOT NULL DEFAULT now(),
  epoch        bigint      NOT NULL DEFAULT 0,
  renewed_at   timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL DEFAULT now(),
  holder_pid   integer,
  holder_host  text,
  PRIMARY KEY (lock_key, region)
);

-- The live queue. A job leaves it only into job_history or dead_jobs, in one transaction.
CREATE TABLE jobs (
  id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue            text        NOT NULL,
  partition        integer,
  partition_key    text,
  type             text        NOT NULL,
  payload          jsonb       NOT NULL DEFAULT '{}',
  priority         smallint    NOT NULL DEFAULT 0,
  state            text        NOT NULL DEFAULT 'available'
                               CHECK (state IN ('available', 'running')),
  run_at           timestamptz NOT NULL DEFAULT now(),
  attempts         integer     NOT NULL DEFAULT 0,
  max_attempts     integer     NOT NULL DEFAULT 10 CHECK (max_attempts BETWEEN 1 AND 1000),
  timeout_ms       integer     CHECK (timeout_ms IS NULL OR timeout_ms > 0),
  created_at       timestamptz NOT NULL DEFAULT now(),
  first_started_at timestamptz,
  claimed_at       timestamptz,
  claimed_by       text,
  claimed_epoch    bigint,
  last_error       text,
  errors           jsonb       NOT NULL DEFAULT '[]',
  idempotency_key  text
);
-- Serves the claim: only available rows, in claim order.
CREATE INDEX jobs_claim_idx ON jobs (priority, run_at, id) WHERE state = 'available';
-- Serves the rescue of running jobs of older epochs.
CREATE INDEX jobs_running_idx ON jobs (claimed_epoch) WHERE state = 'running';
CREATE UNIQUE INDEX jobs_idempotency_idx ON jobs (queue, idempotency_key)
  WHERE idempotency_key IS NOT NULL;

-- Finished jobs with their timings: the audit trail.
CREATE TABLE job_history (
  id               bigint      PRIMARY KEY,
  queue            text        NOT NULL,
  partition_key    text,
  type             text        NOT NULL,
  payload          jsonb       NOT NULL,
  priority         smallint    NOT NULL,
  attempts         integer     NOT NULL,
  created_at       timestamptz NOT NULL,
  run_at           timestamptz NOT NULL,
  first_started_at timestamptz,
  started_at       timestamptz,
  finished_at      timestamptz NOT NULL DEFAULT now(),
  run_seconds      double precision,
  node             text,
  epoch            bigint,
  outcome          text        NOT NULL
);
CREATE INDEX job_history_finished_idx ON job_history (finished_at);

-- Jobs that exhausted their attempts or can never run, with their error history.
CREATE TABLE dead_jobs (
  id               bigint      PRIMARY KEY,
  queue            text        NOT NULL,
  partition_key    text,
  type             text        NOT NULL,
  payload          jsonb       NOT NULL,
  priority         smallint    NOT NULL,
  attempts         integer     NOT NULL,
  max_attempts     integer     NOT NULL,
  created_at       timestamptz NOT NULL,
  first_started_at timestamptz,
  died_at          timestamptz NOT NULL DEFAULT now(),
  node             text,
  epoch            bigint,
  reason           text        NOT NULL,
  last_error       text,
  errors           jsonb       NOT NULL DEFAULT '[]'
);
CREATE INDEX dead_jobs_queue_idx ON dead_jobs (queue, died_at);

-- One row per node, refreshed by its election loop.
CREATE TABLE nodes (
  node_id      text        PRIMARY KEY,
  host         text        NOT NULL,
  pid          integer     NOT NULL,
  version      text        NOT NULL,
  started_at   timestamptz NOT NULL DEFAULT now(),
  last_seen    timestamptz NOT NULL DEFAULT now(),
  role         text        NOT NULL,
  epoch        bigint,
  metrics_addr text
);
