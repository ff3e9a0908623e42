"""A write to an idle queue in one statement: `queues_admitted()` judges the queue limit inline.

The library's single enqueue (`enqueue_one_in_transaction`) tested only whether its queue holds
a queued or running job; when it held none (an idle queue, the usual state of a queue whose
workers keep up) the statement wrote nothing and the caller ran two more: the count
(`queue_limit_refused`) and the batch insert again with the limit checked. So every enqueue to
an idle queue cost three round trips and two inserts' planning and setup, one of them wasted
(docs/performance.md). `queues_admitted(fresh, max_queues)` is the verdict of that count for
queues holding no queued or running job (`queues_in_use`, migration 0024): whether writing to
them keeps at most `max_queues` queues with unfinished jobs. The statement calls it as the last
arm of its test, so a queue with work never runs it, and an idle queue is written at once
unless the limit refuses it, when the caller's count names the refused queues as before. A
function call is one expression node: PostgreSQL sets up nothing more per execution, where a
subquery would add plan nodes to every write. STABLE, reading with the calling statement's
snapshot; its body names the schema it is created in, as `queues_in_use` does.

Online on a 100-million-row `jobs`: CREATE OR REPLACE FUNCTION changes the catalog only.

Rolling deploy beside the previous release: its statements call nothing new. This release's
single enqueue calls the function, so this migration runs before any of its processes start
(`taskline migrate`, as for every release). Downgrade drops it.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06 11:10:00
"""

from alembic import op

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"

FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.queues_admitted(fresh text[], max_queues integer)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    n bigint := cardinality(fresh);
    used record;
BEGIN
    SELECT u.active, u.present INTO used FROM {schema}.queues_in_use(fresh) u;
    RETURN NOT (n > used.present AND used.active + n - used.present > max_queues);
END
$$
"""


def upgrade() -> None:
    schema = op.get_bind().exec_driver_sql("SELECT quote_ident(current_schema())").scalar_one()
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(FUNCTION.format(schema=schema))


def downgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("DROP FUNCTION IF EXISTS queues_admitted(text[], integer)")
