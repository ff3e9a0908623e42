"""Alembic environment: runs migrations online, inside one transaction, under an advisory lock.

The transaction-scoped advisory lock makes `taskline migrate` safe to run from several
containers at once: the second waits, then finds the schema at head and does nothing.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from taskline.store.schema import metadata

MIGRATION_LOCK_ID = 0x7A5C11E  # any constant shared by every migrating process

config = context.config


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata,
                          transaction_per_migration=False)
        with context.begin_transaction():
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"),
                               {"id": MIGRATION_LOCK_ID})
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("taskline migrations run online only")
run_migrations_online()
