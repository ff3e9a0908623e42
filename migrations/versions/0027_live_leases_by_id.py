"""The attempt fence for statements that name their leases: `live_leases_by_id`.

`settle`, the lease renewal and `write_progress` find their leases by id. Through
`live_leases`, whose `released_at IS NULL` matches the open-lease partial index
(`job_leases_open`), a generic plan made while the leases had no statistics (a new history
partition before its first analysis; every partition where autovacuum is off and maintenance
has not yet analyzed it) reads that whole index beside the ids' primary-key lookups, dead
entries included: every lease ended since the last vacuum, so each settle grew dearer as the
drain went on (docs/performance.md, changes 106 and 124, and "The attempt fence").
`live_leases_by_id` holds the fence's rule with the lease's state tested as `(released_at IS
NULL) IS TRUE`, which no partial index answers, so only the primary key reaches the leases.
`live_leases` becomes that view with the plain test beside (`SELECT * ... WHERE released_at IS
NULL`): the rule stays written once, and the statements that want the open-lease index for
`leased_until` (the reaper's expired leases and next expiry) keep reading it. Both views are
automatically updatable: an UPDATE goes through to `job_leases`.

Online on any table size: CREATE VIEW and CREATE OR REPLACE VIEW change the catalog only,
under a lock_timeout; no row is read or written.

Rolling deploy beside the previous release: its statements read `live_leases`, whose rows and
plain test are what they were, so its plans (the reaper's index reads among them) do not
change. This release's statements read the new view, so this migration runs before any of its
processes start (`taskline migrate`, as for every release). Downgrade restores 0002's
definition and drops the new view.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06 20:20:00
"""

from importlib import import_module

from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"

# The fence, as 0002 wrote it, but with the lease's own state in a form no index can serve:
# a lease is found by its primary key and its job by its own, whatever the statistics.
LIVE_LEASES_BY_ID = """
CREATE OR REPLACE VIEW live_leases_by_id AS
SELECT l.* FROM job_leases l
WHERE (l.released_at IS NULL) IS TRUE
  AND EXISTS (SELECT 1 FROM jobs j
              WHERE j.id = l.job_id AND (j.status = 'running') IS TRUE
                AND j.attempts = l.attempt)
"""

# The same rows; the plain test lets a statement reading open leases by `leased_until` use
# the open-lease partial index.
LIVE_LEASES = """
CREATE OR REPLACE VIEW live_leases AS
SELECT * FROM live_leases_by_id WHERE released_at IS NULL
"""

# What the downgrade restores: 0002's definition, as that migration wrote it.
LIVE_LEASES_0002 = import_module("taskline_migrations.versions.0002_live_leases").LIVE_LEASES


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(LIVE_LEASES_BY_ID)
    op.execute(LIVE_LEASES)


def downgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(LIVE_LEASES_0002)
    op.execute("DROP VIEW IF EXISTS live_leases_by_id")
