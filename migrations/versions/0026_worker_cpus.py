"""The CPUs a pinned worker runs on: `workers.cpus`.

`TASKLINE_WORKER_CPUS` (`taskline worker --cpus`) pins a worker process to CPUs, with `auto` a
different one for each process of the host; which CPU a process got was in its start-up log
line and, as a count, in its `taskline_worker_cpus` gauge. An operator looking at the fleet
(`GET /api/v1/workers`, `taskline workers`, the dashboard) sees it beside the worker's host and
pid now. NULL: not pinned (it may run on every CPU of its host), or a worker of an earlier
release.

Online on any size of `workers`: ADD COLUMN of a nullable column without a default changes the
catalog only (no rewrite, no scan), under a lock held for milliseconds; `lock_timeout` makes it
fail fast rather than wait behind a long transaction (run `taskline migrate` again).

Rolling deploy beside the previous release: that release neither writes nor reads the column
(its `SELECT w.*` gets one more field, which it does not show); this release's workers write
it at registration, so they start after this migration, as every release's do.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06 18:20:00
"""

from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE workers ADD COLUMN IF NOT EXISTS cpus integer[]")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE workers DROP COLUMN IF EXISTS cpus")
