-- The jobs' statements: enqueue (one, many, in the caller's transaction, with a unique or
-- debounce key, a schedule's slot), reads of jobs and their history, and the moves of one job.
-- taskline's named SQL is in the files of this folder, one per aggregate, each statement with a
-- one-line description; every file follows these conventions:
-- Every state change names the expected state (and, on the worker path, the lease) in its
-- WHERE clause and returns the rows it changed: no row means another actor won.
-- Time is always PostgreSQL's (now() / clock_timestamp()), never a process clock.
-- Next to a job id, a status test is written `(status = 'x') IS TRUE`: the same test in a form
-- no index can serve, so the job is found by its primary key. Otherwise statistics taken while
-- nothing ran (one running job estimated) made the planner read every running job through
-- jobs_status_created (now jobs_status_created_not_succeeded) once per lease: a 50-lease completion visited ~4,000 rows, not 50.
-- The attempt fence (an open lease whose job is still running that very attempt) is the view
-- live_leases_by_id (migration 0027), written nowhere else: statements that name their leases
-- read it, and its lease test `(released_at IS NULL) IS TRUE` lets only the primary key reach
-- them; live_leases is the same rows with the plain `released_at IS NULL` beside, for the
-- statements that read open leases by `leased_until` through the open-lease index. Every
-- statement that ends an attempt is `settle` (a batch of plain successes: its special case
-- `settle_succeeded`, the same effects without a settlement document). Which states a move
-- starts from and goes to is taskline.transitions' table: a statement takes them as
-- parameters (:sources, :target, :event) where a job is found by its primary key. The claim
-- and the promotion keep their states literal, so their partial indexes match under generic
-- plans; a unit test holds those literals to the table.
-- (The claim keeps `status = 'queued'`: its id list is served by jobs_pending_id, and without
-- an index on status to choose, a never-analyzed 100,000-job backlog was read whole.)

-- name: insert_job
-- Insert one job unless its (queue, idempotency key) exists; returns the row only when inserted.
INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, timeout_s,
                  next_run_at, idempotency_key, request_hash, trace_context, limit_key,
                  ordering_key, tags, expires_at)
VALUES (:id, :type, :queue, CAST(:payload AS jsonb), :priority, :status, :max_retries,
        :timeout_s, COALESCE(CAST(:run_at AS timestamptz), now() + make_interval(secs => :delay_s)),
        :idempotency_key, :request_hash, :trace_context, CAST(:limit_key AS text),
        CAST(:ordering_key AS text), CAST(:tags AS text[]),
        COALESCE(CAST(:expires_at AS timestamptz),
                 now() + make_interval(secs => CAST(:start_within_s AS float8))))
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: insert_event
-- Append one entry to a job's history.
INSERT INTO taskline.job_events (job_id, attempt, event, worker_id, detail)
VALUES (:job_id, :attempt, :event, :worker_id, CAST(:detail AS jsonb));

