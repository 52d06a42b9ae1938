-- Saga store: long-running workflow state, saved in the same transaction as the job that
-- changes it. saga_index makes sagas findable by their correlation properties.
CREATE TABLE sagas (
  id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  type         text        NOT NULL,
  data         jsonb       NOT NULL,
  version      integer     NOT NULL DEFAULT 1,
  created_at   timestamptz NOT NULL DEFAULT now(),
  updated_at   timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz  -- completed sagas keep their data until pruned with job history
);
CREATE INDEX sagas_completed_idx ON sagas (completed_at) WHERE completed_at IS NOT NULL;

-- One row per indexed property of a live saga; a value identifies at most one saga of a type.
CREATE TABLE saga_index (
  type     text NOT NULL,
  property text NOT NULL,
  value    text NOT NULL,
  saga_id  uuid NOT NULL REFERENCES sagas (id) ON DELETE CASCADE,
  PRIMARY KEY (type, property, value)
);
CREATE INDEX saga_index_saga_idx ON saga_index (saga_id);
