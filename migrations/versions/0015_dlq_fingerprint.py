"""Dead jobs grouped by cause: `dead_letter_jobs.fingerprint` and its index.

The fingerprint of a dead job's final error (taskline.fingerprint: the exception type and the
message with its numbers, ids, hex and quoted values masked) is written with the DLQ row when
the job is dead-lettered; `GET /api/v1/dlq/groups` counts the rows by it through the index
`dead_letter_jobs_fingerprint` (fingerprint, failed_at), and bulk retry and purge select by it.

Online on a large DLQ:
- ADD COLUMN of a nullable column without a default changes the catalog only (no rewrite),
  under a lock held for milliseconds; `lock_timeout` makes it fail fast rather than queue every
  dead-lettering behind a long transaction (run `taskline migrate` again).
- The index is built with CREATE INDEX CONCURRENTLY outside a transaction (alembic's
  `autocommit_block`; migrations/env.py holds its advisory lock for the whole session); a
  build that failed leaves an INVALID index, dropped and built again on the next run.
- The dead jobs already there are fingerprinted in batches of 1,000 by job id, each batch its
  own short transaction, each row only while it still has no fingerprint and the same error
  (a row dead-lettered again meanwhile keeps what its new dead-lettering wrote).

Rolling deploy beside the previous release: it neither reads nor writes the column; a job it
dead-letters meanwhile has no fingerprint (the groups show those rows as one group with
fingerprint null) until `taskline migrate` runs again, which fingerprints them too.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 09:10:00
"""

from alembic import op

from taskline.fingerprint import fingerprint
from taskline_migrations.online import build_index

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"
BATCH = 1000
INDEX = "dead_letter_jobs_fingerprint"
NIL = "00000000-0000-0000-0000-000000000000"


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE dead_letter_jobs ADD COLUMN IF NOT EXISTS fingerprint text")
    with op.get_context().autocommit_block():
        build_index(INDEX, "ON dead_letter_jobs (fingerprint, failed_at)")
        _fingerprint_existing()


def _fingerprint_existing() -> None:
    """Every row without a fingerprint, a batch per transaction, in job id order."""
    bind = op.get_bind()
    after = NIL
    while True:
        rows = bind.exec_driver_sql(
            "SELECT job_id::text, final_error FROM dead_letter_jobs WHERE fingerprint IS NULL "
            "AND job_id > %(after)s::uuid ORDER BY job_id LIMIT %(n)s",
            {"after": after, "n": BATCH}).all()
        if not rows:
            return
        bind.exec_driver_sql(
            "UPDATE dead_letter_jobs d SET fingerprint = v.fingerprint "
            "FROM unnest(%(ids)s::uuid[], %(errors)s::text[], %(prints)s::text[]) "
            "AS v (job_id, final_error, fingerprint) "
            "WHERE d.job_id = v.job_id AND d.fingerprint IS NULL "
            "AND d.final_error IS NOT DISTINCT FROM v.final_error",
            {"ids": [r[0] for r in rows], "errors": [r[1] for r in rows],
             "prints": [fingerprint(r[1]) for r in rows]})
        after = rows[-1][0]


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE dead_letter_jobs DROP COLUMN IF EXISTS fingerprint")
