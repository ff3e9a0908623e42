-- The maintenance passes' statements: the outbox relay, promotion of due jobs, recovery of
-- expired leases, expiry of jobs past their deadline or retention, the reconciler's pages, and
-- the test harness's resets (taskline.testing).
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

-- name: outbox_page
-- The oldest :limit outbox rows with their job's queue, priority, status, due time and whether it has an ordering key (status null: the job is gone).
SELECT o.job_id, o.queue, j.priority, j.status, j.next_run_at, j.keyed
FROM (SELECT job_id, queue FROM taskline.enqueue_outbox ORDER BY job_id LIMIT :limit) o
-- One primary-key lookup per row: OFFSET 0 keeps the planner from hash-joining all of jobs.
LEFT JOIN LATERAL (SELECT priority, status, next_run_at, ordering_key IS NOT NULL AS keyed
                   FROM taskline.jobs WHERE jobs.id = o.job_id OFFSET 0) j ON true
ORDER BY o.job_id;

-- name: delete_outbox
-- Forget outbox rows whose ids Redis has been given (or whose jobs no longer wait).
-- Committed without waiting for the WAL flush (synchronous_commit off for this statement's
-- own transaction only): a delete lost in a crash leaves rows whose ids are pushed again,
-- which the claim tolerates, and the producer's commits no longer queue behind this one's.
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS setting)
DELETE FROM taskline.enqueue_outbox
WHERE job_id = ANY(CAST(:ids AS uuid[])) AND (SELECT setting FROM relaxed) = 'off'
RETURNING job_id;

-- name: lapse_due
-- Up to :limit jobs not started by their expires_at (PostgreSQL's clock), earliest expiry first,
-- skipping rows another transaction holds: cancelled (:target, from :sources only, so a job
-- that started meanwhile is left alone) with the event :event. Read through jobs_lapsing, which
-- holds only the jobs with an expiry that have not started.
WITH due AS (
    SELECT id FROM taskline.jobs
    WHERE expires_at IS NOT NULL AND status IN ('queued', 'scheduled', 'retrying')
      AND expires_at <= clock_timestamp()
    ORDER BY expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE taskline.jobs j SET status = :target, updated_at = now(), next_run_at = NULL,
                               finished_at = now()
    FROM due WHERE j.id = due.id AND (j.status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING j.*
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, detail)
    SELECT id, attempts, :event, jsonb_build_object('expires_at', expires_at) FROM changed
)
SELECT * FROM changed;

-- name: promote_due
-- Move due scheduled and retrying jobs to queued, oldest due first; skips rows others hold.
WITH due AS (
    SELECT id FROM taskline.jobs
    WHERE status IN ('scheduled', 'retrying') AND next_run_at <= now()
    ORDER BY next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE taskline.jobs j SET status = :target, updated_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.queue, j.priority, j.attempts
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event) SELECT id, attempts, :event FROM changed
)
SELECT id, queue, priority, attempts FROM changed;

-- name: expired_leases
-- Live leases whose time ran out in PostgreSQL's clock, oldest first, their jobs locked (others
-- are skipped): what the reaper settles in the same transaction.
SELECT l.id AS lease_id, l.worker_id, j.id, j.queue, j.priority, j.type, j.attempts,
       j.max_retries, j.workflow_id
FROM taskline.live_leases l JOIN taskline.jobs j ON j.id = l.job_id
WHERE l.leased_until < now()
ORDER BY l.leased_until
LIMIT :limit
FOR UPDATE OF j SKIP LOCKED;

