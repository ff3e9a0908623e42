-- taskline's named SQL: every query the store runs, each with a one-line description.
-- Every state change names the expected state (and, on the worker path, the lease) in its
-- WHERE clause and returns the rows it changed: no row means another actor won.
-- Time is always PostgreSQL's (now() / clock_timestamp()), never a process clock.
-- Next to a job id, a status test is written `(status = 'x') IS TRUE`: the same test in a form
-- no index can serve, so the job is found by its primary key. Otherwise statistics taken while
-- nothing ran (one running job estimated) made the planner read every running job through
-- jobs_status_created (now jobs_status_created_not_succeeded) once per lease: a 50-lease completion visited ~4,000 rows, not 50.
-- The attempt fence (an open lease whose job is still running that very attempt) is the view
-- live_leases (migration 0002), written nowhere else; every statement that ends an attempt is
-- `settle`. Which states a move starts from and goes to is taskline.transitions' table: a
-- statement takes them as parameters (:sources, :target, :event) where a job is found by its
-- primary key. The claim and the promotion keep their states literal, so their partial
-- indexes match under generic plans; a unit test holds those literals to the table.
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
-- Over the queue limit (see `fresh`) it inserts nothing and returns one row: `refused`, the
-- input's queues without unfinished jobs (every other row has `refused` null).
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
), fresh AS MATERIALIZED (
    -- The queue limit (TASKLINE_MAX_QUEUES): a job for one queue more than :max_queues holding
    -- unfinished jobs is refused, and nothing of the input is written. Only the input's queues
    -- without a queued or running job (a probe of jobs_claimable, and of the few running jobs)
    -- may add a queue, so only then are the queues holding unfinished jobs counted. OFFSET 0
    -- keeps each probe a lookup per queue: as an anti-join it could hash every queued job.
    SELECT t.queue FROM (SELECT DISTINCT queue FROM input OFFSET 0) t  -- each queue once
    WHERE NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'queued'
                      OFFSET 0)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'running'
                      OFFSET 0)
), refused AS MATERIALIZED (
    SELECT f.queues
    FROM (SELECT array_agg(queue ORDER BY queue) AS queues, count(*) AS n FROM fresh) f,
         LATERAL (SELECT count(DISTINCT j.queue) AS active,
                         count(DISTINCT j.queue) FILTER (WHERE j.queue = ANY(f.queues)) AS present
                  FROM taskline.jobs j
                  WHERE f.n > 0
                    AND j.status IN ('queued', 'scheduled', 'retrying', 'running', 'waiting')) a
    WHERE f.n > a.present AND a.active + f.n - a.present > :max_queues
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
-- Over the queue limit it writes nothing and returns one row with `refused`, as that one does.
WITH input AS MATERIALIZED (
    SELECT t.*, COALESCE(t.run_at, now() + make_interval(secs => t.delay_s)) AS due
    FROM ROWS FROM (json_to_recordset(CAST(:jobs AS json)) AS (
            id uuid, type text, queue text, payload jsonb, priority smallint,
            max_retries int, timeout_s float8, run_at timestamptz, delay_s float8,
            idempotency_key text, request_hash text, limit_key text, ordering_key text,
            tags text[], expires_at timestamptz, start_within_s float8))
         WITH ORDINALITY AS t(id, type, queue, payload, priority, max_retries, timeout_s,
                              run_at, delay_s, idempotency_key, request_hash, limit_key,
                              ordering_key, tags, expires_at, start_within_s, ord)
), fresh AS MATERIALIZED (
    -- The queue limit, as in insert_jobs_with_events: only the input's queues without a
    -- queued or running job may add a queue, so only then are the queues counted.
    SELECT t.queue FROM (SELECT DISTINCT queue FROM input OFFSET 0) t  -- each queue once
    WHERE NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'queued'
                      OFFSET 0)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'running'
                      OFFSET 0)
), refused AS MATERIALIZED (
    SELECT f.queues
    FROM (SELECT array_agg(queue ORDER BY queue) AS queues, count(*) AS n FROM fresh) f,
         LATERAL (SELECT count(DISTINCT j.queue) AS active,
                         count(DISTINCT j.queue) FILTER (WHERE j.queue = ANY(f.queues)) AS present
                  FROM taskline.jobs j
                  WHERE f.n > 0
                    AND j.status IN ('queued', 'scheduled', 'retrying', 'running', 'waiting')) a
    WHERE f.n > a.present AND a.active + f.n - a.present > :max_queues
), inserted AS (
    INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, timeout_s,
                      next_run_at, idempotency_key, request_hash, limit_key, ordering_key,
                      tags, expires_at)
    SELECT t.id, t.type, t.queue, t.payload, t.priority,
           CASE WHEN t.due > now() THEN :scheduled ELSE :queued END,
           t.max_retries, t.timeout_s, t.due, t.idempotency_key, t.request_hash, t.limit_key,
           t.ordering_key, t.tags, COALESCE(t.expires_at, now() + make_interval(secs => t.start_within_s))
    FROM input t
    WHERE NOT EXISTS (SELECT 1 FROM refused)
    ORDER BY t.ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, status, priority, next_run_at, ordering_key IS NOT NULL AS keyed
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event)
    SELECT i.id, 0, CAST(:first_events AS jsonb) ->> i.status FROM inserted i
), outbox AS (
    INSERT INTO taskline.enqueue_outbox (job_id, queue) SELECT i.id, i.queue FROM inserted i
)
-- PostgreSQL folds repeated (channel, payload) pairs of one transaction into one signal.
SELECT i.id, pg_notify('taskline_enqueued', i.queue) AS signal,
       pg_notify('taskline_enqueued_jobs', concat_ws(' ', CASE WHEN i.keyed THEN 'keyed' END,
                 i.id, i.priority, i.status,
                 round(extract(epoch FROM i.next_run_at) * 1000), i.queue)) AS announced,
       NULL AS refused
FROM inserted i
UNION ALL
SELECT NULL, NULL, NULL, queues FROM refused;