-- name: insert_jobs_with_events
-- Insert jobs (a JSON array of insert_job's fields) in input order, each with its first event
-- (:first_events maps a new job's status to it, taken from taskline.transitions).
-- One statement is atomic on its own, so a job and its event commit together even in autocommit.
-- A job whose (queue, idempotency key) exists, or comes earlier in the array, is skipped.
-- JSON rather than one array per column: psycopg dumps lists value by value in Python.
-- Each row's `actor` (who asked, or null) goes on its first event: the input is kept
-- (MATERIALIZED) because an INSERT's RETURNING cannot carry a column it did not insert.
-- Over the queue limit (queue_limit_ctes) it inserts nothing and returns one row: `refused`,
-- the input's queues without unfinished jobs (every other row has `refused` null).
WITH input AS MATERIALIZED (
    SELECT * FROM ROWS FROM (json_to_recordset(CAST(:jobs AS json)) AS (
            id uuid, type text, queue text, payload jsonb, priority smallint, status text,
            max_retries int, timeout_s float8, run_at timestamptz, delay_s float8,
            idempotency_key text, request_hash text, trace_context text, actor text,
            limit_key text, ordering_key text, tags text[], expires_at timestamptz,
            start_within_s float8))
         WITH ORDINALITY AS t(id, type, queue, payload, priority, status, max_retries,
                              timeout_s, run_at, delay_s, idempotency_key, request_hash,
                              trace_context, actor, limit_key, ordering_key, tags, expires_at,
                              start_within_s, ord)
), limit_queues AS (
    SELECT DISTINCT queue FROM input OFFSET 0
-- include: queue_fresh_ctes
-- include: queue_limit_ctes
), inserted AS (
    INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, timeout_s,
                      next_run_at, idempotency_key, request_hash, trace_context, limit_key,
                      ordering_key, tags, expires_at)
    SELECT t.id, t.type, t.queue, t.payload, t.priority, t.status, t.max_retries, t.timeout_s,
           COALESCE(t.run_at, now() + make_interval(secs => t.delay_s)),
           t.idempotency_key, t.request_hash, t.trace_context, t.limit_key, t.ordering_key,
           t.tags, COALESCE(t.expires_at, now() + make_interval(secs => t.start_within_s))
    FROM input t
    WHERE NOT EXISTS (SELECT 1 FROM refused)
    ORDER BY t.ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, status, payload, next_run_at, created_at, updated_at
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor)
    SELECT i.id, 0, CAST(:first_events AS jsonb) ->> i.status, t.actor
    FROM inserted i JOIN input t ON t.id = i.id
)
SELECT id, payload, next_run_at, created_at, updated_at, NULL AS refused FROM inserted
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, queues FROM refused;

-- name: queue_fresh_ctes
-- Not a statement: the queue limit's test (TASKLINE_MAX_QUEUES) of a write to the queues of the
-- CTE before it, `limit_queues` (each once), as CTE `fresh`: those without a queued or running
-- job, the only ones that may add a queue (a probe of jobs_claimable, and of the few running
-- jobs). A queue's queued jobs are probed as "the first queued queue from it on is it": in
-- jobs_claimable's order, one probe whatever the statistics say. Asked as an equality, a backlog
-- in a few queues made a scan of the table look cheaper (it finds a match at once), which for an
-- empty queue reads every row. OFFSET 0 keeps the running probe a lookup per queue: as an
-- anti-join it could hash every running job.
), fresh AS MATERIALIZED (
    SELECT t.queue FROM limit_queues t
    WHERE (SELECT j.queue FROM taskline.jobs j WHERE j.status = 'queued' AND j.queue >= t.queue
           ORDER BY j.queue LIMIT 1) IS DISTINCT FROM t.queue
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'running'
                      OFFSET 0)

-- name: queue_limit_ctes
-- Not a statement: after queue_fresh_ctes, the queue limit's verdict as CTE `refused`: a job for
-- one queue more than :max_queues holding unfinished jobs is refused, and the statement writes
-- nothing. Only when `fresh` holds a queue are the queues holding unfinished jobs counted, by
-- queues_in_use (migration 0024): one index probe per queue, never one read per job (counted by
-- job, a write to an empty queue beside 200,000 queued jobs took 57 ms; docs/performance.md).
-- A function, not CTEs of this statement: PostgreSQL sets up every node of a statement's plan on
-- each call, run or not, and the count's CTEs made every write 7 % slower.
), refused AS MATERIALIZED (
    -- The function runs only when `fresh` holds a queue (n > 0). The verdict is queues_admitted's
    -- (migration 0025), written out here: asking that PL/pgSQL function instead made a write to
    -- a queue without work 3 % slower (docs/performance.md, change 117).
    SELECT f.queues
    FROM (SELECT array_agg(queue ORDER BY queue) AS queues, count(*) AS n FROM fresh) f,
         LATERAL (SELECT u.active, u.present FROM taskline.queues_in_use(f.queues) u
                  WHERE f.n > 0) a
    WHERE f.n > a.present AND a.active + f.n - a.present > :max_queues

-- name: enqueue_input_ctes
-- Not a statement: the body of an enqueue's `input` CTE (`-- include: enqueue_input_ctes`), the
-- :jobs array's rows in order (`ord`) with each one's due time.
    SELECT t.*, COALESCE(t.run_at, now() + make_interval(secs => t.delay_s)) AS due
    FROM ROWS FROM (json_to_recordset(CAST(:jobs AS json)) AS (
            id uuid, type text, queue text, payload jsonb, priority smallint,
            max_retries int, timeout_s float8, run_at timestamptz, delay_s float8,
            idempotency_key text, request_hash text, limit_key text, ordering_key text,
            tags text[], expires_at timestamptz, start_within_s float8))
         WITH ORDINALITY AS t(id, type, queue, payload, priority, max_retries, timeout_s,
                              run_at, delay_s, idempotency_key, request_hash, limit_key,
                              ordering_key, tags, expires_at, start_within_s, ord)

-- name: enqueue_insert_ctes
-- Not a statement: an enqueue's INSERT of its `input` rows (t) into jobs, up to its WHERE.
    INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, timeout_s,
                      next_run_at, idempotency_key, request_hash, limit_key, ordering_key,
                      tags, expires_at)
    SELECT t.id, t.type, t.queue, t.payload, t.priority,
           CASE WHEN t.due > now() THEN :scheduled ELSE :queued END,
           t.max_retries, t.timeout_s, t.due, t.idempotency_key, t.request_hash, t.limit_key,
           t.ordering_key, t.tags, COALESCE(t.expires_at, now() + make_interval(secs => t.start_within_s))
    FROM input t

