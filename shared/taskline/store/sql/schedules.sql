-- Schedules' statements: create or replace, read, list, count and remove periodic jobs, and mark
-- those the code declares. Firing a slot writes a job: jobs.sql (fire_slot, fold_slot).
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

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

-- name: mark_declared_schedules
-- At maintenance start, after upserting the code's declarations: the schedules named :names are
-- declared in code, and those the code declared before but not now are no longer; returns every
-- schedule the code declares or once did, with its mark.
UPDATE taskline.schedules SET declared_in_code = (name = ANY(CAST(:names AS text[])))
WHERE name = ANY(CAST(:names AS text[])) OR declared_in_code IS NOT NULL
RETURNING name, declared_in_code;