-- name: queue_limit_refused
-- The queue limit of insert_jobs_with_events for a write that does not go through it (a large
-- batch written by COPY): one row with `refused` (the queues :queues holding no queued or
-- running job) when writing to :queues would hold more than :max_queues queues with unfinished
-- jobs, else none. Run in the writing transaction, before the COPY.
WITH input AS (
    SELECT DISTINCT queue FROM unnest(CAST(:queues AS text[])) AS q(queue)
), fresh AS MATERIALIZED (
    SELECT q.queue FROM input q
    WHERE NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = q.queue AND j.status = 'queued'
                      OFFSET 0)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = q.queue AND j.status = 'running'
                      OFFSET 0)
), refused AS MATERIALIZED (
    SELECT f.queues
    FROM (SELECT array_agg(queue ORDER BY queue) AS queues, count(*) AS n FROM fresh) f,
         LATERAL (SELECT count(DISTINCT j.queue) AS active,
                         count(DISTINCT j.queue) FILTER (WHERE j.queue = ANY(f.queues)) AS present
                  FROM taskline.jobs j
                  WHERE f.n > 0
                    AND j.status IN ('queued', 'scheduled', 'retrying', 'running', 'waiting')) a
    WHERE f.n > a.present AND a.active + f.n - a.present > :max_queues
)
SELECT queues AS refused FROM refused;

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

-- name: claim_jobs
-- Claim queued jobs for one worker: one winner per id, attempt counted, lease row and event written.
-- Candidates go through claimable_rule (migration 0012; claimable_jobs is its queued jobs), the
-- one claim rule: queued, queue not paused. The state is tested as `(...) IS TRUE`, here and on
-- the row itself, and the ids are named on both, so the rows are read by primary key only: a
-- literal `status = 'queued'` would let statistics taken while the queue was empty plan a read
-- of every queued job per id (test_store_plans). The row's own test means that, of two
-- claimers, the one that waited for the other's row lock re-reads the row and finds it taken.
-- :limited false claims only jobs no flow limit applies to; true, only limited jobs, and only
-- inside the budgeted claim's transaction, which holds the limits' row locks (Store.claim_held).
WITH claimed AS (
    UPDATE taskline.jobs SET status = :target, attempts = attempts + 1, updated_at = now()
    WHERE id IN (SELECT c.id FROM taskline.claimable_rule c WHERE c.id = ANY(CAST(:ids AS uuid[]))
                 AND (c.status = 'queued') IS TRUE AND c.limited = CAST(:limited AS boolean))
      AND id = ANY(CAST(:ids AS uuid[])) AND (status = 'queued') IS TRUE
    RETURNING *
), leases AS (
    INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, leased_until)
    SELECT id, attempts, :worker_id, clock_timestamp(),
           clock_timestamp() + make_interval(secs => :lease_s)
    FROM claimed
    RETURNING id AS lease_id, job_id, leased_at, leased_until
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, worker_id)
    SELECT id, attempts, :event, :worker_id FROM claimed
)
SELECT claimed.*, leases.lease_id, leases.leased_at, leases.leased_until
FROM claimed JOIN leases ON leases.job_id = claimed.id;

-- name: due_queued_ids
-- The most urgent queued jobs of one queue, FIFO within a priority, locked until the caller's
-- transaction ends and skipping those another claimer holds: the candidates claim_jobs is given
-- when PostgreSQL chooses them (dispatch from PostgreSQL while Redis is unreachable); the claim
-- then applies the one rule, claimable_jobs, to them. A paused queue yields none: its pause is
-- checked once for the queue, uncorrelated, so the plan stays an in-order read of
-- jobs_claimable that stops after :limit rows (the view, flattened into an anti-join with
-- queue_pauses, is planned as a scan and sort of every queued job of the queue). Limited jobs
-- are left to the budgeted claim (held_candidates), as on the Redis path: a limit on the queue
-- is checked once too, and the limited types are read once into an array each row is tested
-- against (an anti-join with flow_limits would be planned like the view).
SELECT j.id FROM taskline.jobs j
WHERE j.status = 'queued' AND j.queue = :queue
  AND NOT EXISTS (SELECT 1 FROM taskline.queue_pauses p WHERE p.queue = :queue)
  AND NOT EXISTS (SELECT 1 FROM taskline.flow_limits f WHERE f.scope = 'queue:' || :queue)
  AND ('type:' || j.type) <> ALL (ARRAY(SELECT f.scope FROM taskline.flow_limits f))
  AND j.ordering_key IS NULL  -- keyed jobs start through the budgeted claim, as their key's head
ORDER BY j.priority DESC, j.created_at, j.id
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: notify_ready
-- Wake the workers that dispatch from PostgreSQL: one notification per queue whose jobs became
-- queued while Redis could not be told (the payload is the queue's name).
SELECT pg_notify('taskline_enqueued', queue) FROM unnest(CAST(:queues AS text[])) AS queue;

-- name: claim_refusals
-- Of ids a claim did not take, those still queued, and why: held by a pause (they go back to
-- their ready lists), or limited (they are claimed from PostgreSQL, under their budget). A
-- keyed job counts as limited whether or not it is its key's head; `keyed` when no flow limit
-- applies to it too, so the worker claims it at once under its key's lock (Store.claim_keyed)
-- rather than leaving it to the budgeted claim.
SELECT j.id, j.queue, j.priority,
       EXISTS (SELECT 1 FROM taskline.queue_pauses p WHERE p.queue = j.queue) AS paused,
       -- The key first: a keyed job is limited without the rule's head test, a read of its
       -- key's line.
       j.ordering_key IS NOT NULL
           OR EXISTS (SELECT 1 FROM taskline.claimable_rule c
                      WHERE c.id = j.id AND (c.status = 'queued') IS TRUE AND c.limited)
           AS limited,
       j.ordering_key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM taskline.flow_limits f
                           WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue)) AS keyed
FROM taskline.jobs j
WHERE j.id = ANY(CAST(:ids AS uuid[])) AND (j.status = 'queued') IS TRUE;

-- name: lock_flow_limits
-- Every flow limit, its row locked for the rest of the transaction (in scope order, so two
-- budgeted claims never deadlock): the statements after it see every start committed before.
-- `now` is the instant the budgets are judged at.
SELECT scope, concurrency, rate_limit, period_s, per_key, clock_timestamp() AS now
FROM taskline.flow_limits
ORDER BY scope FOR UPDATE;

-- name: lock_ordering_keys
-- Lock, until the budgeted claim's transaction ends, the ordering keys of the ids it is about
-- to claim (in key order, so two claims never deadlock): claim_jobs, the next statement, then
-- reads with a snapshot that holds every claim of those keys committed before, so its head gate
-- (claimable_rule: none of the key running) cannot pass for two jobs of a key at once. The
-- two-number form keeps these locks apart from the migrations' one-number lock.
SELECT pg_advisory_xact_lock(29804, hashtext(k.queue || chr(31) || k.ordering_key))
FROM (SELECT DISTINCT queue, ordering_key FROM taskline.jobs
      WHERE id = ANY(CAST(:ids AS uuid[])) AND ordering_key IS NOT NULL
      ORDER BY queue, ordering_key) k;

