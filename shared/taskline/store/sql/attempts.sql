-- An attempt's statements: the claim (a lease opened per job won), the wake-up of workers that
-- dispatch from PostgreSQL, lease renewal, progress, and `settle`, which ends attempts.
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

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

-- name: due_queued_ctes
-- Not a statement: the candidates due_queued_ids locks and due_queued_locked counts
-- (`-- include: due_queued_ctes`), the most urgent queued jobs of queue :queue, at most :limit,
-- FIFO within a priority, by the gates below.
SELECT j.id FROM taskline.jobs j
WHERE j.status = 'queued' AND j.queue = :queue
  AND NOT EXISTS (SELECT 1 FROM taskline.queue_pauses p WHERE p.queue = :queue)
  AND NOT EXISTS (SELECT 1 FROM taskline.flow_limits f WHERE f.scope = 'queue:' || :queue)
  AND ('type:' || j.type) <> ALL (ARRAY(SELECT f.scope FROM taskline.flow_limits f))
  AND j.ordering_key IS NULL  -- keyed jobs start through the budgeted claim, as their key's head
ORDER BY j.priority DESC, j.created_at, j.id
LIMIT :limit

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
-- include: due_queued_ctes
FOR UPDATE SKIP LOCKED;

-- name: due_queued_locked
-- How many of the jobs due_queued_ids would offer another transaction's row lock holds now, which due_queued_ids skips: taskline.testing.drain waits them out rather than end with a due job left (a waiter flagging a job `watched` holds its row for a moment). The rows free now are locked for this statement only.
WITH candidates AS MATERIALIZED (
-- include: due_queued_ctes
), free AS MATERIALIZED (
    SELECT j.id FROM taskline.jobs j WHERE j.id IN (SELECT id FROM candidates)
    FOR UPDATE SKIP LOCKED
)
SELECT (SELECT count(*) FROM candidates) - (SELECT count(*) FROM free) AS locked;

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

-- name: renew_leases
-- Extend the live leases this worker holds; returns each kept lease and its job's cancel flag (busy false), and each lease another transaction holds locked (busy true, not renewed).
-- A lease whose row is locked is skipped, not waited for: an outcome being written locks its
-- lease until its transaction commits, which takes as long as its on_complete hooks and its
-- round trips, and waiting there would hold back the renewal of every other lease in this
-- statement until their leases lapsed. A skipped lease is still live: it is neither renewed
-- nor lost, and the next renewal tries it again.
-- Each read of the leases also bounds their ids by :lease_min and :lease_max (the ids' lowest
-- and highest): a generic plan prunes the history partitions by such bounds when it starts,
-- where by the id array alone it scans every partition (migration 0021; docs/performance.md,
-- change 127).
WITH free AS (
    SELECT l.id FROM taskline.live_leases_by_id l
    WHERE l.id = ANY(CAST(:lease_ids AS bigint[])) AND l.worker_id = :worker_id
      AND l.id BETWEEN CAST(:lease_min AS bigint) AND CAST(:lease_max AS bigint)
    FOR UPDATE OF l SKIP LOCKED
), renewed AS (
    UPDATE taskline.live_leases_by_id l
    SET leased_until = clock_timestamp() + make_interval(secs => :lease_s)
    FROM free, taskline.jobs j
    WHERE l.id = free.id AND j.id = l.job_id
      AND l.id = ANY(CAST(:lease_ids AS bigint[]))
      AND l.id BETWEEN CAST(:lease_min AS bigint) AND CAST(:lease_max AS bigint)
    RETURNING l.id AS lease_id, j.cancel_requested
)
SELECT lease_id, cancel_requested, false AS busy FROM renewed
UNION ALL
SELECT l.id, NULL, true FROM taskline.live_leases_by_id l
WHERE l.id = ANY(CAST(:lease_ids AS bigint[])) AND l.worker_id = :worker_id
  AND l.id BETWEEN CAST(:lease_min AS bigint) AND CAST(:lease_max AS bigint)
  AND l.id NOT IN (SELECT id FROM free);

