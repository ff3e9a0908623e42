"""Waiting for a result: a job that finishes signals it, so a waiter wakes at the commit; and
`schedules.declared_in_code`, so a `@periodic` removed from the code is seen.

A row trigger on `jobs`, `jobs_finished_notify`, runs `notify_finished()` after an UPDATE of
`status` that moves a job into succeeded, dead or cancelled: it sends the job's id on the channel
`<schema>_finished` (the schema's own, as the enqueue channels are), and the workflow's id too
for a step, at the commit of the transaction that finished it, whichever statement did (the
worker's settle, the reaper, a cancel, a lapse). The API's waiting requests and
`taskline.wait` LISTEN on that channel (taskline.finishing).

Online on a 100-million-row `jobs`: CREATE FUNCTION touches the catalog; CREATE TRIGGER takes a
SHARE ROW EXCLUSIVE lock on `jobs` for the catalog change only (no scan, no rewrite), under
`lock_timeout` so it fails fast instead of queueing writes behind a long transaction (run
`taskline migrate` again). Only UPDATEs whose WHEN clause holds call the function.

`schedules.declared_in_code` (boolean, NULL: never declared in code): true for the schedules the
code maintenance last started with declares, false for those it declared before and no longer
(reported, and deleted with TASKLINE_PRUNE_SCHEDULES=true). ADD COLUMN of a nullable column
without a default changes the catalog only.

Rolling deploy beside the previous release: its statements fire the trigger too (its waits poll
the API and never listen); a previous API ignores `wait_s`; a previous maintenance leaves
`declared_in_code` as it was (the next start of a new one marks it). Downgrade drops all three.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03 13:40:00
"""

from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"

FUNCTION = """
CREATE OR REPLACE FUNCTION notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_finished', NEW.id::text);
    IF NEW.workflow_id IS NOT NULL THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_finished', NEW.workflow_id::text);
    END IF;
    RETURN NULL;
END
$$
"""

TRIGGER = """
CREATE TRIGGER jobs_finished_notify
AFTER UPDATE OF status ON jobs
FOR EACH ROW
WHEN (NEW.status IN ('succeeded', 'dead', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION notify_finished()
"""


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(FUNCTION)
    op.execute("DROP TRIGGER IF EXISTS jobs_finished_notify ON jobs")
    op.execute(TRIGGER)
    op.execute("ALTER TABLE schedules ADD COLUMN IF NOT EXISTS declared_in_code boolean")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_finished_notify ON jobs")
    op.execute("DROP FUNCTION IF EXISTS notify_finished()")
    op.execute("ALTER TABLE schedules DROP COLUMN IF EXISTS declared_in_code")
