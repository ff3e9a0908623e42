"""Queue pause: the table of paused queues, and the claim rule as one view, claimable_jobs.

`queue_pauses` holds one row per paused queue (any name, also one that holds no job yet); a
resume deletes the row. `claimable_jobs` is the one rule every claim applies, whichever path
found the job (an id fetched from Redis, or a job picked straight from PostgreSQL): queued, and
its queue not paused. It lists the columns a claim chooses by (id, queue, priority, created_at),
never `*`, so a column added to `jobs` later needs no new view.

Online on a 100-million-row `jobs`: CREATE TABLE and CREATE VIEW touch the catalog only; no
existing table is locked beyond that or rewritten.

Rolling deploy beside the previous release: its API has no pause routes and its workers claim
through their own statement, which does not read the view; a queue paused while such a worker
still runs keeps being served by that worker until it is replaced (docs/maintenance.md). This
release's workers honour the pause at once.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 12:40:00
"""

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

QUEUE_PAUSES = """
CREATE TABLE IF NOT EXISTS queue_pauses (
    queue text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    actor text
)
"""

# `status = 'queued'` is literal so a claim's candidates are served by the partial index
# jobs_pending_id (the planner proves the view's predicate implies the index's).
CLAIMABLE_JOBS = """
CREATE OR REPLACE VIEW claimable_jobs AS
SELECT j.id, j.queue, j.priority, j.created_at FROM jobs j
WHERE j.status = 'queued'
  AND NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
"""


def upgrade() -> None:
    op.execute(QUEUE_PAUSES)
    op.execute(CLAIMABLE_JOBS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS claimable_jobs")
    op.execute("DROP TABLE IF EXISTS queue_pauses")
