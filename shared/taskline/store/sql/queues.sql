-- The queues' statements: pause and resume, the counts and ages /queues and the gauges show, the
-- statuses of given ids, and the database's probes (readiness, its clock).
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

-- name: pause_queue
-- Pause a queue; returns the row only when this call paused it (it was not paused already).
INSERT INTO taskline.queue_pauses (queue, actor) VALUES (:queue, :actor)
ON CONFLICT (queue) DO NOTHING
RETURNING queue, paused_at, actor;

-- name: resume_queue
-- Resume a queue; returns the row only when this call resumed it (it was paused).
DELETE FROM taskline.queue_pauses WHERE queue = :queue RETURNING queue, paused_at, actor;

-- name: paused_queues
-- Every paused queue, with when and by whom.
SELECT queue, paused_at, actor FROM taskline.queue_pauses ORDER BY queue;

-- name: statuses
-- Status, queue and open-lease worker of the given ids (absent ids are simply missing).
SELECT j.id, j.status, j.queue, j.priority, j.updated_at,
       (SELECT l.worker_id FROM taskline.live_leases_by_id l WHERE l.job_id = j.id
        ORDER BY l.id DESC LIMIT 1) AS lease_worker
FROM taskline.jobs j WHERE j.id = ANY(CAST(:ids AS uuid[]));

-- name: pending_queues
-- Queues that hold pending or running jobs.
SELECT DISTINCT queue FROM taskline.jobs WHERE status IN ('queued', 'scheduled', 'retrying', 'running');

-- name: queue_counts
-- Job counts per queue, priority and status (waiting steps too), for /queues and the depth gauges.
SELECT queue, priority, status, count(*) AS n
FROM taskline.jobs WHERE status IN ('queued', 'scheduled', 'retrying', 'running', 'dead', 'waiting')
GROUP BY queue, priority, status;

-- name: oldest_ready
-- Age in seconds of the oldest queued job per queue.
SELECT queue, extract(epoch FROM now() - min(updated_at)) AS age_s
FROM taskline.jobs WHERE status = 'queued' GROUP BY queue;

-- name: ping
-- Readiness probe.
SELECT 1;

-- name: database_now
-- PostgreSQL's time of the current transaction (a workflow step's run_at against it).
SELECT now() AS now;
