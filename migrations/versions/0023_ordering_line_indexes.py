"""Ordering keys read through indexes in line order: every test of a key's line is one probe.

A key's line is its unfinished jobs in `COALESCE(ordered_at, created_at), id` order. Through
`jobs_ordering` (queue, ordering_key) alone, each test read the whole line: settle's `turns`
sorted it to find the next job, the claim rule's head test (`claimable_rule`) visited all of
it, and the turn started in place (`settle_turning`) tested "no job without a key queued at
least as urgent" through `jobs_claimable`, reading every queued keyed job of the queue to find
none (4,872 rows a turn, 60 of the statement's 76 ms in a 5,000-job drain over 100 keys):
- `jobs_ordering_line` (queue, ordering_key, COALESCE(ordered_at, created_at), id) over keyed
  unfinished jobs: the next job in line (`turns`, `turns_after`) is its first entry after the
  finished one, and "none earlier in line" is one probe;
- `jobs_ordering_running` (queue, ordering_key) over running keyed jobs (at most one a key):
  "none of the key running" is one probe, so the view's head test is split in two;
- `jobs_plain_queued` (queue, priority) over queued jobs without a key: "no plain job queued at
  least as urgent" stops at its first entry.
The view keeps its columns and its rule; only the head test's form changes.

Online on a 100-million-row `jobs`: the indexes are partial (the two keyed ones start empty
and jobs without a key never enter them) and built with CREATE INDEX CONCURRENTLY outside a
transaction, so none blocks a write; a build that failed leaves an INVALID index, dropped and
built again on the next run. CREATE OR REPLACE VIEW touches the catalog only, under a
lock_timeout. The indexes are built before the view is replaced, so the view never runs
without them.

Rolling deploy beside the previous release: it reads the same view (same rule) and its
statements order a line by the same expression, so its plans take the new indexes too.
`jobs_ordering` stays: the line index's first two columns serve everything it served, so a
later release can drop it (DROP INDEX CONCURRENTLY) once no process of a release before this
one runs; until then every keyed job pays its entries.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04 20:00:00
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"
UNFINISHED = "('queued', 'scheduled', 'retrying', 'running')"
INDEXES = {
    "jobs_ordering_line": "ON jobs (queue, ordering_key, (COALESCE(ordered_at, created_at)), id) "
                          f"WHERE ordering_key IS NOT NULL AND status IN {UNFINISHED}",
    "jobs_ordering_running": "ON jobs (queue, ordering_key) "
                             "WHERE ordering_key IS NOT NULL AND status = 'running'",
    "jobs_plain_queued": "ON jobs (queue, priority) "
                         "WHERE status = 'queued' AND ordering_key IS NULL",
}

CLAIMABLE_RULE = f"""
CREATE OR REPLACE VIEW claimable_rule AS
SELECT j.id, j.queue, j.priority, j.created_at,
       EXISTS (SELECT 1 FROM flow_limits f
               WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue))
           OR j.ordering_key IS NOT NULL AS limited,
       j.type, j.limit_key, j.status
FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
  AND (j.expires_at IS NULL OR j.expires_at > clock_timestamp())
  AND (j.ordering_key IS NULL OR (
      NOT EXISTS (SELECT 1 FROM jobs o
                  WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key
                    AND o.status IN {UNFINISHED}
                    AND (COALESCE(o.ordered_at, o.created_at), o.id)
                        < (COALESCE(j.ordered_at, j.created_at), j.id))
      AND NOT EXISTS (SELECT 1 FROM jobs o
                      WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key
                        AND o.status = 'running' AND o.id <> j.id)))
"""

CLAIMABLE_RULE_0020 = f"""
CREATE OR REPLACE VIEW claimable_rule AS
SELECT j.id, j.queue, j.priority, j.created_at,
       EXISTS (SELECT 1 FROM flow_limits f
               WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue))
           OR j.ordering_key IS NOT NULL AS limited,
       j.type, j.limit_key, j.status
FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
  AND (j.expires_at IS NULL OR j.expires_at > clock_timestamp())
  AND (j.ordering_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM jobs o
      WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key AND o.id <> j.id
        AND o.status IN {UNFINISHED}
        AND (o.status = 'running'
             OR (COALESCE(o.ordered_at, o.created_at), o.id)
                < (COALESCE(j.ordered_at, j.created_at), j.id))))
"""


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, definition in INDEXES.items():
            build_index(name, definition)
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(CLAIMABLE_RULE)


def downgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(CLAIMABLE_RULE_0020)
    with op.get_context().autocommit_block():
        for name in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