-- name: expire_finished
-- Delete up to :limit jobs in :status finished more than :retain_s seconds ago, oldest first,
-- skipping rows others hold; returns each deleted job. Their events, leases and DLQ row go in
-- the same statement by the foreign keys' ON DELETE CASCADE (each found through its job_id
-- index), so a job is gone whole or not at all. Candidates come from jobs_finished, and from
-- jobs_finished_unstamped for jobs a release before migration 0003 finished (counted from
-- updated_at); each is re-checked under its row lock, so a job requeued meanwhile stays. The
-- literal terminal states keep an unfinished job out whatever :status says.
WITH candidates AS (
    (SELECT id FROM taskline.jobs
     WHERE status = :status AND finished_at < now() - make_interval(secs => :retain_s)
     ORDER BY finished_at LIMIT :limit)
    UNION ALL
    (SELECT id FROM taskline.jobs
     WHERE finished_at IS NULL AND status IN ('succeeded', 'dead', 'cancelled')
       AND status = :status AND updated_at < now() - make_interval(secs => :retain_s)
     ORDER BY updated_at LIMIT :limit)
), doomed AS (
    SELECT id FROM taskline.jobs
    WHERE id = ANY(ARRAY(SELECT id FROM candidates))
      AND status IN ('succeeded', 'dead', 'cancelled') AND status = :status
      AND COALESCE(finished_at, updated_at) < now() - make_interval(secs => :retain_s)
      -- No step of an unfinished workflow: its dependents read its result (parent_results).
      AND (workflow_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM taskline.jobs s WHERE s.workflow_id = jobs.workflow_id
            AND s.status NOT IN ('succeeded', 'dead', 'cancelled')))
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
DELETE FROM taskline.jobs
WHERE id = ANY(ARRAY(SELECT id FROM doomed))
RETURNING id, queue, type, status, COALESCE(finished_at, updated_at) AS finished_at;

-- name: outbox_backlog
-- Committed in-transaction enqueues the relay has not pushed yet, and the oldest one's age in
-- seconds by PostgreSQL's clock (0 when none): the relay's lag, for the depth gauges.
SELECT count(*) AS n,
       COALESCE(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_s
FROM taskline.enqueue_outbox;

-- name: oldest_finished
-- Age in seconds of the oldest job kept in each of :statuses (NULL when none), by the same
-- clock and indexes as expire_finished: one index probe per status.
SELECT s.status, extract(epoch FROM now() - LEAST(
    (SELECT min(finished_at) FROM taskline.jobs
     WHERE status = s.status AND finished_at IS NOT NULL),
    (SELECT min(updated_at) FROM taskline.jobs
     WHERE finished_at IS NULL AND status IN ('succeeded', 'dead', 'cancelled')
       AND status = s.status)))::float8 AS age_s
FROM unnest(CAST(:statuses AS text[])) AS s(status);

-- name: pending_page
-- One keyset page of pending jobs (which Redis should hold), last touched before :before.
-- Queued jobs a flow limit applies to are claimed from PostgreSQL under their budget, never
-- from Redis, so they are left out (a worker that fetched one would only ack it away again);
-- so are queued jobs with an ordering key behind their key's head: only a head is in Redis
-- (its turn's push put it there), so a head Redis lost is restored.
SELECT id, queue, priority, status,
       (extract(epoch FROM next_run_at) * 1000)::bigint AS due_ms
FROM taskline.jobs j
WHERE status IN ('queued', 'scheduled', 'retrying') AND id > :after AND updated_at < :before
  AND NOT (status = 'queued'
           AND (EXISTS (SELECT 1 FROM taskline.flow_limits f
                        WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue))
                OR (j.ordering_key IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM taskline.claimable_rule c
                                    WHERE c.id = j.id AND (c.status = 'queued') IS TRUE))))
ORDER BY id
LIMIT :limit;

-- name: dead_page
-- One keyset page of dead jobs, for the DLQ list's reconciliation.
SELECT d.job_id AS id, j.queue
FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
WHERE d.job_id > :after AND j.status = 'dead' AND j.updated_at < :before
ORDER BY d.job_id
LIMIT :limit;

-- name: next_lease_expiry
-- Seconds (PostgreSQL time) until the earliest live lease ends; NULL if none.
SELECT extract(epoch FROM min(leased_until) - now())::float8 AS seconds FROM taskline.live_leases;

-- name: testing_skip_backoff
-- Make every retrying job due now (taskline.testing.drain with skip_backoff): its backoff is waived, nothing else changes.
UPDATE taskline.jobs SET next_run_at = now() WHERE status = 'retrying' AND next_run_at > now();

-- name: testing_tables
-- The tables of the installation but its migration version table: what taskline.testing empties after each test.
SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = :schema AND tablename <> 'alembic_version' ORDER BY tablename;
