"""Autovacuum tuned for the history tables' churn: jobs, job_events and job_leases.

Retention deletes every finished job's rows a fixed time after it finished, so these tables
lose as many rows as they gain. PostgreSQL's defaults vacuum a table once a fifth of it is
dead (`autovacuum_vacuum_scale_factor` 0.2): on a table holding a retention window of jobs
that is a fifth of the window, deleted rows whose space is not yet reusable while new rows
extend the files, so the tables grow for many minutes before they level off, and on a
100-million-row table a vacuum then visits 20 million dead rows at once. At 0.01 (and the
insert-triggered vacuum at 0.05) vacuums come earlier and smaller, freed space is reused
sooner, and the size levels off at the window's own size; statistics follow at 0.02, which
keeps the partial indexes' estimates (claimable, finished) current. The cost-based throttle
is left at its default, so a vacuum never takes more I/O than before, only less at a time.

Online on a 100-million-row `jobs`: ALTER TABLE ... SET (storage parameters) changes the
catalog only, under SHARE UPDATE EXCLUSIVE, which blocks no read or write (only another
vacuum or DDL on the table); `lock_timeout` makes it fail fast rather than wait behind a
running anti-wraparound vacuum (run `taskline migrate` again). Nothing is rewritten.

Rolling deploy beside the previous release: storage parameters are read by autovacuum alone;
no statement of either release depends on them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 16:00:00
"""

from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

TABLES = ("jobs", "job_events", "job_leases")
SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_insert_scale_factor": "0.05",
    "autovacuum_analyze_scale_factor": "0.02",
}


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    options = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} SET ({options})")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})")