-- name: settle
-- End attempts on their live lease only: the lease closed with its outcome, the job moved to
-- its settlement's status, the DLQ row of a dead one upserted, finished_at stamped by a move
-- that finishes the job (and cleared by one that does not), one event each; returns the jobs
-- it changed. :settlements is a JSON object keyed by lease id (each settlement names its
-- worker, status, event, outcome, error, result, delay and detail, and the flags its move
-- implies); :lease_ids lists the same leases, :lease_min and :lease_max their lowest and
-- highest id (the partitions' pruning, as in renew_leases). Each lease is found by primary key
-- and its settlement by key, so no join with a recordset of unknown size is planned (the
-- planner reads one as 100 rows and hash-joins it with every open lease, dead index entries
-- included).
-- `lapsed` settlements (the reaper's) settle only a lease whose time has run out.
WITH input AS MATERIALIZED (
    SELECT CAST(:settlements AS jsonb) AS doc
), leases AS (
    UPDATE taskline.live_leases_by_id l
    SET released_at = clock_timestamp(), outcome = input.doc -> l.id::text ->> 'outcome'
    FROM input
    WHERE l.id = ANY(CAST(:lease_ids AS bigint[]))
      AND l.id BETWEEN CAST(:lease_min AS bigint) AND CAST(:lease_max AS bigint)  -- pruning
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
    -- unfinished job of its key: the first entry of jobs_ordering_line past the finished
    -- one's, so the line is never read whole or sorted), when queued, is returned to be
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

-- name: settle_succeeded
-- `settle` for a batch of plain successes (no workflow step, no ordering key): the same fenced moves, without the settlement document.
-- Each lease is found by primary key through the fence, as in `settle`; the batch's worker and
-- its move (:status, :event, :outcome: taskline.transitions' SUCCEED) are parameters of the
-- statement, not fields of each row, and :results is a JSON object holding only the results
-- that are not null, keyed by lease id. What `settle` reads from each settlement is, for such
-- a success, the same for every row: no attempt refunded, no snooze, no delay, no dead letter,
-- the result written (JSON null when absent, as `settle` stores it) and last_error cleared,
-- finished_at stamped. `settle` parses a document of every field of every settlement and reads
-- it about twelve times a row; at 15 successes a statement that was a third of its PostgreSQL
-- CPU (docs/performance.md, change 134). A plain job passes no turn and releases no step, so
-- the output's turn columns are null.
WITH input AS MATERIALIZED (
    SELECT CAST(:results AS jsonb) AS doc
), leases AS (
    UPDATE taskline.live_leases_by_id l
    SET released_at = clock_timestamp(), outcome = :outcome
    WHERE l.id = ANY(CAST(:lease_ids AS bigint[]))
      AND l.id BETWEEN CAST(:lease_min AS bigint) AND CAST(:lease_max AS bigint)  -- pruning
      AND l.worker_id = :worker_id
    RETURNING l.id AS lease_id, l.job_id, l.attempt, l.worker_id
), changed AS (
    UPDATE taskline.jobs j
    SET status = :status,
        result = COALESCE(input.doc -> leases.lease_id::text, 'null'::jsonb),
        last_error = NULL,
        finished_at = now(),
        updated_at = now()
    FROM leases, input WHERE j.id = leases.job_id AND (j.status = 'running') IS TRUE
    RETURNING j.id, j.queue, j.priority, j.attempts, j.status, j.next_run_at, leases.lease_id,
              leases.attempt, leases.worker_id
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, worker_id)
    SELECT id, attempt, :event, worker_id FROM changed
)
SELECT c.id, c.queue, c.priority, c.attempts, c.status, c.lease_id, c.worker_id,
       (extract(epoch FROM c.next_run_at) * 1000)::bigint AS due_ms,
       CAST(NULL AS uuid) AS turn_id, CAST(NULL AS smallint) AS turn_priority
FROM changed c;

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
-- no job without a key already queued in its queue at least as urgent (one probe of
-- jobs_plain_queued: through jobs_claimable the test read every queued keyed job of the queue
-- to find none, 60 of a 76 ms statement behind a 5,000-job keyed backlog). A turn not started
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

-- name: write_progress
-- A running attempt's progress (`ctx.progress`), only while its lease is live (live_leases_by_id,
-- the fence), with its event :event (detail.progress); returns the job only when written.
WITH changed AS (
    UPDATE taskline.jobs j SET progress = CAST(:progress AS jsonb)
    FROM taskline.live_leases_by_id l
    WHERE l.id = :lease_id AND l.worker_id = :worker_id AND j.id = l.job_id
      AND (j.status = ANY(CAST(:sources AS text[]))) IS TRUE
    RETURNING j.id, j.attempts
), events AS (
    INSERT INTO taskline.job_events (job_id, attempt, event, worker_id, detail)
    SELECT id, attempts, :event, :worker_id, jsonb_build_object('progress', CAST(:progress AS jsonb))
    FROM changed
)
SELECT id FROM changed;
