-- The rescuer looks for hung jobs (running past their timeout_ms) every 2 s. It read every
-- running job of its group through jobs_running_idx to find the few that have a timeout: with a
-- completer behind (200k outcomes unwritten under 32 producers, bench/producer_overload) and the
-- dead entries of every job run since the last vacuum, one such scan ran for tens of seconds,
-- and its snapshot kept the dead rows that every claim and completion then stepped over. This
-- index holds only the running jobs that have a timeout: a job without one adds no entry.
CREATE INDEX jobs_timed_running_idx ON jobs (claim_group, claimed_at)
  WHERE state = 'running' AND timeout_ms IS NOT NULL;