-- name: keyed_heads_among
-- Of these just-enqueued keyed ids, those the claim rule lets through now (their key's head):
-- only they are pushed to Redis; the others wait in PostgreSQL until the statement that
-- finishes the job before them passes them the turn (settle's `turns`). Read by primary key,
-- as claim_jobs reads the rule.
SELECT c.id FROM taskline.claimable_rule c
WHERE c.id = ANY(CAST(:ids AS uuid[])) AND (c.status = 'queued') IS TRUE;

-- name: turns_after
-- The turns passed by keyed jobs that finished without running (cancelled, lapsed), read after
-- their move: per job of :ids with an ordering key, its key's next job in line (the earliest
-- other unfinished one, through jobs_ordering) when that one stood behind it and the claim rule
-- now lets it through (queued, its key's head), to be pushed as settle's `turns` are. A job that
-- was not its key's head passes nothing: the head is already in Redis.
SELECT DISTINCT n.id, n.queue, n.priority
FROM taskline.jobs f CROSS JOIN LATERAL (
    SELECT o.id, o.queue, o.priority, COALESCE(o.ordered_at, o.created_at) AS place
    FROM taskline.jobs o
    WHERE o.queue = f.queue AND o.ordering_key = f.ordering_key AND o.id <> f.id
      AND o.status IN ('queued', 'scheduled', 'retrying', 'running')
    ORDER BY COALESCE(o.ordered_at, o.created_at), o.id
    LIMIT 1) n
WHERE f.id = ANY(CAST(:ids AS uuid[])) AND f.ordering_key IS NOT NULL
  AND (COALESCE(f.ordered_at, f.created_at), f.id) < (n.place, n.id)
  AND EXISTS (SELECT 1 FROM taskline.claimable_rule c
              WHERE c.id = n.id AND (c.status = 'queued') IS TRUE);

-- name: keyed_waiting
-- Whether queued jobs with an ordering key, other than :skip, wait in these queues (behind
-- their key's head, or its head itself): the budgeted claim keeps looking for them.
SELECT EXISTS (SELECT 1 FROM taskline.jobs j
               WHERE j.ordering_key IS NOT NULL
                 AND j.status IN ('queued', 'scheduled', 'retrying', 'running')
                 AND j.status = 'queued' AND j.queue = ANY(CAST(:queues AS text[]))
                 AND j.id <> ALL(CAST(:skip AS uuid[]))) AS waiting;

-- name: ordering_key_counts
-- Per queue, the ordering keys with unfinished jobs and their queued jobs (read through the
-- index jobs_ordering, which holds keyed unfinished jobs only).
SELECT queue, count(DISTINCT ordering_key) AS keys, count(*) FILTER (WHERE status = 'queued') AS queued
FROM taskline.jobs
WHERE ordering_key IS NOT NULL AND status IN ('queued', 'scheduled', 'retrying', 'running')
GROUP BY queue;

-- name: flow_limit_scopes
-- The scopes that have a limit.
SELECT scope FROM taskline.flow_limits;

-- name: flow_usage
-- What each budget holds now: open leases of jobs of a concurrency-limited scope, and starts of
-- a rate-limited scope inside its sliding window (with the oldest), by key under per_key.
WITH running AS (
    SELECT f.scope, CASE WHEN f.per_key THEN COALESCE(j.limit_key, '') ELSE '' END AS key,
           count(*) AS n, NULL::timestamptz AS oldest
    FROM taskline.job_leases l
    JOIN taskline.jobs j ON j.id = l.job_id
    JOIN taskline.flow_limits f ON f.concurrency IS NOT NULL
                      AND f.scope IN ('type:' || j.type, 'queue:' || j.queue)
    WHERE l.released_at IS NULL
    GROUP BY 1, 2
), started AS (
    SELECT s.scope, CASE WHEN f.per_key THEN s.limit_key ELSE '' END AS key,
           count(*) AS n, min(s.started_at) AS oldest
    FROM taskline.flow_starts s
    JOIN taskline.flow_limits f ON f.scope = s.scope AND f.rate_limit IS NOT NULL
    WHERE s.started_at > clock_timestamp() - make_interval(secs => f.period_s)
    GROUP BY 1, 2
)
SELECT 'running' AS kind, * FROM running
UNION ALL
SELECT 'started' AS kind, * FROM started;

-- name: held_candidates
-- Limited queued jobs of these queues, most urgent first and FIFO, skipping those whose scope or
-- key has no budget left (:full_scopes 'type:x', :full_keys 'type:x' || chr(31) || key) and
-- those already picked (:skip).
SELECT c.id, c.type, c.queue, c.limit_key FROM taskline.claimable_jobs c
WHERE c.limited AND c.queue = ANY(CAST(:queues AS text[]))
  AND c.id <> ALL(CAST(:skip AS uuid[]))
  AND ('type:' || c.type) <> ALL(CAST(:full_scopes AS text[]))
  AND ('queue:' || c.queue) <> ALL(CAST(:full_scopes AS text[]))
  AND ('type:' || c.type || chr(31) || COALESCE(c.limit_key, '')) <> ALL(CAST(:full_keys AS text[]))
  AND ('queue:' || c.queue || chr(31) || COALESCE(c.limit_key, ''))
      <> ALL(CAST(:full_keys AS text[]))
ORDER BY c.priority DESC, c.created_at, c.id
LIMIT :limit;

-- name: keyed_heads
-- held_candidates when no flow limit exists: the queued jobs with an ordering key of these
-- queues that the claim rule lets through (their key's heads), most urgent first and FIFO,
-- skipping :skip. Read through jobs_ordering, which holds keyed unfinished jobs only, so a
-- long backlog of jobs without a key is never read; the rule is read by primary key, as
-- claim_jobs reads it.
SELECT j.id, j.type, j.queue, j.limit_key FROM taskline.jobs j
WHERE j.ordering_key IS NOT NULL AND j.status IN ('queued', 'scheduled', 'retrying', 'running')
  AND (j.status = 'queued') IS TRUE AND j.queue = ANY(CAST(:queues AS text[]))
  AND j.id <> ALL(CAST(:skip AS uuid[]))
  AND EXISTS (SELECT 1 FROM taskline.claimable_rule c
              WHERE c.id = j.id AND (c.status = 'queued') IS TRUE)
ORDER BY j.priority DESC, j.created_at, j.id
LIMIT :limit;

-- name: record_flow_starts
-- Log the starts of rate-limited scopes (:starts: JSON [{scope, key, at}], `at` each lease's
-- leased_at), and drop entries no window can count any more.
WITH added AS (
    INSERT INTO taskline.flow_starts (scope, limit_key, started_at)
    SELECT scope, key, at FROM json_to_recordset(CAST(:starts AS json))
        AS t(scope text, key text, at timestamptz)
)
DELETE FROM taskline.flow_starts s
WHERE NOT EXISTS (SELECT 1 FROM taskline.flow_limits f
                  WHERE f.scope = s.scope AND f.rate_limit IS NOT NULL
                    AND s.started_at > clock_timestamp() - make_interval(secs => f.period_s));

-- name: upsert_flow_limit
-- Create or replace one scope's limits; returns the row and whether it was created.
INSERT INTO taskline.flow_limits (scope, concurrency, rate_limit, period_s, per_key, updated_at)
VALUES (:scope, :concurrency, :rate_limit, :period_s, :per_key, now())
ON CONFLICT (scope) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, rate_limit = EXCLUDED.rate_limit,
        period_s = EXCLUDED.period_s, per_key = EXCLUDED.per_key, updated_at = now()
RETURNING scope, concurrency, rate_limit, period_s, per_key, updated_at, (xmax = 0) AS created;

-- name: delete_flow_limit
-- Remove one scope's limits; returns the row when it existed.
DELETE FROM taskline.flow_limits WHERE scope = :scope
RETURNING scope, concurrency, rate_limit, period_s, per_key, updated_at;

-- name: list_flow_limits
-- Every limit with what it holds now: open leases and starts in the window (all keys), and the
-- queued jobs it applies to (held back while its budget is used).
SELECT f.scope, f.concurrency, f.rate_limit, f.period_s, f.per_key, f.updated_at,
       (SELECT count(*) FROM taskline.job_leases l JOIN taskline.jobs j ON j.id = l.job_id
        WHERE l.released_at IS NULL
          AND f.scope IN ('type:' || j.type, 'queue:' || j.queue)) AS running,
       (SELECT count(*) FROM taskline.flow_starts s
        WHERE s.scope = f.scope AND f.rate_limit IS NOT NULL
          AND s.started_at > clock_timestamp() - make_interval(secs => f.period_s)) AS started,
       (SELECT count(*) FROM taskline.claimable_jobs c
        WHERE f.scope IN ('type:' || c.type, 'queue:' || c.queue)) AS held
FROM taskline.flow_limits f
ORDER BY f.scope;

-- name: held_of_scope
-- One keyset page of the queued jobs a scope names that no limit holds any more, most urgent
-- first and FIFO, for pushing them back to Redis once the scope's limit is removed.
SELECT c.id, c.queue, c.priority, c.created_at FROM taskline.claimable_jobs c
WHERE CAST(:scope AS text) IN ('type:' || c.type, 'queue:' || c.queue)
  AND NOT c.limited
  AND (CAST(:after_id AS uuid) IS NULL
       OR c.priority < :after_priority
       OR (c.priority = :after_priority
           AND (c.created_at, c.id) > (CAST(:after_created AS timestamptz),
                                       CAST(:after_id AS uuid))))
ORDER BY c.priority DESC, c.created_at, c.id
LIMIT :limit;

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

-- name: renew_leases
-- Extend the live leases this worker holds; returns each kept lease and its job's cancel flag (busy false), and each lease another transaction holds locked (busy true, not renewed).
-- A lease whose row is locked is skipped, not waited for: an outcome being written locks its
-- lease until its transaction commits, which takes as long as its on_complete hooks and its
-- round trips, and waiting there would hold back the renewal of every other lease in this
-- statement until their leases lapsed. A skipped lease is still live: it is neither renewed
-- nor lost, and the next renewal tries it again.
WITH free AS (
    SELECT l.id FROM taskline.live_leases l
    WHERE l.id = ANY(CAST(:lease_ids AS bigint[])) AND l.worker_id = :worker_id
    FOR UPDATE OF l SKIP LOCKED
), renewed AS (
    UPDATE taskline.live_leases l
    SET leased_until = clock_timestamp() + make_interval(secs => :lease_s)
    FROM free, taskline.jobs j
    WHERE l.id = free.id AND j.id = l.job_id
      AND l.id = ANY(CAST(:lease_ids AS bigint[]))  -- the partitions of these ids only (0021)
    RETURNING l.id AS lease_id, j.cancel_requested
)
SELECT lease_id, cancel_requested, false AS busy FROM renewed
UNION ALL
SELECT l.id, NULL, true FROM taskline.live_leases l
WHERE l.id = ANY(CAST(:lease_ids AS bigint[])) AND l.worker_id = :worker_id
  AND l.id NOT IN (SELECT id FROM free);

-- name: settle
-- End attempts on their live lease only: the lease closed with its outcome, the job moved to
-- its settlement's status, the DLQ row of a dead one upserted, finished_at stamped by a move
-- that finishes the job (and cleared by one that does not), one event each; returns the jobs
-- it changed. :settlements is a JSON object keyed by lease id (each settlement names its
-- worker, status, event, outcome, error, result, delay and detail, and the flags its move
-- implies); :lease_ids lists the same leases. Each lease is found by primary key and its
-- settlement by key, so no join with a recordset of unknown size is planned (the planner
-- reads one as 100 rows and hash-joins it with every open lease, dead index entries included).
-- `lapsed` settlements (the reaper's) settle only a lease whose time has run out.
WITH input AS MATERIALIZED (
    SELECT CAST(:settlements AS jsonb) AS doc
), leases AS (
    UPDATE taskline.live_leases l
    SET released_at = clock_timestamp(), outcome = input.doc -> l.id::text ->> 'outcome'
    FROM input
    WHERE l.id = ANY(CAST(:lease_ids AS bigint[]))
      AND l.worker_id = input.doc -> l.id::text ->> 'worker_id'
      AND (CAST(input.doc -> l.id::text ->> 'lapsed' AS boolean) IS NOT TRUE
           OR l.leased_until < now())
    RETURNING l.id AS lease_id, l.job_id, l.attempt, l.worker_id, input.doc -> l.id::text AS s
), changed AS (
    UPDATE taskline.jobs j
    SET status = leases.s ->> 'status',
        attempts = j.attempts - CAST(leases.s ->> 'refund' AS int),
        snoozes = j.snoozes + COALESCE(CAST(leases.s ->> 'snooze' AS int), 0),
        result = CASE WHEN CAST(leases.s ->> 'writes_result' AS boolean)
                      THEN leases.s -> 'result' ELSE j.result END,
        last_error = CASE WHEN CAST(leases.s ->> 'writes_error' AS boolean)
                          THEN leases.s ->> 'error' ELSE j.last_error END,
        next_run_at = CASE WHEN leases.s ->> 'delay_s' IS NULL THEN j.next_run_at
                           ELSE now() + make_interval(
                               secs => CAST(leases.s ->> 'delay_s' AS float8)) END,
        finished_at = CASE WHEN CAST(leases.s ->> 'finishes' AS boolean) THEN now() END,
        updated_at = now()
    FROM leases WHERE j.id = leases.job_id AND (j.status = 'running') IS TRUE
    RETURNING j.id, j.queue, j.priority, j.attempts, j.status, j.next_run_at, leases.lease_id,
              leases.attempt, leases.worker_id, leases.s, j.ordering_key
), turns AS (
    -- A keyed job that finishes passes its key's turn: the next in line (the earliest other
    -- unfinished job of its key, read through jobs_ordering), when queued, is returned to be
    -- pushed after the commit, so a worker claims it through the ordinary claim at once
    -- rather than at a budgeted claim's next look. One not yet due (scheduled, retrying)
    -- keeps the turn and is pushed by the promoter. Jobs without a key skip the lookup.
    SELECT c.id AS settled_id, n.id, n.priority
    FROM changed c CROSS JOIN LATERAL (
        SELECT o.id, o.priority, o.status FROM taskline.jobs o
        WHERE o.queue = c.queue AND o.ordering_key = c.ordering_key AND o.id <> c.id
          AND o.status IN ('queued', 'scheduled', 'retrying', 'running')
        ORDER BY COALESCE(o.ordered_at, o.created_at), o.id
        LIMIT 1) n
    WHERE c.ordering_key IS NOT NULL AND CAST(c.s ->> 'finishes' AS boolean)
      AND n.status = 'queued'
), dead AS (
    INSERT INTO taskline.dead_letter_jobs (job_id, final_error, fingerprint, attempts, failed_at)
    SELECT id, s ->> 'error', s ->> 'fingerprint', attempts, now() FROM changed
    WHERE CAST(s ->> 'dead_letter' AS boolean)
    ON CONFLICT (job_id) DO UPDATE
        SET final_error = EXCLUDED.final_error, fingerprint = EXCLUDED.fingerprint,
            attempts = EXCLUDED.attempts, failed_at = EXCLUDED.failed_at
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, worker_id, detail)
    SELECT id, attempt, s ->> 'event', worker_id, NULLIF(s -> 'detail', 'null'::jsonb)
    FROM changed
)
SELECT c.id, c.queue, c.priority, c.attempts, c.status, c.lease_id, c.worker_id,
       (extract(epoch FROM c.next_run_at) * 1000)::bigint AS due_ms,
       t.id AS turn_id, t.priority AS turn_priority
FROM changed c LEFT JOIN turns t ON t.settled_id = c.id;

-- name: settle_turning_tail
-- Not run alone: the store's `settle_turning` is `settle` with this in place of its final SELECT
-- (taskline.store.queries composes it). `settle` for a batch of successes holding keyed jobs
-- that keep their slot, in one statement: it also starts, for :worker_id, up to :most of the
-- turns the batch passes (`turns`: each finished head's next job in line, queued), so a key's
-- next job begins on the worker that finished its head after one commit, with no push, fetch
-- or claim. No key lock is needed here: until this statement commits every claimer's snapshot
-- sees the head running, and from its commit on the next one running, so no claimer finds the
-- key free in between (the claim rule's head test). The rule's other gates are read for each
-- turn as for a released workflow step: its queue served here (:served) and not paused, its
-- expiry not passed (PostgreSQL's clock), no flow limit on its type or queue; and it overtakes
-- no job without a key already queued in its queue at least as urgent. A turn not started
-- stays queued and is returned to be pushed, as settle's; one started is not.
, turn_starts AS MATERIALIZED (
    SELECT t.id FROM turns t JOIN taskline.jobs j ON j.id = t.id
    WHERE j.queue = ANY(CAST(:served AS text[]))
      AND NOT EXISTS (SELECT 1 FROM taskline.queue_pauses p WHERE p.queue = j.queue)
      AND (j.expires_at IS NULL OR j.expires_at > clock_timestamp())
      AND NOT EXISTS (SELECT 1 FROM taskline.flow_limits f
                      WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue))
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs o WHERE o.status = 'queued' AND o.queue = j.queue
                      AND o.priority >= j.priority AND o.ordering_key IS NULL)
    ORDER BY t.priority DESC, t.id
    LIMIT :most
), turned AS (
    UPDATE taskline.jobs j SET status = :target, attempts = j.attempts + 1, updated_at = now()
    FROM turn_starts s WHERE j.id = s.id AND (j.status = 'queued') IS TRUE
    RETURNING j.*
), turn_leases AS (
    INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, leased_until)
    SELECT id, attempts, :worker_id, clock_timestamp(),
           clock_timestamp() + make_interval(secs => :lease_s)
    FROM turned
    RETURNING id AS lease_id, job_id, leased_until
), turn_events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, worker_id)
    SELECT id, attempts, :event, :worker_id FROM turned
)
SELECT 'settled' AS kind, c.id, c.queue, c.priority, c.attempts, c.status, c.lease_id,
       c.worker_id, (extract(epoch FROM c.next_run_at) * 1000)::bigint AS due_ms,
       CASE WHEN NOT EXISTS (SELECT 1 FROM turned WHERE turned.id = t.id) THEN t.id END
           AS turn_id, t.priority AS turn_priority,
       NULL AS type, NULL AS payload, NULL AS max_retries, NULL AS timeout_s,
       NULL AS next_run_at, NULL AS idempotency_key, NULL AS last_error, NULL AS result,
       NULL AS created_at, NULL AS updated_at, NULL AS cancel_requested, NULL AS trace_context,
       NULL AS workflow_id, NULL AS step, NULL AS run_when, NULL AS limit_key,
       NULL AS ordering_key, NULL AS snoozes, NULL AS tags, NULL AS progress,
       NULL AS expires_at, NULL AS schedule, NULL AS scheduled_for, NULL AS unique_key,
       NULL AS debounce_key, NULL AS coalesced, NULL AS leased_until
FROM changed c LEFT JOIN turns t ON t.settled_id = c.id
UNION ALL
SELECT 'started', r.id, r.queue, r.priority, r.attempts, r.status, l.lease_id,
       CAST(:worker_id AS text), NULL, NULL, NULL, r.type, r.payload, r.max_retries,
       r.timeout_s, r.next_run_at, r.idempotency_key, r.last_error, r.result, r.created_at,
       r.updated_at, r.cancel_requested, r.trace_context, r.workflow_id, r.step, r.run_when,
       r.limit_key, r.ordering_key, r.snoozes, r.tags, r.progress, r.expires_at, r.schedule,
       r.scheduled_for, r.unique_key, r.debounce_key, r.coalesced, l.leased_until
FROM turned r JOIN turn_leases l ON l.job_id = r.id;

-- name: settle_releasing_tail
-- Not run alone: the store's `settle_releasing` is `settle` with this in place of its final
-- SELECT (taskline.store.queries composes it, so the fence and the DLQ upsert stay written
-- once). `settle` for a batch holding workflow steps, in one statement: it also counts each
-- succeeded step's success on its waiting children (settlements flagged `releases`),
-- decrementing a child's pending_parents by its parents among them, and queues each child
-- left with none (:release_target, event :release_event). A `when` child (run_when) counts
-- every finish (succeeded, dead, cancelled), each parent's first only (the edge's
-- parent_outcome, set here); an `any_failed` one is queued by its first failed parent and
-- cancelled (:unmet_target, :unmet_event, cause :unmet_cause) when its last parent succeeds
-- with none failed. Children are locked in id order,
-- so statements releasing overlapping children cannot deadlock; one that waited for another's
-- lock decrements the count the other committed (READ COMMITTED re-reads the locked row), so
-- of parents finishing at once exactly one sees the count reach 0.
-- Up to :most of the children it queues are claimed in the same statement for :worker_id
-- (`starts`), so they begin on the settling worker after one commit: those of its queues
-- (:served, in its order) that the claim rule's gates let through (claimable_rule: queue not
-- paused, no flow limit), and that overtake nobody (no job already queued in the child's queue
-- is at least as urgent, nor any in a queue listed before it in :served), most urgent first.
-- Their state is the one this statement gives them: the snapshot still sees them waiting, so
-- the rule's `status` cannot be read from it. A started child goes waiting -> queued ->
-- running as one row update, its `unblocked` event before its `claimed` one (one INSERT, in
-- that order) and its lease row written as claim_jobs writes one. Returns settle's rows
-- (kind 'settled'), then one row per child queued ('released'), started ('started', with
-- the whole job and its lease) or cancelled as its condition was unmet ('unmet').
, finished AS (
    SELECT d.parent_id, d.child_id, c.status AS outcome, k.run_when
    FROM changed c JOIN taskline.job_dependencies d ON d.parent_id = c.id
    JOIN taskline.jobs k ON k.id = d.child_id
    WHERE c.status IN ('succeeded', 'dead', 'cancelled') AND CAST(c.s ->> 'releases' AS boolean)
), counted AS (
    -- A `when` child counts a parent's first finish only: its edge records the outcome once.
    UPDATE taskline.job_dependencies d SET parent_outcome = f.outcome
    FROM finished f
    WHERE d.parent_id = f.parent_id AND d.child_id = f.child_id AND f.run_when IS NOT NULL
      AND d.parent_outcome IS NULL
    RETURNING d.child_id, d.parent_outcome AS outcome
), tally AS (
    SELECT e.child_id, count(*) AS n, bool_or(e.outcome <> 'succeeded') AS failed
    FROM (SELECT child_id, outcome FROM finished
          WHERE run_when IS NULL AND outcome = 'succeeded'
          UNION ALL
          SELECT child_id, outcome FROM counted) e
    GROUP BY e.child_id
), locked AS MATERIALIZED (
    SELECT j.id, j.queue, j.priority, f.n,
           j.pending_parents - f.n <= 0 OR (j.run_when = 'any_failed' AND f.failed) IS TRUE
               AS frees,
           (j.run_when = 'any_failed' AND NOT f.failed AND j.pending_parents - f.n <= 0) IS TRUE
               AS unmet
    FROM taskline.jobs j JOIN tally f ON f.child_id = j.id
    WHERE (j.status = ANY(CAST(:release_sources AS text[]))) IS TRUE
    ORDER BY j.id
    FOR UPDATE OF j
), starts AS MATERIALIZED (
    SELECT l.id FROM locked l
    WHERE l.frees AND NOT l.unmet AND l.queue = ANY(CAST(:served AS text[]))
      AND EXISTS (SELECT 1 FROM taskline.claimable_rule c WHERE c.id = l.id AND NOT c.limited)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs o WHERE o.status = 'queued' AND o.queue = l.queue
                      AND o.priority >= l.priority)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs o WHERE o.status = 'queued' AND o.queue = ANY(
          (CAST(:served AS text[]))[1:coalesce(array_position(CAST(:served AS text[]),
                                                              l.queue), 1) - 1]))
    ORDER BY l.priority DESC, l.id
    LIMIT :most
), released AS (
    UPDATE taskline.jobs j
    SET pending_parents = j.pending_parents - locked.n,
        status = CASE WHEN starts.id IS NOT NULL THEN :target
                      WHEN locked.unmet THEN :unmet_target
                      WHEN locked.frees THEN :release_target
                      ELSE j.status END,
        attempts = j.attempts + CASE WHEN starts.id IS NOT NULL THEN 1 ELSE 0 END,
        next_run_at = CASE WHEN locked.unmet THEN NULL
                           WHEN locked.frees THEN now() ELSE j.next_run_at END,
        finished_at = CASE WHEN locked.unmet THEN now() ELSE j.finished_at END,
        -- a keyed step takes its place in its key's line when released, not when submitted
        ordered_at = CASE WHEN locked.frees AND NOT locked.unmet AND j.ordering_key IS NOT NULL
                          THEN now() ELSE j.ordered_at END,
        expires_at = CASE WHEN locked.frees AND NOT locked.unmet
                          THEN now() + make_interval(secs => j.start_within_s)
                          ELSE j.expires_at END,
        updated_at = now()
    FROM locked LEFT JOIN starts ON starts.id = locked.id
    WHERE j.id = locked.id AND (j.status = ANY(CAST(:release_sources AS text[]))) IS TRUE
    RETURNING j.*, starts.id IS NOT NULL AS started, locked.frees, locked.unmet
), step_leases AS (
    INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, leased_until)
    SELECT id, attempts, :worker_id, clock_timestamp(),
           clock_timestamp() + make_interval(secs => :lease_s)
    FROM released WHERE started
    RETURNING id AS lease_id, job_id, leased_until
), step_events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, worker_id, detail)
    SELECT e.job_id, e.attempt, e.event, e.worker_id, e.detail
    FROM released r CROSS JOIN LATERAL (
        VALUES (r.id, r.attempts - CASE WHEN r.started THEN 1 ELSE 0 END,
                CASE WHEN r.unmet THEN CAST(:unmet_event AS text)
                     ELSE CAST(:release_event AS text) END, CAST(NULL AS text),
                CASE WHEN r.unmet THEN jsonb_build_object('cause', CAST(:unmet_cause AS text))
                END, 0),
               (CASE WHEN r.started THEN r.id END, r.attempts, CAST(:event AS text),
                CAST(:worker_id AS text), CAST(NULL AS jsonb), 1))
        AS e (job_id, attempt, event, worker_id, detail, ord)
    WHERE r.frees AND e.job_id IS NOT NULL
    ORDER BY e.job_id, e.ord
)
SELECT 'settled' AS kind, c.id, c.queue, c.priority, c.attempts, c.status, c.lease_id,
       c.worker_id, (extract(epoch FROM c.next_run_at) * 1000)::bigint AS due_ms,
       t.id AS turn_id, t.priority AS turn_priority,
       NULL AS type, NULL AS payload, NULL AS max_retries, NULL AS timeout_s,
       NULL AS next_run_at, NULL AS idempotency_key, NULL AS last_error, NULL AS result,
       NULL AS created_at, NULL AS updated_at, NULL AS cancel_requested, NULL AS trace_context,
       NULL AS workflow_id, NULL AS step, NULL AS limit_key, NULL AS schedule,
       NULL AS scheduled_for, NULL AS leased_until
