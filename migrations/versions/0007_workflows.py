"""Workflows: the `workflows` table, the dependency edges between steps, and the state `waiting`.

A workflow is a row of `workflows` (name, idempotency key); its steps are ordinary jobs that
name it (`jobs.workflow_id`, `jobs.step`). `job_dependencies` holds one row per (parent, child)
edge. `jobs.pending_parents` counts the parents of a waiting step that have not succeeded yet:
the transaction that records a parent's success decrements it and queues the step at 0.

Online on a 100-million-row `jobs`:
- `workflows` and `job_dependencies` are new, empty tables. The edges' foreign keys to `jobs`
  take a brief SHARE ROW EXCLUSIVE lock on `jobs` (it blocks no reader) and validate against
  an empty table.
- `workflow_id` and `step` are nullable columns without default, `pending_parents` has a
  constant default: since PostgreSQL 11 all three are catalog changes only, no table rewrite.
- The status CHECK grows the state `waiting` without a scan under a heavy lock: the new
  constraint is added NOT VALID (brief ACCESS EXCLUSIVE, no scan), committed, then VALIDATE
  CONSTRAINT scans under SHARE UPDATE EXCLUSIVE, which lets reads and writes go on; only then is
  the old constraint dropped (catalog change). Each is its own transaction (alembic's
  `autocommit_block`; migrations/env.py holds its advisory lock for the whole session).
- `jobs_workflow` is built with CREATE INDEX CONCURRENTLY; it is partial (only steps), so it
  stays small. A build that failed leaves an INVALID index, dropped and built again on rerun.
- Every catalog change runs under `lock_timeout`, so it fails fast instead of queueing every
  claim and enqueue behind a long transaction; `taskline migrate` can simply be rerun (every
  step is idempotent).

Rolling deploy beside the previous release: it never writes a workflow, a waiting job or an
edge, and names its columns when it inserts jobs, so its jobs get `workflow_id` NULL and
`pending_parents` 0, which is exactly a plain job. A waiting row exists only once a workflow
was submitted to this release. The previous release's claim (`status = 'queued'`), promoter
(`scheduled`, `retrying`), reaper (live leases of running jobs), reconciler's pending scan
(`queued`, `scheduled`, `retrying`), queue counts and retention (terminal states) all name
their states literally, so none of them reads or touches a waiting row, and Redis never holds
a waiting id for its reconciler to look up. Only its job list and job detail routes would parse
such a row, and its `Status` does not know `waiting`: submit workflows once every API instance
runs this release (docs/workflows.md says so). A step the previous release's worker completes
is a plain success to it, which would leave that step's dependents waiting: run workers of this
release before the first workflow is submitted, as for any new job type.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

from taskline_migrations.online import build_index

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "10s"
"""Longest wait for a catalog change's lock; past it the migration fails and can be re-run."""
OLD_CHECK = "jobs_status_valid"
NEW_CHECK = "jobs_status_allowed"
STATUSES = "('scheduled','queued','running','retrying','succeeded','dead','cancelled','waiting')"
INDEX = ("jobs_workflow", "ON jobs (workflow_id, step) WHERE workflow_id IS NOT NULL")

TABLES = """
CREATE TABLE IF NOT EXISTS workflows (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    idempotency_key text,
    request_hash text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS workflows_idempotency_key ON workflows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS workflows_created ON workflows (created_at, id);
CREATE TABLE IF NOT EXISTS job_dependencies (
    parent_id uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    child_id uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX IF NOT EXISTS job_dependencies_child ON job_dependencies (child_id);
"""


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(TABLES)
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS workflow_id uuid, "
               "ADD COLUMN IF NOT EXISTS step text, "
               "ADD COLUMN IF NOT EXISTS pending_parents integer NOT NULL DEFAULT 0")
    with op.get_context().autocommit_block():
        op.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        if not _constraint_exists(NEW_CHECK):
            op.execute(f"ALTER TABLE jobs ADD CONSTRAINT {NEW_CHECK} "
                       f"CHECK (status IN {STATUSES}) NOT VALID")
        op.execute(f"ALTER TABLE jobs VALIDATE CONSTRAINT {NEW_CHECK}")
        op.execute(f"ALTER TABLE jobs DROP CONSTRAINT IF EXISTS {OLD_CHECK}")
        build_index(*INDEX)
        op.execute("RESET lock_timeout")


def _constraint_exists(name: str) -> bool:
    return op.get_bind().exec_driver_sql(
        "SELECT 1 FROM pg_constraint WHERE conname = %(name)s "
        "AND conrelid = 'jobs'::regclass", {"name": name}).first() is not None


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX[0]}")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("DELETE FROM jobs WHERE status = 'waiting'")
    op.execute(f"ALTER TABLE jobs ADD CONSTRAINT {OLD_CHECK} CHECK (status IN "
               "('scheduled','queued','running','retrying','succeeded','dead','cancelled'))")
    op.execute(f"ALTER TABLE jobs DROP CONSTRAINT IF EXISTS {NEW_CHECK}")
    op.execute("DROP TABLE IF EXISTS job_dependencies")
    op.execute("DROP TABLE IF EXISTS workflows")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS workflow_id, "
               "DROP COLUMN IF EXISTS step, DROP COLUMN IF EXISTS pending_parents")
