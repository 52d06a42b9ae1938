-- Ordered queues: a queue with `partitions` set puts each job with a partition_key into
-- partition hash(partition_key) mod partitions; within a partition jobs run one at a time, in
-- enqueue order. The count lives here so that every producer computes the same partition.
ALTER TABLE queue_state ADD COLUMN partitions integer CHECK (partitions BETWEEN 1 AND 4096);

-- Serves "is this job the first of its partition?" in the claim.
CREATE INDEX jobs_partition_idx ON jobs (queue, partition, id) WHERE partition IS NOT NULL;

-- The partition of a key in a queue (NULL when the queue is not ordered or the key is NULL).
-- Shared by every producer, so a key always lands in the same partition.
CREATE FUNCTION job_partition(p_queue text, p_key text) RETURNS integer
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN p_key IS NULL THEN NULL
              ELSE (((hashtextextended(p_key, 0) % s.partitions) + s.partitions)
                    % s.partitions)::integer END
    FROM (SELECT (SELECT partitions FROM queue_state WHERE queue = p_queue) AS partitions) s
$$;

-- The function finds queue_state in baton's schema whatever the caller's search_path is.
DO $$
BEGIN
  EXECUTE format('ALTER FUNCTION job_partition(text, text) SET search_path = %I', current_schema());
END
$$;
