"""Unique jobs and debounce: `jobs.unique_key`, `jobs.debounce_key`, `jobs.coalesced`.

A unique job stores its (principal-scoped) unique key; the enqueue that finds a job of the same
queue holding it, in the states and period it names, writes nothing (taskline.uniqueness). The
index `jobs_unique_key` (queue, unique_key, created_at) serves that lookup; it is not a unique
index because the states and period are the request's, not the row's: the per-key transaction
lock of the enqueue is what makes concurrent requests see each other.

A debounced job stores its debounce key and the payloads that joined it (`coalesced`, a JSON
array, the first payload included); `jobs_debounce` holds only the scheduled ones, the jobs an
arrival may still join, so it stays as small as the number of groups waiting out their delay.

Online on a 100-million-row `jobs`:
- ADD COLUMN of nullable columns without a default changes the catalog only (no rewrite), under
  a lock held for milliseconds; `lock_timeout` makes it fail fast rather than queue every
  enqueue behind a long transaction (run `taskline migrate` again).
- Both indexes are partial (only rows holding a key: none yet) and built with CREATE INDEX
  CONCURRENTLY outside a transaction; a build that failed leaves an INVALID index, dropped and
  built again on the next run.

Rolling deploy beside the previous release: it neither reads nor writes the columns, and it
refuses `unique` and `debounce` as unknown fields (422), so nothing it accepts bypasses them;
its workers run a debounced job but give its handler no `ctx.coalesced` (docs/unique.md,
"Upgrading").

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03 13:40:00
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"
INDEXES = {
    "jobs_unique_key": "ON jobs (queue, unique_key, created_at) WHERE unique_key IS NOT NULL",
    "jobs_debounce": "ON jobs (queue, type, debounce_key) "
                     "WHERE debounce_key IS NOT NULL AND status = 'scheduled'",
}


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS unique_key text, "
               "ADD COLUMN IF NOT EXISTS debounce_key text, "
               "ADD COLUMN IF NOT EXISTS coalesced jsonb")
    with op.get_context().autocommit_block():
        for name, definition in INDEXES.items():
            build_index(name, definition)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS unique_key, "
               "DROP COLUMN IF EXISTS debounce_key, DROP COLUMN IF EXISTS coalesced")
