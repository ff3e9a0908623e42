"""Shared fixtures: real PostgreSQL and Redis, isolated per test (or per module).

Each test gets its own database cloned from a migrated template (CREATE DATABASE ... TEMPLATE),
unless its module shares one (tests/integration/conftest.py: module_settings), and a Redis
logical database flushed before and after it; the environment is stripped of
TASKLINE_* so a developer's shell never leaks into a test. Servers default to the local ones
and can be pointed elsewhere with TEST_DATABASE_URL (an admin connection) and TEST_REDIS_URL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis
from psycopg import sql

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.migrate import upgrade
from taskline.store.store import Store

# Private-server fixtures (private_postgres, private_redis, fresh_*, private_settings), and a
# private PgBouncer (pgbouncer), and a private Redis Cluster (redis_cluster, cluster_redis_url).
pytest_plugins = ["tests.servers", "tests.pgbouncer", "tests.redis_cluster"]

ADMIN_URL = os.environ.get("TEST_DATABASE_URL", "postgresql://root@127.0.0.1:5432/postgres")
# Under pytest-xdist (make test) each worker process (gw0, gw1, ...) flushes a logical database
# of its own: 15, 14, ...
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
REDIS_URL = os.environ.get("TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - _WORKER}")

for _name in list(os.environ):
    if _name.startswith("TASKLINE_") or _name in ("DATABASE_URL", "REDIS_URL"):
        del os.environ[_name]


def db_url(name: str) -> str:
    """ADMIN_URL with its database replaced by `name`."""
    parts = urlsplit(ADMIN_URL)
    return urlunsplit(parts._replace(path="/" + name))


def _admin(statement: sql.Composable) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    """A database migrated once per session; every test clones it."""
    name = f"taskline_tpl_{os.getpid()}"
    _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    upgrade(db_url(name))
    yield name
    _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def cloned_database(template: str) -> Iterator[str]:
    """A new database cloned from `template`, dropped on exit; yields its URL."""
    name = f"taskline_t_{uuid.uuid4().hex[:12]}"
    _admin(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                           sql.Identifier(template)))
    try:
        yield db_url(name)
    finally:
        _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def database_url(template_db: str) -> Iterator[str]:
    with cloned_database(template_db) as url:
        yield url


def flush_redis() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    client.close()


@pytest.fixture
def redis_url() -> Iterator[str]:
    flush_redis()
    yield REDIS_URL
    flush_redis()


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    return short_settings(database_url, redis_url)


def short_settings(database_url: str, redis_url: str) -> Settings:
    """Production defaults with durations shortened so tests finish quickly."""
    return Settings.from_env(
        env={}, database_url=database_url, redis_url=redis_url, lease_s=3.0, heartbeat_s=0.5,
        reaper_interval_s=0.5, reconcile_interval_s=2.0, backoff_base_s=0.2, backoff_factor=2.0,
        backoff_max_s=2.0, shutdown_grace_s=3.0, metrics_port=0, log_format="text",
    )


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    s = Store.connect(settings.database_url, pool_size=4)
    yield s
    s.dispose()


@pytest.fixture
def dispatcher(settings: Settings) -> Iterator[Dispatcher]:
    d = Dispatcher(settings.redis_url, block_timeout_s=0.2)
    yield d
    d.close()
