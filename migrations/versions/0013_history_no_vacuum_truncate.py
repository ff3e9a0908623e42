"""Vacuum keeps the history tables' freed tail pages instead of truncating them.

Retention deletes the oldest finished jobs while new jobs arrive, so a vacuum of `jobs`,
`job_events` or `job_leases` often finds empty pages at the end of a file and, by default,
truncates them. Truncation takes an ACCESS EXCLUSIVE lock on the table (PostgreSQL gives it up
when another session asks for a conflicting lock, but only after that session has waited for
it), so every claim, completion and enqueue touching the table can stall behind it, and the
file then grows back by the same pages within seconds, because the next minute of jobs needs
them. With `vacuum_truncate = false` the pages stay in the file as free space, reused by the
next inserts: no exclusive lock, and the tables stay at the size of their busiest minute
instead of shrinking and regrowing (docs/maintenance.md, "Autovacuum"). An operator who wants
the space back after retention was shortened runs `VACUUM (TRUNCATE) jobs` by hand.

Online on a 100-million-row `jobs`: ALTER TABLE ... SET (storage parameter) changes the
catalog only, under SHARE UPDATE EXCLUSIVE, which blocks no read or write; `lock_timeout`
makes it fail fast rather than wait behind a running vacuum (run `taskline migrate` again).
Nothing is rewritten.

Rolling deploy beside the previous release: the parameter is read by VACUUM alone; no
statement of either release depends on it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 19:00:00
"""

from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

TABLES = ("jobs", "job_events", "job_leases")


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} SET (vacuum_truncate = false)")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} RESET (vacuum_truncate)")
