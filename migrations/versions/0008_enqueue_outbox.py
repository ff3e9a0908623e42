"""The enqueue outbox: jobs written inside an application's transaction, not yet in Redis.

`taskline.enqueue(conn, ...)` inserts a job, its first event and one `enqueue_outbox` row in
one statement on the caller's connection, and signals `NOTIFY taskline_enqueued, '<queue>'`;
PostgreSQL delivers the signal only when that transaction commits, and the row is visible
only then. The active maintenance instance listens, pushes the ids of the rows it finds to
Redis, and only then deletes the rows (taskline_maintenance.outbox).

Online on a 100-million-row `jobs`: this creates one new, empty table and touches no existing
one, so it takes no lock any running query holds and rewrites nothing.

Rolling deploy beside the previous release: the previous release never reads or writes the
table, and its API enqueues push to Redis themselves as before. A job enqueued through the
library while only previous-release maintenance runs waits in the outbox; reconciliation of
either release still finds it (a queued job missing from Redis is pushed), so nothing is lost,
and the first new maintenance instance drains the outbox at its start.

Revision ID: 0008
Revises: 0005
Create Date: 2026-12-01 12:30:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0008'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "enqueue_outbox",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
    )


def downgrade() -> None:
    op.drop_table("enqueue_outbox")
