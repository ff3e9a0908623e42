"""The port each worker serves `/metrics` and `/readyz` on: `workers.metrics_port`.

Several workers on one host cannot all bind the default metrics port: one started without
`--metrics-port` whose default port is taken serves on the next free one, so an operator (and
a scrape configuration) needs to read which port each worker took: `GET /api/v1/workers` and
`taskline workers` show it. NULL: metrics off (`--metrics-port 0`), or a worker of an earlier
release.

Online on any size of `workers`: ADD COLUMN of a nullable column without a default changes the
catalog only (no rewrite, no scan), under a lock held for milliseconds; `lock_timeout` makes it
fail fast rather than wait behind a long transaction (run `taskline migrate` again).

Rolling deploy beside the previous release: that release neither writes nor reads the column
(its `SELECT w.*` gets one more field, which it does not show); this release's workers write
it at registration, so they start after this migration, as every release's do.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 08:30:00
"""

from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE workers ADD COLUMN IF NOT EXISTS metrics_port integer")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE workers DROP COLUMN IF EXISTS metrics_port")
