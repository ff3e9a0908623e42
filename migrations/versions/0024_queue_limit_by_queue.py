"""The queue limit counts queues, not jobs: `queues_in_use()` reads one index probe per queue.

The queue limit (TASKLINE_MAX_QUEUES) counts the queues holding unfinished jobs whenever a write
goes to a queue without a queued or running job. It counted them as `count(DISTINCT queue)`
over every unfinished job: beside 200,000 queued jobs each single enqueue to an empty queue
read them all (57 ms against 0.48 ms now; docs/performance.md). `queues_in_use(fresh)` counts
them by skip scans, one probe per queue: of `jobs_claimable` for the queued jobs, of the new
`jobs_parked_queue` (queue) over scheduled, retrying and waiting jobs, and of the running jobs,
at most the workers' slots. A job that is only queued, run and finished never enters the new
index, so the common path writes no more than before. It is a function rather than CTEs of the
writing statements (store/sql/jobs.sql, queue_limit_ctes): PostgreSQL sets up every node of a
statement's plan on each call, run or not, and as CTEs the count made every write 7 % slower;
a PL/pgSQL function keeps its plan for the session and runs only when called. STABLE: it reads
with the calling statement's snapshot. Its body names the tables with the schema it is created
in, so it depends on no connection's `search_path` (a SET clause on the function would, and
costs each call a settings change).

Online on a 100-million-row `jobs`: the index is partial and built with CREATE INDEX
CONCURRENTLY outside a transaction, so no write waits for it; a build that failed leaves an
INVALID index, dropped and built again on the next run. CREATE OR REPLACE FUNCTION changes the
catalog only.

Rolling deploy beside the previous release: its statements count by job and call nothing new;
they keep the new index up to date like any other. This release's statements call the
function, so this migration runs before any of its processes start (`taskline migrate`, as for
every release). Downgrade drops both.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05 21:40:00
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"
INDEX = "jobs_parked_queue"
INDEX_DEFINITION = "ON jobs (queue) WHERE status IN ('scheduled', 'retrying', 'waiting')"
PARKED = "('scheduled', 'retrying', 'waiting')"

FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.queues_in_use(fresh text[], OUT active bigint, OUT present bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    WITH RECURSIVE queued (queue) AS (
        (SELECT j.queue FROM {schema}.jobs j WHERE j.status = 'queued' ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM {schema}.jobs j WHERE j.status = 'queued' AND j.queue > q.queue
                ORDER BY j.queue LIMIT 1)
        FROM queued q WHERE q.queue IS NOT NULL
    ), parked (queue) AS (
        (SELECT j.queue FROM {schema}.jobs j WHERE j.status IN {parked} ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM {schema}.jobs j WHERE j.status IN {parked} AND j.queue > q.queue
                ORDER BY j.queue LIMIT 1)
        FROM parked q WHERE q.queue IS NOT NULL
    )
    SELECT count(*), count(*) FILTER (WHERE a.queue = ANY(fresh)) INTO active, present
    FROM (SELECT queue FROM queued
          UNION SELECT queue FROM parked
          UNION SELECT j.queue FROM {schema}.jobs j WHERE j.status = 'running') a
    WHERE a.queue IS NOT NULL;
END
$$
"""


def upgrade() -> None:
    with op.get_context().autocommit_block():
        build_index(INDEX, INDEX_DEFINITION)
    schema = op.get_bind().exec_driver_sql("SELECT quote_ident(current_schema())").scalar_one()
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(FUNCTION.format(schema=schema, parked=PARKED))


def downgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("DROP FUNCTION IF EXISTS queues_in_use(text[])")
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
