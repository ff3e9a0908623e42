-- Workers' statements: the registry (start, heartbeat, stop, listing), the leadership lease, and
-- the job types workers declare.
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

-- name: upsert_worker
-- Register a worker at start-up, with the port its metrics are served on (NULL: off) and the
-- CPUs it is pinned to (NULL: not pinned).
INSERT INTO taskline.workers (id, hostname, pid, queues, concurrency, started_at, last_heartbeat,
                              metrics_port, cpus)
VALUES (:id, :hostname, :pid, CAST(:queues AS text[]), :concurrency, now(), now(), :metrics_port,
        CAST(:cpus AS integer[]))
ON CONFLICT (id) DO UPDATE SET last_heartbeat = now(), stopped_at = NULL,
                               metrics_port = EXCLUDED.metrics_port, cpus = EXCLUDED.cpus;

-- name: heartbeat_worker
-- A worker's periodic proof of life with its busy slots.
UPDATE taskline.workers SET last_heartbeat = now(), active_jobs = :active_jobs WHERE id = :id;

-- name: stop_worker
-- Mark a worker stopped at shutdown.
UPDATE taskline.workers SET stopped_at = now(), active_jobs = 0 WHERE id = :id;

-- name: list_workers
-- Workers seen within :within_s seconds and not stopped, with their running leases.
SELECT w.*, extract(epoch FROM now() - w.last_heartbeat) AS heartbeat_age_s,
       COALESCE((SELECT array_agg(l.job_id::text) FROM taskline.job_leases l
                 WHERE l.worker_id = w.id AND l.released_at IS NULL), '{}') AS job_ids
FROM taskline.workers w
WHERE w.stopped_at IS NULL AND w.last_heartbeat > now() - make_interval(secs => :within_s)
ORDER BY w.started_at;

-- name: mark_silent_workers_stopped
-- Close the registry rows of workers silent for longer than :silent_s seconds.
UPDATE taskline.workers SET stopped_at = now(), active_jobs = 0
WHERE stopped_at IS NULL AND last_heartbeat < now() - make_interval(secs => :silent_s)
RETURNING id;

-- name: acquire_leader
-- Take or keep the named leadership lease; returns a row only when :holder holds it now.
INSERT INTO taskline.leader_leases (name, holder, leased_until)
VALUES (:name, :holder, now() + make_interval(secs => :ttl_s))
ON CONFLICT (name) DO UPDATE
    SET holder = EXCLUDED.holder, leased_until = EXCLUDED.leased_until
    WHERE leader_leases.holder = EXCLUDED.holder OR leader_leases.leased_until < now()
RETURNING holder;

-- name: release_leader
-- Give up the named leadership lease at shutdown.
DELETE FROM taskline.leader_leases WHERE name = :name AND holder = :holder;

-- name: forget_declared_types
-- Delete a starting worker's earlier declarations and those of workers unseen for :ttl_s seconds.
DELETE FROM taskline.declared_types d
WHERE d.worker_id = :worker_id
   OR (d.declared_at < now() - make_interval(secs => :ttl_s)
       AND NOT EXISTS (SELECT 1 FROM taskline.workers w WHERE w.id = d.worker_id
                       AND w.last_heartbeat > now() - make_interval(secs => :ttl_s)));

-- name: declare_types
-- Record the types a worker serves, each with its default queue and payload JSON Schema.
INSERT INTO taskline.declared_types (type, worker_id, queue, schema, declared_at)
SELECT t.type, :worker_id, t.queue, t.schema, now()
FROM jsonb_to_recordset(CAST(:types AS jsonb)) AS t (type text, queue text, schema jsonb)
ON CONFLICT (type, worker_id) DO UPDATE
    SET queue = EXCLUDED.queue, schema = EXCLUDED.schema, declared_at = EXCLUDED.declared_at;

-- name: declared_schemas
-- Each distinct payload schema of each type declared by a worker seen within :ttl_s seconds.
SELECT d.type, d.schema
FROM taskline.declared_types d LEFT JOIN taskline.workers w ON w.id = d.worker_id
WHERE COALESCE(w.last_heartbeat, d.declared_at) > now() - make_interval(secs => :ttl_s)
GROUP BY d.type, d.schema;

-- name: list_declared_types
-- Declared types by (type, queue, schema), with the workers seen within :ttl_s declaring each.
SELECT d.type, d.queue, d.schema, array_agg(d.worker_id ORDER BY d.worker_id) AS workers,
       max(COALESCE(w.last_heartbeat, d.declared_at)) AS last_seen
FROM taskline.declared_types d LEFT JOIN taskline.workers w ON w.id = d.worker_id
WHERE COALESCE(w.last_heartbeat, d.declared_at) > now() - make_interval(secs => :ttl_s)
GROUP BY d.type, d.queue, d.schema
ORDER BY d.type, last_seen DESC;
