"""`jobs_status_created` narrowed to the jobs that are not succeeded.

What used it: `list_jobs` filtered by status (GET /api/v1/jobs?status=, the dashboard's lists
by state), newest first, and counts of one state (`waiting` per queue). For a rare state
(dead, cancelled, running, waiting...) the index finds a page of them without reading the
jobs of other states; for `succeeded`, most of the table, a backward read of `jobs_created`
finds a page at once, so the index entry every succeeded job paid (about 256 bytes a job,
written at enqueue and at each state change) bought nothing. The narrowed index
`jobs_status_created_not_succeeded` holds the other states only: the planner proves
`status = 'dead'` implies its predicate. Under a generic plan `list_jobs`'s optional filter
(`:status IS NULL OR status = :status`) used neither index, as before.

Online: CREATE INDEX CONCURRENTLY of the new one, then DROP INDEX CONCURRENTLY of the old one,
outside a transaction; neither blocks writes. A build that failed leaves an INVALID index,
dropped and built again on the next run. The previous release names neither index.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03 17:00:00
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None

OLD = "jobs_status_created"
NEW = "jobs_status_created_not_succeeded"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        build_index(NEW, "ON jobs (status, created_at, id) WHERE status <> 'succeeded'")
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {OLD}")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        build_index(OLD, "ON jobs (status, created_at, id)")
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NEW}")
