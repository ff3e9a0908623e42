-- Workflows' statements: submit (workflow, steps, edges), read, cancel, the cascade to what waits
-- for a step's success, and their retention.
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

-- name: insert_workflow
-- Insert one workflow unless its idempotency key exists; returns the row only when inserted.
INSERT INTO taskline.workflows (id, name, idempotency_key, request_hash)
VALUES (:id, :name, :idempotency_key, :request_hash)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: get_workflow_by_key
-- The workflow holding an idempotency key.
SELECT * FROM taskline.workflows WHERE idempotency_key = :idempotency_key;

-- name: insert_steps
-- Insert a workflow's steps (a JSON array of jobs, each with its step id and its count of
-- parents) in input order, each with its first event (:first_events, as insert_jobs_with_events).
-- Over the queue limit it writes nothing and returns one row with `refused`, as that one does.
WITH input AS MATERIALIZED (
    SELECT * FROM ROWS FROM (json_to_recordset(CAST(:jobs AS json)) AS (
            id uuid, type text, queue text, payload jsonb, priority smallint, status text,
            max_retries int, timeout_s float8, run_at timestamptz, delay_s float8,
            trace_context text, actor text, step text, pending_parents int, limit_key text,
            run_when text, ordering_key text, tags text[], start_within_s float8))
         WITH ORDINALITY AS t(id, type, queue, payload, priority, status, max_retries,
                              timeout_s, run_at, delay_s, trace_context, actor, step,
                              pending_parents, limit_key, run_when, ordering_key, tags,
                              start_within_s, ord)
), limit_queues AS (
    SELECT DISTINCT queue FROM input OFFSET 0
-- include: queue_fresh_ctes
-- include: queue_limit_ctes
), inserted AS (
    INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, timeout_s,
                      next_run_at, trace_context, workflow_id, step, pending_parents, limit_key,
                      run_when, ordering_key, tags, start_within_s, expires_at)
    SELECT t.id, t.type, t.queue, t.payload, t.priority, t.status, t.max_retries, t.timeout_s,
           COALESCE(t.run_at, now() + make_interval(secs => t.delay_s)), t.trace_context,
           :workflow_id, t.step, t.pending_parents, t.limit_key, t.run_when, t.ordering_key,
           t.tags, t.start_within_s,
           -- a step with parents counts its start_within_s from its release
           CASE WHEN t.pending_parents = 0
                THEN now() + make_interval(secs => t.start_within_s) END
    FROM input t
    WHERE NOT EXISTS (SELECT 1 FROM refused)
    ORDER BY t.ord
    RETURNING *
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor)
    SELECT i.id, 0, CAST(:first_events AS jsonb) ->> i.status, t.actor
    FROM inserted i JOIN input t ON t.id = i.id
)
SELECT i.*, NULL AS refused FROM inserted i
UNION ALL
SELECT i.*, r.queues FROM refused r LEFT JOIN inserted i ON false;

-- name: insert_dependencies
-- Insert a workflow's edges (a JSON array of {parent_id, child_id}).
INSERT INTO taskline.job_dependencies (parent_id, child_id)
SELECT parent_id, child_id
FROM json_to_recordset(CAST(:edges AS json)) AS t(parent_id uuid, child_id uuid);

