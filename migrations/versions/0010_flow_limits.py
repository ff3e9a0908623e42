"""Flow control: cluster-wide rate and concurrency limits per job type or queue.

- `flow_limits`: one row per scope (`type:<type>` or `queue:<queue>`) with its `concurrency`,
  its rate (`rate_limit` starts per `period_s`) and `per_key`. A claim of limited jobs locks the
  rows of the scopes it may take budget from, so two claimers never both see the same budget.
- `flow_starts`: one row per start of a rate-limited scope (and key), written by the claim that
  started it, pruned by later claims once older than the scope's period: the sliding window is
  counted here, so no index on `job_leases` is needed and unlimited jobs write nothing.
- `jobs.limit_key`: the budget a job draws from under a `per_key` limit (NULL shares one).
- `claimable_jobs` (the claim rule, migration 0009) gains `limited`, `type` and `limit_key`:
  a limited job is claimed only through the budgeted claim, never by the plain one.

Online on a 100-million-row `jobs`: CREATE TABLE and CREATE OR REPLACE VIEW touch the catalog
only; ADD COLUMN without a default rewrites nothing and takes its brief ACCESS EXCLUSIVE lock
under `lock_timeout`, so a long query makes it fail fast (run `taskline migrate` again) instead
of queueing claims behind it.

Rolling deploy beside the previous release: it never reads `flow_limits`, so its workers keep
claiming limited jobs without budget until they are replaced (limits bind the workers of this
release); its API ignores `limit_key` (a client sending it to an old API gets a 422 and can
retry). This release's claim reads only the new columns it adds.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:45:00
"""

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "10s"

FLOW_LIMITS = """
CREATE TABLE IF NOT EXISTS flow_limits (
    scope text PRIMARY KEY,
    concurrency integer CHECK (concurrency >= 1),
    rate_limit integer CHECK (rate_limit >= 1),
    period_s double precision CHECK (period_s > 0),
    per_key boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT flow_limits_scope_kind CHECK (scope LIKE 'type:%' OR scope LIKE 'queue:%'),
    CONSTRAINT flow_limits_something CHECK (concurrency IS NOT NULL OR rate_limit IS NOT NULL),
    CONSTRAINT flow_limits_rate_period CHECK ((rate_limit IS NULL) = (period_s IS NULL))
)
"""

FLOW_STARTS = """
CREATE TABLE IF NOT EXISTS flow_starts (
    scope text NOT NULL,
    limit_key text NOT NULL DEFAULT '',
    started_at timestamptz NOT NULL
)
"""

FLOW_STARTS_INDEX = """
CREATE INDEX IF NOT EXISTS flow_starts_scope_started ON flow_starts (scope, started_at)
"""

# A job is limited while a limit names its type or its queue. The view's earlier columns keep
# their order (CREATE OR REPLACE VIEW may only append).
CLAIMABLE_JOBS = """
CREATE OR REPLACE VIEW claimable_jobs AS
SELECT j.id, j.queue, j.priority, j.created_at,
       EXISTS (SELECT 1 FROM flow_limits f
               WHERE f.scope IN ('type:' || j.type, 'queue:' || j.queue)) AS limited,
       j.type, j.limit_key
FROM jobs j
WHERE j.status = 'queued'
  AND NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
"""

CLAIMABLE_JOBS_0009 = """
CREATE OR REPLACE VIEW claimable_jobs AS
SELECT j.id, j.queue, j.priority, j.created_at FROM jobs j
WHERE j.status = 'queued'
  AND NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = j.queue)
"""


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS limit_key text")
    op.execute(FLOW_LIMITS)
    op.execute(FLOW_STARTS)
    op.execute(FLOW_STARTS_INDEX)
    op.execute(CLAIMABLE_JOBS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS claimable_jobs")
    op.execute(CLAIMABLE_JOBS_0009)
    op.execute("DROP TABLE IF EXISTS flow_starts")
    op.execute("DROP TABLE IF EXISTS flow_limits")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS limit_key")
