"""Declared job types: `declared_types`, the types each worker serves with their payload schema.

A worker writes one row per type it has a handler for when it starts (its earlier rows
replaced): the type, its default queue and the JSON Schema of its declared payload (NULL: any
payload). The API checks a payload against every schema of its type whose worker was seen
within TASKLINE_TYPE_TTL_S (the worker's `last_heartbeat`), so during a rolling deploy of a
changed schema both the old and the new shape are accepted; `GET /api/v1/types` lists them.

Online on any installation: CREATE TABLE touches the catalog only; no existing table is locked
or rewritten. No foreign key to `workers`: a declaration must not hold up a worker row's
deletion, and rows of workers unseen for longer than the TTL are deleted by the next worker
that starts.

Rolling deploy beside the previous release: its workers declare nothing, so their types are
undeclared and accepted as before under the default TASKLINE_UNKNOWN_TYPES=accept; set
`reject` only once every worker runs this release (docs/handlers.md).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03 13:40:00
"""

from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

DECLARED_TYPES = """
CREATE TABLE IF NOT EXISTS declared_types (
    type text NOT NULL,
    worker_id text NOT NULL,
    queue text NOT NULL,
    schema jsonb,
    declared_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (type, worker_id)
)
"""


def upgrade() -> None:
    op.execute(DECLARED_TYPES)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS declared_types")
