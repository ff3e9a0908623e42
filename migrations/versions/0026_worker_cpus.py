"""The CPUs a pinned worker runs on: `workers.cpus`.

`TASKLINE_WORKER_CPUS` (`taskline worker --cpus`) pins a worker process to CPUs, with `auto` a
different one for each process of the host; which CPU a process got was in its start-up log
line and, as a count, in its `taskline_worker_cpus` gauge. An operator looking at the fleet
(`GET /api/v1/workers`, `taskline workers`, the dashboard) sees it beside the worker's host and
pid now. NULL: not pinned (it may run on every CPU of its host), or a worker of an earlier
release.

Online and beside the previous release as 0014's `metrics_port` was: a nullable column added
without a default (a catalog change under a 5 s lock timeout, no rewrite), which the previous
release neither writes nor shows, written by this release's workers at registration.

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