-- name: enqueue_written_ctes
-- Not a statement: the rest of an enqueue's `inserted` CTE after its WHERE (the rows in order,
-- a key's replay skipped), and the first events and outbox rows of what it inserted.
    ORDER BY t.ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, status, priority, next_run_at, ordering_key IS NOT NULL AS keyed
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event)
    SELECT i.id, 0, CAST(:first_events AS jsonb) ->> i.status FROM inserted i
), outbox AS (
    INSERT INTO taskline.enqueue_outbox (job_id, queue) SELECT i.id, i.queue FROM inserted i
)

-- name: enqueue_in_transaction
-- Insert jobs with their first events and outbox rows on the caller's connection, in its transaction; NOTIFY each queue and job.
-- The caller's transaction decides: the jobs, events and outbox rows commit together or not at
-- all, and PostgreSQL delivers its signals only at that commit: `taskline_enqueued` once per
-- queue (payload: the queue), `taskline_enqueued_jobs` once per job (payload: id, priority,
-- status, due time in epoch ms and queue, space-separated, after the word `keyed` for a job with
-- an ordering key: taskline.store.rows.Owed), so the relay can push without reading the outbox
-- first (and push a keyed job only as its key's head).
-- A job's status is decided here, by PostgreSQL's clock: :scheduled when its first run lies
-- ahead, else :queued. A job whose (queue, idempotency key) exists, or comes earlier in the
-- array, is skipped (no event, no outbox row, no signal), as in insert_jobs_with_events.
-- The queue limit: the queues holding no queued or running job (`fresh`, the only ones that
-- may add a queue) are judged by queues_admitted (migration 0025), a function call, so a write
-- to queues with work sets up no count (as CTEs the count cost every call its plan's setup, a
-- third of the statement's execution; docs/performance.md). Unless :limit_checked, a statement
-- whose fresh queues the limit refuses writes nothing and returns a row per such queue in
-- `fresh`; the caller counts them (queue_limit_refused, which names the refused queues) and,
-- unless refused after all, runs the statement again with :limit_checked.
WITH input AS MATERIALIZED (
-- include: enqueue_input_ctes
), limit_queues AS (
    -- The queue limit's test (queue_fresh_ctes); `fresh` is not read with :limit_checked.
    SELECT DISTINCT queue FROM input OFFSET 0
-- include: queue_fresh_ctes
), admitted AS MATERIALIZED (
    SELECT CAST(:limit_checked AS boolean) OR NOT EXISTS (SELECT 1 FROM fresh)
           OR taskline.queues_admitted(ARRAY(SELECT queue FROM fresh),
                                       CAST(:max_queues AS integer)) AS ok
), inserted AS (
-- include: enqueue_insert_ctes
    WHERE (SELECT ok FROM admitted)
-- include: enqueue_written_ctes
-- PostgreSQL folds repeated (channel, payload) pairs of one transaction into one signal.
SELECT i.id, pg_notify('taskline_enqueued', i.queue) AS signal,
       pg_notify('taskline_enqueued_jobs', concat_ws(' ', CASE WHEN i.keyed THEN 'keyed' END,
                 i.id, i.priority, i.status,
                 round(extract(epoch FROM i.next_run_at) * 1000), i.queue)) AS announced,
       NULL AS fresh
FROM inserted i
UNION ALL
SELECT NULL, NULL, NULL, queue FROM fresh WHERE NOT (SELECT ok FROM admitted);

-- name: enqueue_one_in_transaction
-- One job (:jobs holds one) as enqueue_in_transaction writes it, its queue limit tested on its own row: written unless the limit refuses its queue.
-- The single enqueue's statement (taskline.enqueuing): a queue with work costs no more than the
-- test's two probes; a queue without (an idle queue, whose workers keep up) is judged by
-- queues_admitted (migration 0025), the test's last arm, so it runs only for such a queue and
-- the job is written in this one statement. When nothing is written (a queue the limit refuses,
-- or an idempotency key's replay) the caller counts the queue (queue_limit_refused, which names
-- the refused queues) and goes on with enqueue_in_transaction, :limit_checked. Without
-- enqueue_in_transaction's `fresh` CTE, its DISTINCT and its answer's fourth column, PostgreSQL
-- sets up a smaller plan on every call (docs/performance.md).
WITH input AS (
-- include: enqueue_input_ctes
), inserted AS (
-- include: enqueue_insert_ctes
    WHERE (SELECT j.queue FROM taskline.jobs j WHERE j.status = 'queued' AND j.queue >= t.queue
           ORDER BY j.queue LIMIT 1) = t.queue
       OR EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'running'
                  OFFSET 0)
       OR taskline.queues_admitted(ARRAY[t.queue], CAST(:max_queues AS integer))
-- include: enqueue_written_ctes
-- PostgreSQL folds repeated (channel, payload) pairs of one transaction into one signal.
SELECT i.id, pg_notify('taskline_enqueued', i.queue) AS signal,
       pg_notify('taskline_enqueued_jobs', concat_ws(' ', CASE WHEN i.keyed THEN 'keyed' END,
                 i.id, i.priority, i.status,
                 round(extract(epoch FROM i.next_run_at) * 1000), i.queue)) AS announced
FROM inserted i;

-- name: queue_limit_refused
-- The queue limit of insert_jobs_with_events for a write that does not go through it (a large
-- batch written by COPY, a keyed plan, the library's insert naming `fresh` queues): one row
-- with `refused` (the queues :queues holding no queued or running job) when writing to :queues
-- would hold more than :max_queues queues with unfinished jobs, else none. Run in the writing
-- transaction, before the write.
WITH limit_queues AS (
    SELECT DISTINCT queue FROM unnest(CAST(:queues AS text[])) AS q(queue)
-- include: queue_fresh_ctes
-- include: queue_limit_ctes
)
SELECT queues AS refused FROM refused;

-- name: get_job_by_key
-- The job holding an idempotency key in a queue.
SELECT * FROM taskline.jobs WHERE queue = :queue AND idempotency_key = :idempotency_key;

-- name: get_job
-- One job by id.
SELECT * FROM taskline.jobs WHERE id = :id;

-- name: get_events
-- A job's history, oldest first.
SELECT id, attempt, event, worker_id, actor, detail, created_at
FROM taskline.job_events WHERE job_id = :id ORDER BY id;

-- name: get_leases
-- A job's attempts: who held which lease and how it ended, oldest first.
SELECT id, attempt, worker_id, leased_at, leased_until, released_at, outcome
FROM taskline.job_leases WHERE job_id = :id ORDER BY id;

-- name: get_jobs
-- The jobs :ids that exist (the answers of a burst of woken waiters, read at once).
SELECT * FROM taskline.jobs WHERE id = ANY(CAST(:ids AS uuid[]));

-- name: get_events_of
-- get_events of each of the jobs :ids, by job, oldest first.
SELECT job_id, id, attempt, event, worker_id, actor, detail, created_at
FROM taskline.job_events WHERE job_id = ANY(CAST(:ids AS uuid[])) ORDER BY job_id, id;

-- name: get_leases_of
-- get_leases of each of the jobs :ids, by job, oldest first.
SELECT job_id, id, attempt, worker_id, leased_at, leased_until, released_at, outcome
FROM taskline.job_leases WHERE job_id = ANY(CAST(:ids AS uuid[])) ORDER BY job_id, id;

-- name: events_after
-- The first :limit history entries above id :after, oldest first, with their job's queue, type and priority.
SELECT e.id, e.job_id, e.attempt, e.event, e.worker_id, e.actor, e.created_at,
       e.recorded_status, e.error, e.progress, j.queue, j.type, j.priority
FROM (SELECT id, job_id, attempt, event, worker_id, actor, created_at,
             detail ->> 'status' AS recorded_status, left(detail ->> 'error', 300) AS error,
             detail -> 'progress' AS progress
      FROM taskline.job_events WHERE id > :after ORDER BY id LIMIT :limit) e
-- One primary-key lookup per entry: OFFSET 0 keeps the planner from hash-joining all of jobs.
LEFT JOIN LATERAL (SELECT queue, type, priority FROM taskline.jobs WHERE jobs.id = e.job_id OFFSET 0) j
    ON true
ORDER BY e.id;

-- name: newest_events_after
-- The newest :limit history entries with an id in (:after, :upto], newest first, as events_after returns them.
SELECT e.id, e.job_id, e.attempt, e.event, e.worker_id, e.actor, e.created_at,
       e.recorded_status, e.error, e.progress, j.queue, j.type, j.priority
FROM (SELECT id, job_id, attempt, event, worker_id, actor, created_at,
             detail ->> 'status' AS recorded_status, left(detail ->> 'error', 300) AS error,
             detail -> 'progress' AS progress
      FROM taskline.job_events WHERE id > :after AND id <= :upto ORDER BY id DESC LIMIT :limit) e
LEFT JOIN LATERAL (SELECT queue, type, priority FROM taskline.jobs WHERE jobs.id = e.job_id OFFSET 0) j
    ON true
ORDER BY e.id DESC;

-- name: last_event_id
-- The id of the newest history entry, 0 when there is none.
SELECT COALESCE(max(id), 0) AS id FROM taskline.job_events;

-- name: transaction_horizon
-- The oldest transaction id still running (cluster-wide) and the next one to be assigned.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS oldest,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next;

-- name: list_jobs
-- Jobs newest first, filtered, paged by the (created_at, id) of the previous page's last row.
-- A :tag is matched through the GIN index jobs_tags (`tags @> ARRAY[tag]`).
SELECT * FROM taskline.jobs
WHERE (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:tag AS text) IS NULL OR tags @> ARRAY[CAST(:tag AS text)])
  AND (CAST(:type AS text) IS NULL OR type = :type)
  AND (CAST(:queue AS text) IS NULL OR queue = :queue)
  AND (CAST(:after_created AS timestamptz) IS NULL
       OR (created_at, id) < (CAST(:after_created AS timestamptz), CAST(:after_id AS uuid)))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: cancel_running_job
-- Mark a running job's cancellation as requested, with its event; the worker's next renewal
-- stops it. Returns the job only when this call asked.
WITH changed AS (
    UPDATE taskline.jobs SET cancel_requested = true, updated_at = now()
    WHERE id = :id AND (status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING *
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor)
    SELECT id, attempts, :event, :actor FROM changed
)
SELECT * FROM changed;

-- name: cancel_pending_job
-- Cancel a job that has not started, with its event; returns it only when this call cancelled it.
WITH changed AS (
    UPDATE taskline.jobs SET status = :target, updated_at = now(), next_run_at = NULL, finished_at = now()
    WHERE id = :id AND (status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING *
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor)
    SELECT id, attempts, :event, :actor FROM changed
)
SELECT * FROM changed;

-- name: requeue_dead_job
-- Put a dead job back in the queue with a fresh retry budget; returns it only when requeued.
-- A job with an ordering key takes a new place at the back of its key's line (ordered_at).
WITH changed AS (
    UPDATE taskline.jobs SET status = :target, attempts = 0, last_error = NULL, result = NULL,
                    cancel_requested = false, next_run_at = now(), updated_at = now(),
                    finished_at = NULL,
                    -- a keyed job takes a new place at the back of its key's line
                    ordered_at = CASE WHEN ordering_key IS NULL THEN NULL ELSE now() END
    WHERE id = :id AND (status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING *
), undead AS (
    DELETE FROM taskline.dead_letter_jobs d USING changed WHERE d.job_id = changed.id
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor) SELECT id, 0, :event, :actor FROM changed
)
SELECT * FROM changed;

-- name: fire_slot
-- Fire one slot of a schedule still at :revision and not paused: the slot's row, its job (a
-- new queued job carrying the schedule and the slot instant) with its first event, and the
-- schedule's last slot, in one statement. A slot already recorded inserts nothing: no row.
WITH limit_queues AS (
    -- A slot whose job would add a queue past :max_queues inserts nothing, and returns one row
    -- with `refused` (queue_limit_ctes).
    SELECT CAST(:queue AS text) AS queue
-- include: queue_fresh_ctes
-- include: queue_limit_ctes
), slot AS (
    INSERT INTO taskline.schedule_slots (schedule, slot, job_id)
    SELECT name, CAST(:slot AS timestamptz), CAST(:id AS uuid) FROM taskline.schedules
    WHERE name = :name AND revision = :revision AND NOT paused
      AND NOT EXISTS (SELECT 1 FROM refused)
    ON CONFLICT (schedule, slot) DO NOTHING
    RETURNING schedule, slot, job_id
), job AS (
    INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, timeout_s,
                      next_run_at, schedule, scheduled_for, limit_key, unique_key, created_at,
                      updated_at)
    SELECT slot.job_id, :type, :queue, CAST(:payload AS jsonb), :priority, :status,
           :max_retries, :timeout_s, now(), slot.schedule, slot.slot,
           CAST(:limit_key AS text), CAST(:unique_key AS text),
           -- now() when the statement runs alone; after a unique key's lookup, its own start
           -- (as insert_keyed_job: a key's jobs never seem to overlap).
           statement_timestamp(), statement_timestamp()
    FROM slot
    RETURNING *
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, detail)
    SELECT id, 0, :event, jsonb_build_object('schedule', schedule, 'scheduled_for', scheduled_for)
    FROM job
), marked AS (
    UPDATE taskline.schedules s SET last_slot = slot.slot, last_job_id = slot.job_id
    FROM slot WHERE s.name = slot.schedule AND (s.last_slot IS NULL OR s.last_slot < slot.slot)
)
SELECT j.*, NULL AS refused FROM job j
UNION ALL
SELECT j.*, r.queues FROM refused r LEFT JOIN job j ON false;

-- name: fold_slot
-- Record a slot of a schedule still at :revision and not paused as fired into :job_id, the job already holding its job's unique key in scope (no job written), and make it the schedule's last slot. A slot already recorded: no row.
WITH slot AS (
    INSERT INTO taskline.schedule_slots (schedule, slot, job_id)
    SELECT name, CAST(:slot AS timestamptz), CAST(:job_id AS uuid) FROM taskline.schedules
    WHERE name = :name AND revision = :revision AND NOT paused
    ON CONFLICT (schedule, slot) DO NOTHING
    RETURNING schedule, slot, job_id
), marked AS (
    UPDATE taskline.schedules s SET last_slot = slot.slot, last_job_id = slot.job_id
    FROM slot WHERE s.name = slot.schedule AND (s.last_slot IS NULL OR s.last_slot < slot.slot)
)
SELECT schedule, slot, job_id FROM slot;

-- name: testing_enqueued
-- The jobs visible to the caller's transaction whose id was made at or after :floor (ids are time-ordered UUIDv7s made on the enqueuing host), of :type when given, oldest first: taskline.testing.enqueued.
SELECT id, type, queue, payload, priority, status, next_run_at, idempotency_key, created_at
FROM taskline.jobs
WHERE id >= CAST(:floor AS uuid) AND (CAST(:type AS text) IS NULL OR type = CAST(:type AS text))
ORDER BY id;

-- name: job_outcome
-- One job's state and outcome, by primary key: what taskline.wait reads after each signal.
SELECT status, result, last_error, attempts FROM taskline.jobs WHERE id = CAST(:id AS uuid);

-- name: watch_finish
-- Flag as watched the jobs :ids and every step of the workflows :workflow_ids, those not in a state of :finished and not flagged yet, so the commit that finishes one signals it (jobs_finished_notify, migration 0028). Never waits for a row lock: returns the candidates this statement saw but did not flag (their row held by another transaction, or finished meanwhile) for watch_finish_one.
WITH wanted AS MATERIALIZED (
    SELECT id FROM taskline.jobs
    WHERE (id = ANY(CAST(:ids AS uuid[])) OR workflow_id = ANY(CAST(:workflow_ids AS uuid[])))
      AND watched IS NOT TRUE AND (status <> ALL(CAST(:finished AS text[]))) IS TRUE
), locked AS MATERIALIZED (
    SELECT j.id FROM taskline.jobs j JOIN wanted w ON w.id = j.id
    WHERE j.watched IS NOT TRUE AND (j.status <> ALL(CAST(:finished AS text[]))) IS TRUE
    FOR UPDATE OF j SKIP LOCKED
), flagged AS (
    UPDATE taskline.jobs j SET watched = true FROM locked WHERE j.id = locked.id
    RETURNING j.id
)
SELECT id FROM wanted WHERE id NOT IN (SELECT id FROM flagged);

-- name: watch_finish_one
-- Flag job :id as watched as watch_finish does, waiting for its row lock: run alone, holding no other lock, it waits for the transaction that holds the row (a settle) and never closes a deadlock cycle with it.
UPDATE taskline.jobs SET watched = true
WHERE id = CAST(:id AS uuid) AND watched IS NOT TRUE
  AND (status <> ALL(CAST(:finished AS text[]))) IS TRUE;

-- name: lock_enqueue_keys
-- Take the transaction-level locks of the unique and debounce keys :locks (texts built by taskline.uniqueness), in one global order (by hash), so two writers sharing keys wait for each other instead of deadlocking.
-- Taken by a statement of its own: under READ COMMITTED the lookups that follow take a fresh
-- snapshot, so they see the job the previous holder of the lock committed.
SELECT count(pg_advisory_xact_lock(t.h)) AS locked
FROM (SELECT DISTINCT hashtextextended(k, 0) AS h
      FROM unnest(CAST(:locks AS text[])) AS k ORDER BY 1) t;

-- name: find_unique
-- The newest job of :queue holding :unique_key in one of :states, created within :period_s (null: for ever), by PostgreSQL's clock.
SELECT * FROM taskline.jobs
WHERE queue = :queue AND unique_key = :unique_key
  AND status = ANY(CAST(:states AS text[]))
  AND (CAST(:period_s AS float8) IS NULL
       OR created_at > now() - make_interval(secs => CAST(:period_s AS float8)))
ORDER BY created_at DESC
LIMIT 1;

-- name: replace_unique
-- Replace the payload, priority and (while it waits) run time of a unique job that has not started; no row when it has.
-- A queued job is due already and stays queued: only a scheduled one takes the new run time.
WITH replaced AS (
    UPDATE taskline.jobs SET payload = CAST(:payload AS jsonb), priority = :priority,
           next_run_at = CASE WHEN status = 'scheduled'
                              THEN COALESCE(CAST(:run_at AS timestamptz),
                                            now() + make_interval(secs => :delay_s))
                              ELSE next_run_at END,
           updated_at = now()
    WHERE id = :id AND (status IN ('scheduled', 'queued')) IS TRUE AND attempts = 0
    RETURNING *
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor, detail)
    SELECT r.id, 0, :event, CAST(:actor AS text),
           jsonb_build_object('status', r.status, 'priority', r.priority)
    FROM replaced r
), outbox AS (
    -- The library's call (:announce): a queued job replaced at a new priority is owed to its
    -- new ready list (the relay pushes it again; the claim drops the stale entry).
    INSERT INTO taskline.enqueue_outbox (job_id, queue)
    SELECT r.id, r.queue FROM replaced r WHERE CAST(:announce AS boolean) AND r.status = 'queued'
    ON CONFLICT (job_id) DO NOTHING
)
SELECT * FROM replaced;

