"""The attempt fence as one view: live_leases, the leases that still fence a running attempt.

Online: CREATE VIEW takes no lock on jobs or job_leases beyond a catalog entry, rewrites
nothing and is instant on any table size. A release running beside the previous one is safe:
the previous version never reads the view, and this one writes the same rows it did.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:40:00
"""

from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

# A lease fences its attempt while it is open and its job is still running that very attempt.
# `(status = 'running') IS TRUE` is the status test no index can serve, so the job is found by
# its primary key (see taskline/store/sql/jobs.sql). One table in FROM: the view is automatically updatable,
# so the settle and renewal statements UPDATE through it and the fence is written only here.
LIVE_LEASES = """
CREATE OR REPLACE VIEW live_leases AS
SELECT l.* FROM job_leases l
WHERE l.released_at IS NULL
  AND EXISTS (SELECT 1 FROM jobs j
              WHERE j.id = l.job_id AND (j.status = 'running') IS TRUE
                AND j.attempts = l.attempt)
"""


def upgrade() -> None:
    op.execute(LIVE_LEASES)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS live_leases")
