"""The queue limit counts queues, not jobs: an index of the queues holding parked jobs.

The queue limit (TASKLINE_MAX_QUEUES) counts the queues holding unfinished jobs whenever a write
goes to a queue without a queued or running job. It counted them as `count(DISTINCT queue)`
over every unfinished job: beside 200,000 queued jobs, each single enqueue to an empty queue
read them all (60 ms against 0.3 ms). It now reads one probe per queue: a skip scan of
`jobs_claimable` for the queued jobs, of `jobs_parked_queue` (queue) over scheduled, retrying
and waiting jobs, and the running jobs, at most the workers' slots (store/sql/jobs.sql,
queue_limit_ctes). A job that is only queued, run and finished never enters the new index, so
the common path writes no more than before.

Online on a 100-million-row `jobs`: the index is partial and built with CREATE INDEX
CONCURRENTLY outside a transaction, so no write waits for it; a build that failed leaves an
INVALID index, dropped and built again on the next run.

Rolling deploy beside the previous release: its statements count by job and never read the
index, which it keeps up to date on every write all the same; this release's statements read it
only once it exists, which the migration makes sure of before any of them runs.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05 21:40:00
"""

from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None

NAME = "jobs_parked_queue"
DEFINITION = "ON jobs (queue) WHERE status IN ('scheduled', 'retrying', 'waiting')"


def _drop_if_invalid(name: str) -> None:
    """A CONCURRENTLY build that failed leaves an invalid index; IF NOT EXISTS would keep it."""
    invalid = op.get_bind().exec_driver_sql(
        "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = %(name)s AND c.relnamespace = current_schema()::regnamespace "
        "AND NOT i.indisvalid", {"name": name}).first()
    if invalid:
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def upgrade() -> None:
    with op.get_context().autocommit_block():
        _drop_if_invalid(NAME)
        op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {NAME} {DEFINITION}")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
