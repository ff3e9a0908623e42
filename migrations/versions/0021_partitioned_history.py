"""Partitioned history: `job_events` and `job_leases` become tables partitioned by RANGE (id).

Why the id and not a time column: both ids come from a sequence, so they grow with time, and
every hot statement on a lease (renewal, fence, settle, progress, the reaper's settle) names
the lease id (the fencing token): with the id as partition key each of them is pruned to the
one partition that holds it, and the primary key stays `(id)`, exactly the old uniqueness,
which a time key would have widened to `(id, time)`. Maintenance makes each partition about
a day of ids (taskline.store.partitions rolls the sequence to the next partition's first id
once a day), so partitions are days in effect. `jobs` stays unpartitioned: its primary key,
idempotency keys, unique keys and workflow keys need indexes unique across all jobs.

The foreign keys `job_events.job_id` and `job_leases.job_id` -> `jobs.id` (ON DELETE CASCADE)
go: retention deletes a job's row only, and its events and leases go with their partition,
which retention replaces by a copy of the rows whose job still exists (a dead job kept 30 days)
or drops when none does. Nothing references either table.

Online on 100-million-row tables:
- In autocommit: a `CHECK (id < cutover) NOT VALID` (a catalog change under a lock held for
  milliseconds), then VALIDATE, which scans under SHARE UPDATE EXCLUSIVE: writes go on. The
  cutover is two partitions (2e9 ids) past the sequence, so no insert reaches it meanwhile.
- One short transaction (a savepoint, tried again up to 40 times when its locks are not had
  within 500 ms) that locks `live_leases`, `job_leases`, `jobs` and `job_events` first, in
  one statement, then: drop the foreign keys, rename the table and its
  indexes to `<table>_legacy*`, create the partitioned table under the old name with the same
  columns and indexes (empty, so instant), ATTACH the old table as the partition (MINVALUE,
  cutover): the validated CHECK proves the bound, so nothing is scanned, and its indexes
  become the partitions of the parent's. The sequence moves to the cutover and to the new
  table; a default partition, the first range and seven ahead are created; every view over
  the table (`live_leases`, and the compatibility views in `public` of an installation moved
  into its schema) is created again with its own definition (a view names the table it was
  created on, now the legacy partition).
No row is rewritten. The previous release keeps writing and reading through the same names
(its inserts take ids from the same sequence and land in the new partitions).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03 17:00:00
"""

import re
import time

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "5s"
SWAP_LOCK_TIMEOUT = "500ms"
SWAP_ATTEMPTS = 40
RETRIED = ("55P03", "40P01")
"""lock_not_available, deadlock_detected: the swap is tried again."""
WIDTH = 1_000_000_000
"""Ids per partition: taskline.store.partitions.WIDTH (a migration is not allowed to import the
code it migrates for)."""
AHEAD = 7
"""Partitions created past the first: TASKLINE_HISTORY_PARTITIONS_AHEAD's default, which
maintenance keeps from then on."""
STORAGE = ("autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05, "
           "autovacuum_analyze_scale_factor = 0.02, vacuum_truncate = false")
"""Migrations 0011 and 0013's settings: storage parameters belong to each partition."""
INDEXES = {
    "job_events": {"job_events_job": "(job_id, id)"},
    "job_leases": {"job_leases_job": "(job_id, id)",
                   "job_leases_open": "(leased_until) WHERE released_at IS NULL"},
}


def _scalar(sql: str) -> object:
    return op.get_bind().exec_driver_sql(sql).scalar()


def _partitioned(table: str) -> bool:
    return bool(_scalar(f"SELECT 1 FROM pg_partitioned_table WHERE partrelid = "
                        f"to_regclass(quote_ident(current_schema()) || '.{table}')"))


def _sequence(table: str) -> str:
    return str(_scalar(f"SELECT pg_get_serial_sequence('{table}', 'id')"))


def upgrade() -> None:
    cutovers: dict[str, int] = {}
    with op.get_context().autocommit_block():
        for table in INDEXES:
            if _partitioned(table):
                continue
            last = int(_scalar(f"SELECT last_value FROM {_sequence(table)}"))  # type: ignore[call-overload]
            cutover = (last // WIDTH + 2) * WIDTH
            cutovers[table] = cutover
            op.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_legacy_range")
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_legacy_range "
                       f"CHECK (id < {cutover}) NOT VALID")
            op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {table}_legacy_range")
            op.execute("RESET lock_timeout")
    if not cutovers:
        return
    for attempt in range(SWAP_ATTEMPTS):
        try:
            with op.get_bind().begin_nested():
                _swap_all(cutovers)
            return
        except sa.exc.OperationalError as err:
            if getattr(err.orig, "sqlstate", None) not in RETRIED or attempt == SWAP_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def _swap_all(cutovers: dict[str, int]) -> None:
    """Every lock first, in one statement: the view and, through it, job_leases and jobs, then
    job_events. Taken one by one as the DDL needs them, a lock on a table the previous
    release's settle reads after the view deadlocked with it (tested). A lock not had within
    SWAP_LOCK_TIMEOUT gives up and the swap is tried again, so no statement of the running
    release queues behind it for longer."""
    views = {table: _views_over(table) for table in cutovers}
    locked = ", ".join(["live_leases", "job_events", *(v for vs in views.values() for v, _ in vs)])
    op.execute(f"SET LOCAL lock_timeout = '{SWAP_LOCK_TIMEOUT}'")
    op.execute(f"LOCK TABLE {locked} IN ACCESS EXCLUSIVE MODE")
    for table, cutover in cutovers.items():
        _swap(table, cutover)
        _repoint(table, views[table])


