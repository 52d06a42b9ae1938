-- Per-queue operator state: a paused queue keeps its jobs but the leader claims none of them.
CREATE TABLE queue_state (
  queue      text        PRIMARY KEY,
  paused     boolean     NOT NULL DEFAULT false,
  updated_at timestamptz NOT NULL DEFAULT now(),
  updated_by text
);