-- name: step_cascade_ctes
-- Not a statement: the CTEs a statement takes in (`-- include: step_cascade_ctes`) after its
-- own `roots(id)` (steps that will never succeed) and `ended(id)` (those of them that end in
-- this statement, unsuccessfully, with no outcome recorded on their edges yet). Cancels every
-- waiting step that waits for a root's success, directly or through steps it cancels
-- (`cascaded`, event :cascade_event, actor :actor, cause :cause), and counts each cancelled
-- step and ended root on its waiting `when` children (`freed`: an any_failed child is queued at
-- once, an always child when it has no unfinished parent left, event :release_event). Every
-- step it changes is locked first, in id order, as settle_releasing locks, so the two never
-- deadlock. A `when` step is never cancelled here: its children wait for it in their turn.
, below(id) AS (
    -- Each child's condition is looked up by primary key (a scalar subquery), never by
    -- joining jobs, which the planner may hash over the whole table.
    SELECT d.child_id FROM taskline.job_dependencies d
    WHERE d.parent_id IN (SELECT id FROM roots)
      AND (SELECT k.run_when FROM taskline.jobs k WHERE k.id = d.child_id) IS NULL
    UNION
    SELECT d.child_id FROM taskline.job_dependencies d JOIN below b ON d.parent_id = b.id
    WHERE (SELECT k.run_when FROM taskline.jobs k WHERE k.id = d.child_id) IS NULL
), reached AS (
    SELECT id FROM below
    UNION
    SELECT d.child_id FROM taskline.job_dependencies d
    WHERE d.parent_id IN (SELECT id FROM below UNION ALL SELECT id FROM ended)
      AND (SELECT k.run_when FROM taskline.jobs k WHERE k.id = d.child_id) IS NOT NULL
), held AS MATERIALIZED (
    SELECT j.id, j.run_when FROM taskline.jobs j
    WHERE j.id IN (SELECT id FROM reached) AND (j.status = 'waiting') IS TRUE
    ORDER BY j.id
    FOR UPDATE OF j
), cascaded AS (
    UPDATE taskline.jobs j SET status = :cascade_target, next_run_at = NULL, finished_at = now(),
                      updated_at = now()
    FROM held h
    WHERE j.id = h.id AND h.run_when IS NULL AND (j.status = 'waiting') IS TRUE
    RETURNING j.*
), cascaded_events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor, detail)
    SELECT id, attempts, :cascade_event, :actor, jsonb_build_object('cause', CAST(:cause AS text))
    FROM cascaded
), counted AS (
    UPDATE taskline.job_dependencies d SET parent_outcome = 'cancelled'
    FROM held h
    WHERE d.child_id = h.id AND h.run_when IS NOT NULL AND d.parent_outcome IS NULL
      AND (d.parent_id IN (SELECT id FROM held WHERE run_when IS NULL)
           OR d.parent_id IN (SELECT id FROM ended))
    RETURNING d.child_id
), freed AS (
    UPDATE taskline.jobs j
    SET pending_parents = j.pending_parents - c.n,
        status = CASE WHEN j.run_when = 'any_failed' OR j.pending_parents - c.n <= 0
                      THEN :release_target ELSE j.status END,
        next_run_at = CASE WHEN j.run_when = 'any_failed' OR j.pending_parents - c.n <= 0
                           THEN now() ELSE j.next_run_at END,
        updated_at = now()
    FROM (SELECT child_id, count(*) AS n FROM counted GROUP BY child_id) c
    WHERE j.id = c.child_id AND (j.status = 'waiting') IS TRUE
    RETURNING j.*
), freed_events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event)
    SELECT id, attempts, :release_event FROM freed WHERE status = :release_target
)

-- name: cancel_waiting_dependents
-- Cancel every waiting step that waits for the success of the jobs :ids (transitively, see
-- step_cascade_ctes), those of :ended (cancelled in this transaction) counted on their `when`
-- children too; returns the jobs cancelled (kind 'cancelled') and the `when` steps queued
-- ('released').
WITH RECURSIVE roots AS (
    SELECT unnest(CAST(:ids AS uuid[])) AS id
), ended AS (
    SELECT unnest(CAST(:ended AS uuid[])) AS id
)
-- include: step_cascade_ctes
SELECT 'cancelled' AS kind, * FROM cascaded
UNION ALL
SELECT 'released', * FROM freed WHERE status = :release_target;

