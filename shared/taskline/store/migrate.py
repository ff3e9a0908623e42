"""Schema migrations: create the database if missing, then upgrade to head under a lock.

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

from taskline.store.store import sqlalchemy_url

log = logging.getLogger(__name__)


def alembic_config(database_url: str) -> Config:
    config = Config()
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


def upgrade(database_url: str, create: bool = True) -> None:
    """Bring the schema to the newest revision."""
    if create:
        ensure_database(database_url)
    command.upgrade(alembic_config(database_url), "head")
