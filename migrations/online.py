"""What the migrations share for changes made online: an index built CONCURRENTLY that failed.

A CREATE INDEX CONCURRENTLY that fails (a lock timeout, a cancelled `taskline migrate`) leaves
an INVALID index behind, which PostgreSQL keeps up to date but never reads; CREATE INDEX ... IF
NOT EXISTS would then keep it as it is. A migration builds an index with `build_index`, which
drops such a leftover first, so running `taskline migrate` again builds it afresh. Only an
index of the migrated schema is looked at: another installation's in the same database is not
this one's.
"""

from __future__ import annotations

from alembic import op


def drop_if_invalid(name: str) -> None:
    """Drop index `name` of the current schema if a failed CONCURRENTLY build left it invalid."""
    invalid = op.get_bind().exec_driver_sql(
        "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = %(name)s AND c.relnamespace = current_schema()::regnamespace "
        "AND NOT i.indisvalid", {"name": name}).first()
    if invalid:
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def build_index(name: str, definition: str) -> None:
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS `name` `definition` (`ON table (...) [WHERE
    ...]`), after dropping what a failed build of it left; inside an autocommit block."""
    drop_if_invalid(name)
    op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} {definition}")