FROM changed c LEFT JOIN turns t ON t.settled_id = c.id
UNION ALL
SELECT CASE WHEN r.started THEN 'started' WHEN r.unmet THEN 'unmet' ELSE 'released' END,
       r.id, r.queue, r.priority,
       r.attempts, r.status, l.lease_id, CASE WHEN r.started THEN CAST(:worker_id AS text) END,
       NULL, NULL, NULL, r.type, r.payload, r.max_retries, r.timeout_s, r.next_run_at, r.idempotency_key,
       r.last_error, r.result, r.created_at, r.updated_at, r.cancel_requested,
       r.trace_context, r.workflow_id, r.step, r.limit_key, r.schedule, r.scheduled_for,
       l.leased_until
FROM released r LEFT JOIN step_leases l ON l.job_id = r.id
WHERE r.frees;

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

-- name: write_progress
-- A running attempt's progress (`ctx.progress`), only while its lease is live (live_leases, the
-- fence), with its event :event (detail.progress); returns the job only when written.
WITH changed AS (
    UPDATE taskline.jobs j SET progress = CAST(:progress AS jsonb)
    FROM taskline.live_leases l
    WHERE l.id = :lease_id AND l.worker_id = :worker_id AND j.id = l.job_id
      AND (j.status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING j.id, j.attempts
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, worker_id, detail)
    SELECT id, attempts, :event, :worker_id, jsonb_build_object('progress', CAST(:progress AS jsonb))
    FROM changed
)
SELECT id FROM changed;

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