def _views_over(table: str) -> list[tuple[str, str]]:
    """(qualified name, definition) of each view reading `table`: live_leases, and the
    compatibility views in `public` of an installation moved into its schema (a view names the
    table it was created on, which the swap makes the legacy partition)."""
    return [(name, definition) for name, definition in op.get_bind().exec_driver_sql(
        "SELECT DISTINCT quote_ident(n.nspname) || '.' || quote_ident(v.relname), "
        "pg_get_viewdef(v.oid) FROM pg_depend d "
        "JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class "
        "JOIN pg_namespace n ON n.oid = v.relnamespace "
        "WHERE d.classid = 'pg_rewrite'::regclass AND v.relkind = 'v' AND d.refobjid = "
        f"to_regclass(quote_ident(current_schema()) || '.{table}') AND v.oid <> d.refobjid"
    ).all()]


def _repoint(table: str, views: list[tuple[str, str]]) -> None:
    """The same views, over the partitioned table (their columns, defaults and grants kept)."""
    schema = _scalar("SELECT quote_ident(current_schema())")
    for name, definition in views:
        over = re.sub(rf"(\b\w+\.)?\b{table}\b", f"{schema}.{table}", definition)
        op.execute(f"CREATE OR REPLACE VIEW {name} AS {over}")


def _swap(table: str, cutover: int) -> None:
    """The old table becomes the partition (MINVALUE, cutover) of a new one of its name."""
    sequence = _sequence(table)
    legacy = f"{table}_legacy"
    for (name,) in op.get_bind().exec_driver_sql(
            f"SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = "
            f"to_regclass(quote_ident(current_schema()) || '.{table}')").all():
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    op.execute(f"ALTER TABLE {table} RENAME TO {legacy}")
    op.execute(f"ALTER INDEX {table}_pkey RENAME TO {legacy}_pkey")
    for index in INDEXES[table]:
        op.execute(f"ALTER INDEX {index} RENAME TO {index.replace(table, legacy)}")
    op.execute(f"CREATE TABLE {table} (LIKE {legacy} INCLUDING DEFAULTS) PARTITION BY RANGE (id)")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id)")
    for index, definition in INDEXES[table].items():
        columns, _, where = definition.partition(" WHERE ")
        op.execute(f"CREATE INDEX {index} ON {table} {columns}"
                   + (f" WHERE {where}" if where else ""))
    op.execute(f"ALTER TABLE {table} ATTACH PARTITION {legacy} "
               f"FOR VALUES FROM (MINVALUE) TO ({cutover})")
    op.execute(f"ALTER SEQUENCE {sequence} OWNED BY {table}.id")
    op.execute(f"SELECT setval('{sequence}', {cutover}, false)")
    op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT WITH ({STORAGE})")
    for k in range(cutover // WIDTH, cutover // WIDTH + 1 + AHEAD):
        op.execute(f"CREATE TABLE {table}_p{k} PARTITION OF {table} "
                   f"FOR VALUES FROM ({k * WIDTH}) TO ({(k + 1) * WIDTH}) WITH ({STORAGE})")


def downgrade() -> None:
    """Back to plain tables: every row moves into the legacy table (a rewrite of the rows
    written since the upgrade, under the lock: a downgrade is not an online operation)."""
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    for table in INDEXES:
        if not _partitioned(table):
            continue
        views = _views_over(table)
        legacy = f"{table}_legacy"
        sequence = _sequence(table)
        op.execute(f"ALTER TABLE {table} DETACH PARTITION {legacy}")
        op.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT IF EXISTS {table}_legacy_range")
        op.execute(f"INSERT INTO {legacy} SELECT * FROM {table}")
        op.execute(f"ALTER SEQUENCE {sequence} OWNED BY {legacy}.id")
        op.execute(f"DROP TABLE {table} CASCADE")
        op.execute(f"ALTER TABLE {legacy} RENAME TO {table}")
        op.execute(f"ALTER INDEX {legacy}_pkey RENAME TO {table}_pkey")
        for index in INDEXES[table]:
            op.execute(f"ALTER INDEX {index.replace(table, legacy)} RENAME TO {index}")
        op.execute(f"DELETE FROM {table} t WHERE NOT EXISTS "
                   f"(SELECT 1 FROM jobs j WHERE j.id = t.job_id)")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_job_id_fkey FOREIGN KEY (job_id) "
                   f"REFERENCES jobs (id) ON DELETE CASCADE")
        _repoint(table, views)
