-- Flow control's statements: flow limits (concurrency and rate budgets, the budgeted claim's
-- candidates and starts) and ordering keys (one job of a key at a time).
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

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
-- other unfinished one, the first entry of jobs_ordering_line) when that one stood behind it
-- and the claim rule now lets it through (queued, its key's head), to be pushed as settle's
-- `turns` are. A job that was not its key's head passes nothing: the head is already in Redis.
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