-- name: dead_page
-- One keyset page of dead jobs, for the DLQ list's reconciliation.
SELECT d.job_id AS id, j.queue
FROM taskline.dead_letter_jobs d JOIN taskline.jobs j ON j.id = d.job_id
WHERE d.job_id > :after AND j.status = 'dead' AND j.updated_at < :before
ORDER BY d.job_id
LIMIT :limit;

-- name: statuses
-- Status, queue and open-lease worker of the given ids (absent ids are simply missing).
SELECT j.id, j.status, j.queue, j.priority, j.updated_at,
       (SELECT l.worker_id FROM taskline.live_leases l WHERE l.job_id = j.id
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

-- name: upsert_worker
-- Register a worker at start-up, with the port its metrics are served on (NULL: off).
INSERT INTO taskline.workers (id, hostname, pid, queues, concurrency, started_at, last_heartbeat,
                              metrics_port)
VALUES (:id, :hostname, :pid, CAST(:queues AS text[]), :concurrency, now(), now(), :metrics_port)
ON CONFLICT (id) DO UPDATE SET last_heartbeat = now(), stopped_at = NULL,
                               metrics_port = EXCLUDED.metrics_port;

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

-- name: next_lease_expiry
-- Seconds (PostgreSQL time) until the earliest live lease ends; NULL if none.
SELECT extract(epoch FROM min(leased_until) - now())::float8 AS seconds FROM taskline.live_leases;

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

-- name: ping
-- Readiness probe.
SELECT 1;

-- name: database_now
-- PostgreSQL's time of the current transaction (a workflow step's run_at against it).
SELECT now() AS now;

