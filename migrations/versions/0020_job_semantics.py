"""New job semantics: ordering keys (`jobs.ordering_key`, `jobs.ordered_at`, the index of keyed
unfinished jobs, the claim rule's head gate); snoozes (`jobs.snoozes`); tags (`jobs.tags` and
its index); progress (`jobs.progress`); expiry (`jobs.expires_at`, `jobs.start_within_s`,
the claim rule's expiry gate and the index of jobs that may lapse).

Jobs of one queue with the same `ordering_key` start one at a time in enqueue order. A keyed
job's place in line is `COALESCE(ordered_at, created_at), id`: `ordered_at` stays NULL until a
dead job is requeued from the DLQ (it then takes a new place at the back). The claim rule
(`claimable_rule`) lets a keyed job through only as its key's head: no job of its key is
running, and none still unfinished (queued, scheduled, retrying) stands before it; a `waiting`
workflow step takes its place when it is released. A keyed job counts as `limited`: the plain
claim from Redis refuses it, and the budgeted claim (Store.claim_held) starts it under a
per-key transaction lock, so two claimers never both see their key free. `snoozes` counts the
times a job's handler raised `taskline.Snooze` (TASKLINE_MAX_SNOOZES bounds them). `tags`
(up to 20 strings) is what `GET /api/v1/jobs?tag=` filters by, through the GIN index
`jobs_tags` of the jobs that have tags. `progress` holds the last value a running handler
reported (`ctx.progress`). A job not started by `expires_at` is refused by the claim rule (in
PostgreSQL's clock) and cancelled by maintenance (event `lapsed`) through `jobs_lapsing`; a
workflow step with parents keeps its `start_within_s` until its release sets `expires_at`.

Online on a 100-million-row `jobs`:
- ADD COLUMN of nullable columns, and of `snoozes` with the constant default 0 (PostgreSQL
  11 and later keep a constant default in the catalog), changes the catalog only (no rewrite),
  under a lock held for milliseconds; `lock_timeout` makes it fail fast rather than queue
  every claim behind a long transaction (run `taskline migrate` again).
- `jobs_ordering`, `jobs_tags` and `jobs_lapsing` are built with CREATE INDEX CONCURRENTLY outside a transaction; it holds only
  keyed unfinished jobs, so it starts empty and jobs without a key never enter it. A build that
  failed leaves an INVALID index, dropped and built again on the next run.
- CREATE OR REPLACE VIEW touches the catalog only; the views keep their columns.

Rolling deploy beside the previous release: it neither writes nor reads the new columns (its
settle leaves `snoozes` as it is; its handlers cannot snooze). Its
plain claims read `claimable_rule`, which now refuses keyed jobs to them as `limited`; only this
release's workers start keyed jobs, so run one before enqueueing with `ordering_key`.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03 14:20:00
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"
INDEX = "jobs_ordering"
TAGS_INDEX = "jobs_tags"
LAPSING_INDEX = "jobs_lapsing"
UNFINISHED = "('queued', 'scheduled', 'retrying', 'running')"

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
  AND (j.ordering_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM jobs o
      WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key AND o.id <> j.id
        AND o.status IN {UNFINISHED}
        AND (o.status = 'running'
             OR (COALESCE(o.ordered_at, o.created_at), o.id)
                < (COALESCE(j.ordered_at, j.created_at), j.id))))
"""

CLAIMABLE_RULE_0012 = """
CREATE OR REPLACE VIEW claimable_rule AS
SELECT j.id, j.queue, j.priority, j.created_at,
       EXISTS (SELECT 1 FROM flow_limits f
               WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue)) AS limited,
       j.type, j.limit_key, j.status
FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
"""


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS ordering_key text, "
               "ADD COLUMN IF NOT EXISTS ordered_at timestamptz, "
               "ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0, "
               "ADD COLUMN IF NOT EXISTS tags text[], "
               "ADD COLUMN IF NOT EXISTS progress jsonb, "
               "ADD COLUMN IF NOT EXISTS expires_at timestamptz, "
               "ADD COLUMN IF NOT EXISTS start_within_s double precision")
    op.execute(CLAIMABLE_RULE)
    with op.get_context().autocommit_block():
        build_index(INDEX, "ON jobs (queue, ordering_key) "
                           f"WHERE ordering_key IS NOT NULL AND status IN {UNFINISHED}")
        build_index(LAPSING_INDEX, "ON jobs (expires_at) WHERE expires_at IS NOT NULL "
                                   "AND status IN ('queued', 'scheduled', 'retrying')")
        build_index(TAGS_INDEX, "ON jobs USING gin (tags) WHERE tags IS NOT NULL")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {TAGS_INDEX}")
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {LAPSING_INDEX}")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(CLAIMABLE_RULE_0012)
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS ordering_key, "
               "DROP COLUMN IF EXISTS ordered_at, DROP COLUMN IF EXISTS snoozes, "
               "DROP COLUMN IF EXISTS tags, DROP COLUMN IF EXISTS progress, "
               "DROP COLUMN IF EXISTS expires_at, DROP COLUMN IF EXISTS start_within_s")
