"""The index workers claim through while Redis is unreachable: `jobs_claimable`.

A worker that cannot reach Redis claims the most urgent queued jobs of its queues straight from
PostgreSQL (`due_queued_ids` in store/sql/attempts.sql: one queue,
`ORDER BY priority DESC, created_at, id`, `FOR UPDATE SKIP LOCKED`). The partial index on
(queue, priority DESC, created_at, id) WHERE status = 'queued' hands them over in that order,
so a claim reads the rows it takes and no more, with a million jobs queued or none.

Online on a 100-million-row `jobs`: built with CREATE INDEX CONCURRENTLY, outside a
transaction (alembic's `autocommit_block`; migrations/env.py holds its advisory lock for the
whole session); enqueues, claims and completions go on while it builds. A build that failed
leaves an INVALID index behind: it is dropped and built again on the next run. The index is
partial, so it holds the queued jobs only, a small share of the table.

Rolling deploy beside the previous release: nothing the previous release reads or writes
changes (no column, no constraint); it never runs `due_queued_ids`, and a new worker that
claims from PostgreSQL before the index exists is correct, only slower.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 12:40:00
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

INDEXES = {
    "jobs_claimable": "ON jobs (queue, priority DESC, created_at, id) WHERE status = 'queued'",
}


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, definition in INDEXES.items():
            build_index(name, definition)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
