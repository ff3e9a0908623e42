"""Steps that run when a workflow fails: `jobs.run_when` and `job_dependencies.parent_outcome`.

`jobs.run_when` is a workflow step's condition: NULL runs it once every parent succeeded (the
behaviour before this migration), `any_failed` once any parent ends dead or cancelled (it is
cancelled with cause `condition_unmet` when all succeed), `always` once every parent finished.
`job_dependencies.parent_outcome` records, on the edge to such a step, the outcome of the
parent's first finish (`succeeded`, `dead`, `cancelled`): the step counts each parent once, so
a dead parent requeued and finishing again changes nothing for it (taskline.workflows).

Online on a 100-million-row `jobs`: both are nullable columns without a default, a catalog
change only (no rewrite, no scan), under `lock_timeout` so a long transaction makes the
migration fail fast instead of queueing every claim behind it; rerunning it is harmless.

Rolling deploy beside the previous release: it names its columns when it inserts, so its jobs
and edges get NULL, which is exactly a step of today's kind. It never reads either column: a
`when` step it settles a parent of would be counted as if it waited for successes only, so
submit workflows with `when` steps once every worker runs this release (docs/workflows.md).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 13:30:00
"""

from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS run_when text")
    op.execute("ALTER TABLE job_dependencies ADD COLUMN IF NOT EXISTS parent_outcome text")


def downgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE job_dependencies DROP COLUMN IF EXISTS parent_outcome")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS run_when")
