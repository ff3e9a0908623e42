-- The history audit's statements (taskline.store.history, for taskline.audit_verify): pages of
-- jobs with their events, leases, parents and finishes, and the flow limits over time.
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

-- name: audit_jobs_page
-- Up to :limit jobs created at or after :since, after (:after_created, :after_id) in
-- (created_at, id) order, read straight off index jobs_created. The ORDER BY names the
-- table's columns: a bare `id` would mean the selected text, whose order no index holds, so
-- each page would sort every job after it (a page's cost growing with the table).
SELECT j.id::text AS id, j.type, j.queue, j.status, j.attempts, j.limit_key, j.run_when,
       j.created_at, j.ordering_key
FROM taskline.jobs j
WHERE j.created_at >= CAST(:since AS timestamptz)
  AND (j.created_at, j.id) > (CAST(:after_created AS timestamptz), CAST(:after_id AS uuid))
ORDER BY j.created_at, j.id
LIMIT :limit;

-- name: audit_events_of
-- The events of the jobs :ids in id order, each with the state its row records (`recorded`,
-- detail.status), its cause (detail.cause) and the transaction that wrote it; sorted by the
-- uuid, not the selected text (cheaper to compare, same grouping).
SELECT job_id::text AS job_id, id, attempt, event, detail ->> 'status' AS recorded,
       detail ->> 'cause' AS cause, created_at, xmin::text AS xid
FROM taskline.job_events e WHERE e.job_id = ANY(CAST(:ids AS uuid[]))
ORDER BY e.job_id, e.id;

-- name: audit_leases_of
-- The leases of the jobs :ids in id order (sorted by the uuid, as the events).
SELECT job_id::text AS job_id, id, attempt, worker_id, leased_at, leased_until, released_at,
       outcome
FROM taskline.job_leases l WHERE l.job_id = ANY(CAST(:ids AS uuid[]))
ORDER BY l.job_id, l.id;

-- name: audit_event_shapes_of
-- What the audit's rules about one job read of the events of the jobs :ids (each event's name
-- and the state its row records), grouped by job, each job's in id order (taskline.audit_verify,
-- a job's "shape"): three short columns, cheap to decode, where a whole event row is not.
SELECT e.job_id::text AS job_id, e.event, e.detail ->> 'status' AS recorded
FROM taskline.job_events e WHERE e.job_id = ANY(CAST(:ids AS uuid[]))
ORDER BY e.job_id, e.id;

-- name: audit_lease_shapes_of
-- What those rules read of the leases of the jobs :ids (attempt, outcome, whether still open),
-- grouped by job, each job's in id order.
SELECT l.job_id::text AS job_id, l.attempt, l.outcome, l.released_at IS NULL AS open
FROM taskline.job_leases l WHERE l.job_id = ANY(CAST(:ids AS uuid[]))
ORDER BY l.job_id, l.id;

-- name: audit_parents_of
-- The parents of those of the jobs :ids that are workflow steps with parents.
SELECT child_id::text AS child_id, parent_id::text AS parent_id FROM taskline.job_dependencies
WHERE child_id = ANY(CAST(:ids AS uuid[]));

-- name: audit_finishes_of
-- The events of the jobs :ids that may end them (success, death, cancellation, a recovery
-- into dead), each with the state its row records and the transaction that wrote it.
SELECT job_id::text AS job_id, id, event, detail ->> 'status' AS recorded, created_at,
       xmin::text AS xid
FROM taskline.job_events
WHERE job_id = ANY(CAST(:ids AS uuid[]))
  AND event IN ('succeeded', 'dead_lettered', 'cancelled', 'lapsed', 'recovered');

-- name: audit_limit_changes
-- Up to :limit flow limit changes in the audit trail after (:after_at, :after_id), oldest first.
SELECT id, at, action, target, detail FROM taskline.audit_log
WHERE action IN ('limit.set', 'limit.delete')
  AND (at, id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS uuid))
ORDER BY at, id
LIMIT :limit;

-- name: audit_flow_limits
-- The flow limits in force now, each since its updated_at.
SELECT scope, concurrency, rate_limit, period_s, per_key, updated_at FROM taskline.flow_limits;

-- name: audit_scope_leases
-- Up to :limit leases after lease :after (id order) of jobs of the type or queue :name
-- (:kind) that were open at some time in [:start, :end).
SELECT l.id, l.job_id, l.leased_at, l.released_at, coalesce(j.limit_key, '') AS limit_key
FROM taskline.job_leases l JOIN taskline.jobs j ON j.id = l.job_id
WHERE l.id > :after
  AND CASE WHEN :kind = 'type' THEN j.type ELSE j.queue END = :name
  AND l.leased_at < CAST(:end AS timestamptz)
  AND (l.released_at IS NULL OR l.released_at > CAST(:start AS timestamptz))
ORDER BY l.id
LIMIT :limit;