-- name: cancel_workflow_steps
-- Cancel a workflow's steps that have not started (:sources), locked in id order, each with its
-- event naming :actor; returns the jobs cancelled.
WITH doomed AS MATERIALIZED (
    SELECT id FROM taskline.jobs
    WHERE workflow_id = :workflow_id AND status = ANY(CAST(:sources AS text[]))
    ORDER BY id
    FOR UPDATE
), changed AS (
    UPDATE taskline.jobs j SET status = :target, next_run_at = NULL, finished_at = now(),
                      updated_at = now()
    FROM doomed
    WHERE j.id = doomed.id AND (j.status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING j.*
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor)
    SELECT id, attempts, :event, :actor FROM changed
)
SELECT * FROM changed;

-- name: stop_workflow_steps
-- Ask a workflow's running steps to stop (as cancel_running_job), locked in id order; returns
-- the jobs asked.
WITH asked AS MATERIALIZED (
    SELECT id FROM taskline.jobs
    WHERE workflow_id = :workflow_id AND status = ANY(CAST(:sources AS text[]))
      AND NOT cancel_requested
    ORDER BY id
    FOR UPDATE
), changed AS (
    UPDATE taskline.jobs j SET cancel_requested = true, updated_at = now()
    FROM asked
    WHERE j.id = asked.id AND (j.status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING j.*
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor)
    SELECT id, attempts, :event, :actor FROM changed
)
SELECT * FROM changed;

-- name: get_workflow
-- One workflow by id.
SELECT * FROM taskline.workflows WHERE id = :id;

-- name: workflow_steps
-- The steps of the workflows :ids, each with the step ids of its parents, its condition and
-- the cause of its cancellation (the detail of its `cancelled` event), in step order.
SELECT j.workflow_id, j.id, j.step, j.type, j.queue, j.status, j.attempts, j.pending_parents,
       j.last_error, j.created_at, j.updated_at, j.finished_at,
       COALESCE(j.run_when, 'all_succeeded') AS run_when,
       CASE WHEN j.status = 'cancelled' THEN (
           SELECT e.detail ->> 'cause' FROM taskline.job_events e
           WHERE e.job_id = j.id AND e.event = 'cancelled' ORDER BY e.id DESC LIMIT 1)
       END AS cancel_cause,
       COALESCE((SELECT array_agg(p.step ORDER BY p.step)
                 FROM taskline.job_dependencies d JOIN taskline.jobs p ON p.id = d.parent_id
                 WHERE d.child_id = j.id), '{}') AS after
FROM taskline.jobs j
WHERE j.workflow_id = ANY(CAST(:ids AS uuid[]))
ORDER BY j.workflow_id, j.id;

-- name: workflow_steps_page
-- Up to :limit steps of workflow :id after job id :after (null: from the first), in job id
-- order, each with the step ids of its parents: one page of GET /api/v1/workflows/{id}.
SELECT j.workflow_id, j.id, j.step, j.type, j.queue, j.status, j.attempts, j.pending_parents,
       j.last_error, j.created_at, j.updated_at, j.finished_at,
       COALESCE(j.run_when, 'all_succeeded') AS run_when,
       CASE WHEN j.status = 'cancelled' THEN (
           SELECT e.detail ->> 'cause' FROM taskline.job_events e
           WHERE e.job_id = j.id AND e.event = 'cancelled' ORDER BY e.id DESC LIMIT 1)
       END AS cancel_cause,
       COALESCE((SELECT array_agg(p.step ORDER BY p.step)
                 FROM taskline.job_dependencies d JOIN taskline.jobs p ON p.id = d.parent_id
                 WHERE d.child_id = j.id), '{}') AS after
FROM taskline.jobs j
WHERE j.workflow_id = :id AND (CAST(:after AS uuid) IS NULL OR j.id > CAST(:after AS uuid))
ORDER BY j.id
LIMIT :limit;

