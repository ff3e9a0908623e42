-- The audit trail's statements: append an operator's action, list records, delete those past
-- their retention.
-- Each statement has a one-line description; the conventions every file follows (schema-qualified
-- names, status tests next to a job id, moves taken from taskline.transitions) are in jobs.sql's header.

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
