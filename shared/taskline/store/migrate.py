"""Schema migrations: create the database if missing, then upgrade to head under a lock, in
taskline's own schema (TASKLINE_SCHEMA).

Safe to run from several containers at once: CREATE DATABASE races are tolerated and the
migrations themselves run under a transaction-scoped advisory lock (see migrations/env.py).
"""

from __future__ import annotations

import logging
from importlib import resources

import psycopg
from alembic import command
from alembic.config import Config
from psycopg import sql
from sqlalchemy import create_engine, pool

from taskline.store import relocation
from taskline.store.queries import DEFAULT_SCHEMA
from taskline.store.store import sqlalchemy_url

log = logging.getLogger(__name__)


def alembic_config(database_url: str, schema: str = DEFAULT_SCHEMA) -> Config:
    """Alembic's configuration for taskline's migrations of the installation in `schema`."""
    config = Config()
    config.attributes["taskline_schema"] = schema
    config.set_main_option("script_location",
                           str(resources.files("taskline_migrations")))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))
    return config


def ensure_database(database_url: str) -> bool:
    """Create the URL's database when it does not exist; True when this call created it."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    name = info.get("dbname")
    if not name:
        return False
    try:
        psycopg.connect(database_url, connect_timeout=5).close()
        return False
    except psycopg.OperationalError as err:
        if "does not exist" not in str(err):
            raise
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            return False
    log.info("created database", extra={"database": name})
    return True


def upgrade(database_url: str, create: bool = True, schema: str = DEFAULT_SCHEMA) -> None:
    """Bring the installation in `schema` to the newest revision, creating the schema when
    missing and moving an installation still in `public` into it first."""
    if create:
        ensure_database(database_url)
    command.upgrade(alembic_config(database_url, schema), "head")


def finish_move(database_url: str, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """Drop the compatibility views a move out of `public` left behind
    (taskline.store.relocation); the names dropped."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return relocation.finish_move(conn, schema)
    finally:
        engine.dispose()
