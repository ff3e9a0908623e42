"""Alembic environment: runs migrations online, inside one transaction, under an advisory lock,
in taskline's own schema (TASKLINE_SCHEMA, passed as the config attribute `taskline_schema`).

The advisory lock makes `taskline migrate` safe to run from several containers at once: the
second waits, then finds the schema at head and does nothing. It is held by the session, not
the transaction: a migration that builds an index CONCURRENTLY commits the transaction in an
`autocommit_block`, and a transaction-scoped lock would be released there, letting a second
migrator start the same migration halfway through the first. The lock ends with the session
when a migrator dies.

The migrations name relations unqualified (they were written before the schema setting), so
this one connection, a session of `migrate`'s own and never pooled, sets its `search_path` to
the schema; the version table is the schema's own (`version_table_schema`), never
`public.alembic_version`. An installation still in `public` is moved first
(taskline.store.relocation).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from taskline.store.queries import DEFAULT_SCHEMA
from taskline.store.relocation import move_from_public
from taskline.store.schema import metadata

MIGRATION_LOCK_ID = 0x7A5C11E  # any constant shared by every migrating process

config = context.config


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    schema = config.attributes.get("taskline_schema", DEFAULT_SCHEMA)
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        connection.commit()  # the session keeps the lock; alembic begins its own transaction
        move_from_public(connection, schema)
        connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        connection.exec_driver_sql(f"SET search_path TO {schema}")
        connection.commit()
        context.configure(connection=connection, target_metadata=metadata,
                          version_table_schema=schema, transaction_per_migration=False)
        with context.begin_transaction():
            context.run_migrations()
        connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("taskline migrations run online only")
run_migrations_online()