-- name: insert_audit
-- Append one operator action to the audit trail; returns the record as stored.
INSERT INTO taskline.audit_log (actor, action, target, detail)
VALUES (:actor, :action, :target, CAST(:detail AS jsonb))
RETURNING id, at, actor, action, target, detail;

-- name: list_audit
-- Audit records newest first, optionally of one actor or action, paged by the (at, id) of the previous page's last row.
SELECT id, at, actor, action, target, detail FROM taskline.audit_log
WHERE (CAST(:actor AS text) IS NULL OR actor = :actor)
  AND (CAST(:action AS text) IS NULL OR action = :action)
  AND (CAST(:after_at AS timestamptz) IS NULL
       OR (at, id) < (CAST(:after_at AS timestamptz), CAST(:after_id AS uuid)))
ORDER BY at DESC, id DESC
LIMIT :limit;

-- name: delete_expired_audit
-- Delete up to :limit audit records older than :retain_s seconds, oldest first (retention).
DELETE FROM taskline.audit_log WHERE id IN (
    SELECT id FROM taskline.audit_log
    WHERE at < now() - make_interval(secs => :retain_s)
    ORDER BY at, id LIMIT :limit
    FOR UPDATE SKIP LOCKED)
RETURNING id;

-- Workflows (taskline.workflows): steps are jobs naming their workflow; job_dependencies holds
-- the edges; jobs.pending_parents counts a waiting step's parents that have not succeeded yet.

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
), fresh AS MATERIALIZED (
    -- The queue limit, as in insert_jobs_with_events: only the input's queues without a
    -- queued or running job may add a queue, so only then are the queues counted.
    SELECT t.queue FROM (SELECT DISTINCT queue FROM input OFFSET 0) t  -- each queue once
    WHERE NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'queued'
                      OFFSET 0)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = t.queue AND j.status = 'running'
                      OFFSET 0)
), refused AS MATERIALIZED (
    SELECT f.queues
    FROM (SELECT array_agg(queue ORDER BY queue) AS queues, count(*) AS n FROM fresh) f,
         LATERAL (SELECT count(DISTINCT j.queue) AS active,
                         count(DISTINCT j.queue) FILTER (WHERE j.queue = ANY(f.queues)) AS present
                  FROM taskline.jobs j
                  WHERE f.n > 0
                    AND j.status IN ('queued', 'scheduled', 'retrying', 'running', 'waiting')) a
    WHERE f.n > a.present AND a.active + f.n - a.present > :max_queues
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
-- name: upsert_schedule
-- Create or replace a schedule; `created` says which. A change of cron, time zone or a resume
-- moves `since` to now (slots at or before it never fire); an unchanged definition keeps it, so
-- the declarations upserted at every maintenance start lose no missed slot. A replaced schedule
-- is no longer one of the code's (declared_in_code NULL) until mark_declared_schedules says so.
INSERT INTO taskline.schedules (name, cron, timezone, job, paused, catch_up, since)
VALUES (:name, :cron, :timezone, CAST(:job AS jsonb), :paused, :catch_up, now())
ON CONFLICT (name) DO UPDATE SET
    cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, job = EXCLUDED.job,
    paused = EXCLUDED.paused, catch_up = EXCLUDED.catch_up, declared_in_code = NULL,
    since = CASE WHEN schedules.cron <> EXCLUDED.cron OR schedules.timezone <> EXCLUDED.timezone
                      OR (schedules.paused AND NOT EXCLUDED.paused)
                 THEN now() ELSE schedules.since END,
    revision = schedules.revision + 1, updated_at = now()
RETURNING *, (xmax = 0) AS created, now() AS db_now;

-- name: get_schedule
-- One schedule by name, with PostgreSQL's clock.
SELECT *, now() AS db_now FROM taskline.schedules WHERE name = :name;

-- name: list_schedules
-- Schedules by name, paged by the previous page's last name.
SELECT *, now() AS db_now FROM taskline.schedules
WHERE CAST(:after AS text) IS NULL OR name > :after
ORDER BY name
LIMIT :limit;

-- name: count_schedules
-- How many schedules there are (TASKLINE_MAX_SCHEDULES), as the caller's transaction sees them.
SELECT count(*) AS n FROM taskline.schedules;

-- name: delete_schedule
-- Remove a schedule; its fired slots keep their record and its jobs stay. Returns it if removed.
DELETE FROM taskline.schedules WHERE name = :name RETURNING name;

-- name: active_schedules
-- Every schedule that is not paused, with PostgreSQL's clock: what the scheduler judges.
SELECT name, cron, timezone, job, catch_up, since, revision, last_slot, now() AS db_now
FROM taskline.schedules WHERE NOT paused ORDER BY name;

-- name: fire_slot
-- Fire one slot of a schedule still at :revision and not paused: the slot's row, its job (a
-- new queued job carrying the schedule and the slot instant) with its first event, and the
-- schedule's last slot, in one statement. A slot already recorded inserts nothing: no row.
WITH input AS (
    SELECT CAST(:queue AS text) AS queue
), fresh AS MATERIALIZED (
    -- The queue limit, as in insert_jobs_with_events: a slot whose job would add a queue past
    -- :max_queues inserts nothing, and returns one row with `refused`.
    SELECT i.queue FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = i.queue AND j.status = 'queued'
                      OFFSET 0)
      AND NOT EXISTS (SELECT 1 FROM taskline.jobs j WHERE j.queue = i.queue AND j.status = 'running'
                      OFFSET 0)
), refused AS MATERIALIZED (
    SELECT f.queues
    FROM (SELECT array_agg(queue ORDER BY queue) AS queues, count(*) AS n FROM fresh) f,
         LATERAL (SELECT count(DISTINCT j.queue) AS active,
                         count(DISTINCT j.queue) FILTER (WHERE j.queue = ANY(f.queues)) AS present
                  FROM taskline.jobs j
                  WHERE f.n > 0
                    AND j.status IN ('queued', 'scheduled', 'retrying', 'running', 'waiting')) a
    WHERE f.n > a.present AND a.active + f.n - a.present > :max_queues
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

-- name: testing_enqueued
-- The jobs visible to the caller's transaction whose id was made at or after :floor (ids are time-ordered UUIDv7s made on the enqueuing host), of :type when given, oldest first: taskline.testing.enqueued.
SELECT id, type, queue, payload, priority, status, next_run_at, idempotency_key, created_at
FROM taskline.jobs
WHERE id >= CAST(:floor AS uuid) AND (CAST(:type AS text) IS NULL OR type = CAST(:type AS text))
ORDER BY id;

-- name: testing_skip_backoff
-- Make every retrying job due now (taskline.testing.drain with skip_backoff): its backoff is waived, nothing else changes.
UPDATE taskline.jobs SET next_run_at = now() WHERE status = 'retrying' AND next_run_at > now();

-- name: testing_tables
-- The tables of the installation but its migration version table: what taskline.testing empties after each test.
SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = :schema AND tablename <> 'alembic_version' ORDER BY tablename;

-- name: job_outcome
-- One job's state and outcome, by primary key: what taskline.wait reads after each signal.
SELECT status, result, last_error, attempts FROM taskline.jobs WHERE id = CAST(:id AS uuid);

-- name: mark_declared_schedules
-- At maintenance start, after upserting the code's declarations: the schedules named :names are
-- declared in code, and those the code declared before but not now are no longer; returns every
-- schedule the code declares or once did, with its mark.
UPDATE taskline.schedules SET declared_in_code = (name = ANY(CAST(:names AS text[])))
WHERE name = ANY(CAST(:names AS text[])) OR declared_in_code IS NOT NULL
RETURNING name, declared_in_code;

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