-- name: join_debounced
-- Add :payload to the newest scheduled job of :queue and :type holding :debounce_key, unless it holds :max_joined payloads or :max_bytes of them already; its run moves to :delay_s from now, at most 10 x :delay_s after its creation. No row: begin a new job.
-- The row's own state is re-tested after its lock: a job the promoter moved to queued
-- meanwhile takes no more payloads (an arrival after that begins a new job).
WITH joined AS (
    UPDATE taskline.jobs j
    SET coalesced = j.coalesced || jsonb_build_array(CAST(:payload AS jsonb)),
        next_run_at = LEAST(now() + make_interval(secs => :delay_s),
                            j.created_at + make_interval(secs => :delay_s * :span)),
        updated_at = now()
    WHERE j.id = (SELECT id FROM taskline.jobs
                  WHERE queue = :queue AND type = :type AND debounce_key = :debounce_key
                    AND status = 'scheduled'
                  ORDER BY created_at DESC LIMIT 1)
      AND (j.status = 'scheduled') IS TRUE
      AND j.snoozes = 0  -- a snoozed job has started: an arrival now begins a new job
      AND jsonb_array_length(j.coalesced) < :max_joined
      AND octet_length(CAST(j.coalesced AS text)) + octet_length(CAST(:payload AS text)) + 2
          <= :max_bytes
    RETURNING j.*
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor, detail)
    SELECT r.id, 0, :event, CAST(:actor AS text),
           jsonb_build_object('joined', jsonb_array_length(r.coalesced), 'status', r.status)
    FROM joined r
)
SELECT * FROM joined;

