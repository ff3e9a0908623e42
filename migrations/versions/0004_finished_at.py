"""Retention's clock: jobs.finished_at, and the two indexes retention reads jobs through.

`finished_at` is the instant a job reached its terminal state (succeeded, dead, cancelled), set
only by its terminal transition and cleared by a requeue of a dead job. Retention deletes a job
once it is older than its status's retention, reading it through `jobs_finished`
(status, finished_at), so a pass never scans the table.

Online on a 100-million-row `jobs`:
- ADD COLUMN without a default changes the catalog only (no rewrite). It still needs a brief
  ACCESS EXCLUSIVE lock, so `lock_timeout` makes it fail fast instead of queueing every claim
  and enqueue behind a long query; run `taskline migrate` again when it does.
- Both indexes are built with CREATE INDEX CONCURRENTLY, outside a transaction (alembic's
  `autocommit_block`; migrations/env.py holds its advisory lock for the whole session, so the
  lock survives the commit). A build that failed leaves an INVALID index behind: it is dropped
  and built again on the next run.

Rolling deploy beside the previous release, which never sets `finished_at`: jobs it finishes
(and every job finished before this migration) keep `finished_at` NULL. Retention counts those
from `updated_at` (a terminal row's last change is its terminal transition), read through the
partial index `jobs_finished_unstamped`, which holds exactly them: empty once the previous
release is gone, and a later release can drop it. Nothing is rewritten to backfill the column.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 10:15:00
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "10s"
"""Longest wait for the catalog change's lock; past it the migration fails and can be re-run."""
INDEXES = {
    "jobs_finished": "ON jobs (status, finished_at) WHERE finished_at IS NOT NULL",
    "jobs_finished_unstamped": "ON jobs (status, updated_at) WHERE finished_at IS NULL "
                               "AND status IN ('succeeded', 'dead', 'cancelled')",
}


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS finished_at timestamptz")
    with op.get_context().autocommit_block():
        for name, definition in INDEXES.items():
            build_index(name, definition)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS finished_at")