-- name: workflow_step_counts
-- How many steps of each of the workflows :ids are in each status (through jobs_workflow), and
-- how many of the cancelled ones are any_failed steps cancelled as condition_unmet (`unmet`).
SELECT workflow_id, status, count(*) AS n,
       count(*) FILTER (WHERE status = 'cancelled' AND run_when = 'any_failed' AND EXISTS (
           SELECT 1 FROM taskline.job_events e
           WHERE e.job_id = jobs.id AND e.event = 'cancelled'
             AND e.detail ->> 'cause' = 'condition_unmet')) AS unmet
FROM taskline.jobs WHERE workflow_id = ANY(CAST(:ids AS uuid[]))
GROUP BY workflow_id, status;

-- name: list_workflows
-- Workflows newest first, paged by the (created_at, id) of the previous page's last row.
SELECT * FROM taskline.workflows
WHERE CAST(:after_created AS timestamptz) IS NULL
   OR (created_at, id) < (CAST(:after_created AS timestamptz), CAST(:after_id AS uuid))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: parent_results
-- The step id, stored result, status, last error and attempts of each parent of job :id.
SELECT p.step, p.result, p.status, p.last_error, p.attempts
FROM taskline.job_dependencies d JOIN taskline.jobs p ON p.id = d.parent_id
WHERE d.child_id = :id;

-- name: cancel_dependents_of_expired_dead
-- Cancel what waits for the success of up to :limit workflow steps dead for more than
-- :retain_s seconds (step_cascade_ctes, cause parent_expired), so retention may then delete
-- them (a purged dead step cancels its dependents); their `when` children counted their death
-- already. Returns the jobs cancelled ('cancelled') and the `when` steps queued ('released').
WITH RECURSIVE roots AS (
    SELECT id FROM taskline.jobs
    WHERE status = 'dead' AND finished_at < now() - make_interval(secs => :retain_s)
      AND workflow_id IS NOT NULL
      AND EXISTS (SELECT 1 FROM taskline.job_dependencies d JOIN taskline.jobs c ON c.id = d.child_id
                  WHERE d.parent_id = jobs.id AND c.status = 'waiting' AND c.run_when IS NULL)
    ORDER BY finished_at
    LIMIT :limit
), ended AS (
    SELECT id FROM roots WHERE false
)
-- include: step_cascade_ctes
SELECT 'cancelled' AS kind, * FROM cascaded
UNION ALL
SELECT 'released', * FROM freed WHERE status = :release_target;

-- name: delete_empty_workflows
-- Delete up to :limit workflows older than :retain_s seconds none of whose steps is left.
DELETE FROM taskline.workflows WHERE id IN (
    SELECT w.id FROM taskline.workflows w
    WHERE w.created_at < now() - make_interval(secs => :retain_s)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.workflow_id = w.id)
    ORDER BY w.created_at LIMIT :limit
    FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: waiting_counts
-- Workflow steps waiting for their parents, per queue (through jobs_status_created_not_succeeded).
SELECT queue, count(*) AS n FROM taskline.jobs WHERE status = 'waiting' GROUP BY queue;
-- name: announce_steps
-- Owe new workflow steps (:ids, queued or scheduled) to Redis as enqueue_in_transaction owes
-- its jobs: an outbox row each and the same signals, delivered at the caller's commit.
WITH owed AS (
    INSERT INTO taskline.enqueue_outbox (job_id, queue)
    SELECT id, queue FROM taskline.jobs WHERE id = ANY(CAST(:ids AS uuid[]))
)
SELECT j.id, pg_notify('taskline_enqueued', j.queue) AS signal,
       pg_notify('taskline_enqueued_jobs', concat_ws(' ', j.id, j.priority, j.status,
                 round(extract(epoch FROM j.next_run_at) * 1000), j.queue)) AS announced
FROM taskline.jobs j WHERE j.id = ANY(CAST(:ids AS uuid[]));

-- Auditing the recorded history (taskline.audit_verify, `taskline audit verify`): read only,
-- each a bounded page along an index.