-- name: insert_keyed_job
-- Insert one job with its unique or debounce key (and a debounced job's first payload as `coalesced`) and its first event; skipped when its (queue, idempotency key) exists. The status by PostgreSQL's clock. With :announce (the library's in-transaction enqueue) also its outbox row and signals, as enqueue_in_transaction writes them.
-- Only jobs with `unique` or `debounce` (or a batch holding one) come here, after
-- lock_enqueue_keys; the plain inserts above stay as they were. created_at is this
-- statement's start, not the transaction's: later than the lookup that found the key's
-- previous job finished, so a key's jobs never seem to overlap (the fault checker's rule).
WITH input AS (
    SELECT COALESCE(CAST(:run_at AS timestamptz), now() + make_interval(secs => :delay_s)) AS due
), inserted AS (
    INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, timeout_s,
                      next_run_at, idempotency_key, request_hash, trace_context, limit_key,
                      unique_key, debounce_key, coalesced, ordering_key, tags, expires_at,
                      created_at, updated_at)
    SELECT :id, :type, :queue, CAST(:payload AS jsonb), :priority,
           CASE WHEN t.due > now() THEN :scheduled ELSE :queued END,
           :max_retries, :timeout_s, t.due, CAST(:idempotency_key AS text),
           CAST(:request_hash AS text), CAST(:trace_context AS text), CAST(:limit_key AS text),
           CAST(:unique_key AS text), CAST(:debounce_key AS text),
           CASE WHEN CAST(:debounce_key AS text) IS NOT NULL
                THEN jsonb_build_array(CAST(:payload AS jsonb)) END,
           CAST(:ordering_key AS text), CAST(:tags AS text[]),
           COALESCE(CAST(:expires_at AS timestamptz),
                    now() + make_interval(secs => CAST(:start_within_s AS float8))),
           statement_timestamp(), statement_timestamp()
    FROM input t
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, actor)
    SELECT i.id, 0, CAST(:first_events AS jsonb) ->> i.status, CAST(:actor AS text)
    FROM inserted i
), outbox AS (
    INSERT INTO taskline.enqueue_outbox (job_id, queue)
    SELECT i.id, i.queue FROM inserted i WHERE CAST(:announce AS boolean)
), signals AS (
    SELECT pg_notify('taskline_enqueued', i.queue),
           pg_notify('taskline_enqueued_jobs', concat_ws(' ', i.id, i.priority, i.status,
                     round(extract(epoch FROM i.next_run_at) * 1000), i.queue))
    FROM inserted i WHERE CAST(:announce AS boolean)
)
SELECT i.*, (SELECT count(*) FROM signals) AS signalled FROM inserted i;
