"""Schedules: the `schedules` table, the `schedule_slots` record of fired slots, and the two
nullable columns `jobs.schedule` / `jobs.scheduled_for` a slot's job carries.

`schedule_slots` is keyed by (schedule, slot): a slot's row and its job are inserted by one
statement, so a second insert for the same slot (another maintenance instance, a restart, a
leader change) inserts neither. Nothing deletes from it: retention deletes jobs, never slots,
so a slot whose job was deleted still cannot fire again. It has no foreign key to `jobs` for
the same reason, nor to `schedules` (a deleted schedule's slots keep their record).

Online on a 100-million-row `jobs`: two new tables (no lock on anything existing) and two
ADD COLUMN without a default, which change the catalog only (no rewrite) under a brief ACCESS
EXCLUSIVE lock; `lock_timeout` makes that fail fast instead of queueing every claim and enqueue
behind a long query (run `taskline migrate` again then). No index is added to `jobs`.

Rolling deploy beside the previous release: it never reads the new tables (it has no scheduler
and no schedule routes) and never names the new columns (its inserts list their columns, so
they stay NULL; its `SELECT *` readers ignore columns they do not know). A job it inserts is a
job without a schedule, which is what it is.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:30:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "10s"
"""Longest wait for the catalog change's lock; past it the migration fails and can be re-run."""


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS schedule text")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS scheduled_for timestamptz")
    op.create_table(
        "schedules",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("cron", sa.Text, nullable=False),
        sa.Column("timezone", sa.Text, nullable=False),
        sa.Column("job", JSONB, nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("catch_up", sa.Text, nullable=False, server_default=sa.text("'latest'")),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("revision", sa.BigInteger, nullable=False, server_default=sa.text("1")),
        sa.Column("last_slot", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", UUID(as_uuid=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.CheckConstraint("catch_up IN ('latest', 'none')", name="schedules_catch_up_valid"),
    )
    op.create_table(
        "schedule_slots",
        sa.Column("schedule", sa.Text, primary_key=True),
        sa.Column("slot", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("job_id", UUID(as_uuid=True), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
    )


def downgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.drop_table("schedule_slots")
    op.drop_table("schedules")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS scheduled_for")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS schedule")
