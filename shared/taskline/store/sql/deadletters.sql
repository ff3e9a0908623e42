-- The dead-letter queue's statements: list, group, count, requeue and purge dead jobs.
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

-- name: list_dead
-- Dead-lettered jobs, newest failure first, paged by (failed_at, job_id).
SELECT j.*, d.final_error, d.fingerprint, d.attempts AS dead_attempts, d.failed_at
FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
WHERE (CAST(:queue AS text) IS NULL OR j.queue = :queue)
  AND (CAST(:after_failed AS timestamptz) IS NULL
       OR (d.failed_at, d.job_id) < (CAST(:after_failed AS timestamptz), CAST(:after_id AS uuid)))
ORDER BY d.failed_at DESC, d.job_id DESC
LIMIT :limit;

-- name: requeue_dead_batch
-- Requeue up to :limit dead jobs matching the filter (:queue, :type, :ids, :fingerprint; NULL
-- matches all), job ids above :after, in id order, skipping rows others hold: each with a fresh
-- retry budget, out of dead_letter_jobs, with its event. Re-checked under the row lock, so two concurrent
-- calls requeue each job once. Returns the requeued jobs.
WITH picked AS (
    SELECT j.id FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
    WHERE j.status = 'dead' AND d.job_id > CAST(:after AS uuid)
      AND (CAST(:queue AS text) IS NULL OR j.queue = :queue)
      AND (CAST(:type AS text) IS NULL OR j.type = :type)
      AND (CAST(:ids AS uuid[]) IS NULL OR d.job_id = ANY(CAST(:ids AS uuid[])))
      AND (CAST(:fingerprint AS text) IS NULL OR d.fingerprint = :fingerprint)
    ORDER BY d.job_id
    LIMIT :limit
    FOR UPDATE OF j SKIP LOCKED
), changed AS (
    UPDATE taskline.jobs j SET status = :target, attempts = 0, last_error = NULL, result = NULL,
                      cancel_requested = false, next_run_at = now(), updated_at = now(),
                      finished_at = NULL,
                      ordered_at = CASE WHEN j.ordering_key IS NULL THEN NULL ELSE now() END
    FROM picked WHERE j.id = picked.id AND j.status = ANY(CAST(:sources AS text[]))
    RETURNING j.id, j.queue, j.priority, j.type
), undead AS (
    DELETE FROM taskline.dead_letter_jobs d USING changed WHERE d.job_id = changed.id
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor) SELECT id, 0, :event, :actor FROM changed
)
SELECT id, queue, priority, type FROM changed ORDER BY id;

-- name: purge_dead_batch
-- Delete up to :limit dead jobs matching the filter (as requeue_dead_batch), job ids above
-- :after, in id order, skipping rows others hold; their events, leases and DLQ row go in the
-- same statement by the foreign keys' ON DELETE CASCADE. Returns the deleted jobs.
-- A purged workflow step can never succeed, so what waits for its success is cancelled in
-- the same statement (step_cascade_ctes, cause parent_purged), read from the edges before
-- the delete's cascade removes them; its `when` children counted its death already. Rows of
-- kind 'purged', then 'released' for the `when` steps the cancellations queued.
WITH RECURSIVE picked AS (
    SELECT j.id FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
    WHERE j.status = 'dead' AND d.job_id > CAST(:after AS uuid)
      AND (CAST(:queue AS text) IS NULL OR j.queue = :queue)
      AND (CAST(:type AS text) IS NULL OR j.type = :type)
      AND (CAST(:ids AS uuid[]) IS NULL OR d.job_id = ANY(CAST(:ids AS uuid[])))
      AND (CAST(:fingerprint AS text) IS NULL OR d.fingerprint = :fingerprint)
    ORDER BY d.job_id
    LIMIT :limit
    FOR UPDATE OF j SKIP LOCKED
), roots AS (
    SELECT id FROM picked
), ended AS (
    SELECT id FROM picked WHERE false
)
-- include: step_cascade_ctes
, purged AS (
    DELETE FROM taskline.jobs j USING picked
    WHERE j.id = picked.id AND j.status = ANY(CAST(:sources AS text[]))
    RETURNING j.id, j.queue, j.priority, j.type, j.status
)
SELECT 'purged' AS kind, id, queue, priority, type, status FROM purged
UNION ALL
SELECT 'released', id, queue, priority, type, status FROM freed WHERE status = :release_target;

-- name: count_dead_matching
-- How many dead jobs match the filter of requeue_dead_batch / purge_dead_batch.
SELECT count(*) AS n FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
WHERE j.status = 'dead'
  AND (CAST(:queue AS text) IS NULL OR j.queue = :queue)
  AND (CAST(:type AS text) IS NULL OR j.type = :type)
  AND (CAST(:ids AS uuid[]) IS NULL OR d.job_id = ANY(CAST(:ids AS uuid[])))
  AND (CAST(:fingerprint AS text) IS NULL OR d.fingerprint = :fingerprint);

-- name: dlq_groups
-- Dead jobs grouped by the fingerprint of their final error, most jobs first, at most :limit
-- groups, optionally of one :queue: per group its count, first and last failure, its newest
-- error as a sample, and its job types and queues (at most 20 each). Counted from
-- dead_letter_jobs through its index on (fingerprint, failed_at); the rows a deploy of the
-- earlier release dead-lettered without a fingerprint form one group, fingerprint NULL.
WITH groups AS MATERIALIZED (
    SELECT d.fingerprint, count(*) AS count, min(d.failed_at) AS first_seen,
           max(d.failed_at) AS last_seen
    FROM taskline.dead_letter_jobs d
    WHERE CAST(:queue AS text) IS NULL
       OR EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.id = d.job_id AND j.queue = :queue)
    GROUP BY d.fingerprint
    ORDER BY count(*) DESC, max(d.failed_at) DESC, d.fingerprint
    LIMIT :limit
)
SELECT g.fingerprint, g.count, g.first_seen, g.last_seen, s.final_error AS sample_error,
       k.types, k.queues
FROM groups g
CROSS JOIN LATERAL (
    SELECT d.final_error FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
    WHERE (d.fingerprint = g.fingerprint OR (g.fingerprint IS NULL AND d.fingerprint IS NULL))
      AND (CAST(:queue AS text) IS NULL OR j.queue = :queue)
    ORDER BY d.failed_at DESC LIMIT 1) s
CROSS JOIN LATERAL (
    SELECT (array_agg(DISTINCT j.type))[1:20] AS types, (array_agg(DISTINCT j.queue))[1:20] AS queues
    FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
    WHERE (d.fingerprint = g.fingerprint OR (g.fingerprint IS NULL AND d.fingerprint IS NULL))
      AND (CAST(:queue AS text) IS NULL OR j.queue = :queue)) k
ORDER BY g.count DESC, g.last_seen DESC, g.fingerprint;
