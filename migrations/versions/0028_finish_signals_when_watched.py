"""A finish is signalled only for a job someone waits for: `jobs.watched`.

0017's row trigger sent every finished job's id on `<schema>_finished`, waited on or not: a
plpgsql call and a NOTIFY per job, and at each commit that finished jobs PostgreSQL's
database-wide NOTIFY lock and queue write. With nobody listening that was 5 - 8 % of the
machine's CPU per job in a drain of Redis round-trip jobs (docs/performance.md, change 133). A
waiter now flags what it waits for before it reads its state (`watched`: the job, or a
workflow's unfinished steps; taskline.finishing), and `jobs_finished_notify`'s WHEN clause fires
only for a flagged row, so an unwatched job's finish costs the clause's test and nothing else.
Whatever finishes a flagged job (the worker's settle, the reaper, a cancel, a lapse) still
signals it at that commit, as before.

`watched` is a nullable boolean without a default (NULL: nobody asked). Online on a
100-million-row `jobs`: ADD COLUMN without a default changes the catalog only; the trigger is
dropped and created again in the same transaction, under SHARE ROW EXCLUSIVE on `jobs` for the
catalog change only (no scan, no rewrite), behind a 5 s lock_timeout so it fails fast rather
than queue writes behind a long transaction (run `taskline migrate` again).

Rolling deploy beside the previous release: its processes neither write nor read `watched`; its
settles, reaper and cancels fire the trigger for the jobs this release's waiters flag. Its own
waiters (an API's `wait_s`, `taskline.wait`) flag nothing, so until they are replaced they learn
of a finish at their next look rather than at the commit: the API's at the end of `wait_s`
(30 s at most), `taskline.wait` within 30 s. Downgrade restores 0017's trigger, then drops the
column.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07 06:20:00
"""

from importlib import import_module

from alembic import op

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"

TRIGGER = """
CREATE TRIGGER jobs_finished_notify
AFTER UPDATE OF status ON jobs
FOR EACH ROW
WHEN (NEW.watched IS TRUE AND NEW.status IN ('succeeded', 'dead', 'cancelled')
      AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION notify_finished()
"""

# What the downgrade restores: 0017's trigger, as that migration wrote it.
TRIGGER_0017 = import_module("taskline_migrations.versions.0017_finish_notifications").TRIGGER


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS watched boolean")
    op.execute("DROP TRIGGER IF EXISTS jobs_finished_notify ON jobs")
    op.execute(TRIGGER)


def downgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("DROP TRIGGER IF EXISTS jobs_finished_notify ON jobs")
    op.execute(TRIGGER_0017)
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS watched")
