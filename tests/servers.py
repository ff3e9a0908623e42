"""Private PostgreSQL and Redis servers for tests that stop, freeze, crash or flush a server.

The shared servers are never touched: each private server listens on a free loopback port,
lives in a temporary folder and is killed by PID (its process group) and removed when its
fixture ends, pass or fail. The server code itself is `taskline_cli.localservers` (the same
code `taskline dev` uses); this module adds the pytest fixtures and one speed-up: the cluster
is created and migrated once per session, and every private PostgreSQL starts from a copy.

Fixtures (registered for every test by tests/conftest.py):
- `private_postgres`, `private_redis`: one server per test module, handed to each test
  running and thawed (restarted if an earlier test of the module stopped it); Redis is flushed.
- `fresh_postgres`, `fresh_redis`: a new server for this test alone.
- `private_settings`: the `settings` fixture pointed at a fresh database on `private_postgres`
  and at `private_redis`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from taskline.settings import Settings
from taskline.store.migrate import upgrade
from taskline_cli.localservers import PrivatePostgres, PrivateRedis, ServerError, free_port

__all__ = ["PrivatePostgres", "PrivateRedis", "ServerError", "free_port", "new_database",
           "ready", "running_postgres", "running_redis", "scratch_dir"]

TEMPLATE_DB = "taskline_template"


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary folder the `postgres` OS user may pass through; removed at the end."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_template(root: Path) -> Path:
    """initdb once and migrate TEMPLATE_DB; returns the stopped cluster's data folder."""
    server = PrivatePostgres(root / "template", fast=True)
    server.init()
    server.start()
    try:
        upgrade(server.url(TEMPLATE_DB))
    finally:
        server.stop()
    return server.data_dir


@contextmanager
def running_postgres(template: Path | None = None) -> Iterator[PrivatePostgres]:
    """A started private PostgreSQL (a copy of `template` if given); killed and removed after."""
    with scratch_dir("taskline-pg-") as root:
        server = PrivatePostgres(root / "pg", fast=True)
        try:
            server.init(template=template)
            server.start()
            yield server
        finally:
            server.close()


@contextmanager
def running_redis() -> Iterator[PrivateRedis]:
    """A started private Redis without persistence; killed and removed after."""
    with scratch_dir("taskline-redis-") as root:
        server = PrivateRedis(root / "redis")
        try:
            server.start()
            yield server
        finally:
            server.close()


def new_database(server: PrivatePostgres, name: str | None = None) -> str:
    """A new migrated database on `server` (a clone of TEMPLATE_DB, or migrated if absent)."""
    name = name or f"taskline_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url(), autocommit=True, connect_timeout=5) as conn:
        has_template = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                    (TEMPLATE_DB,)).fetchone()
        if has_template:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(TEMPLATE_DB)))
    if not has_template:
        upgrade(server.url(name))
    return server.url(name)


def ready(server: PrivatePostgres | PrivateRedis) -> None:
    """Undo what an earlier test did to a shared private server: thaw it, start it if down."""
    server.thaw()
    if not server.running:
        server.start()


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[Path]:
    with scratch_dir("taskline-pgtpl-") as root:
        yield make_template(root)


@pytest.fixture(scope="module")
def _module_postgres(postgres_template: Path) -> Iterator[PrivatePostgres]:
    with running_postgres(postgres_template) as server:
        yield server


@pytest.fixture(scope="module")
def _module_redis() -> Iterator[PrivateRedis]:
    with running_redis() as server:
        yield server


@pytest.fixture
def private_postgres(_module_postgres: PrivatePostgres) -> PrivatePostgres:
    ready(_module_postgres)
    return _module_postgres


@pytest.fixture
def private_redis(_module_redis: PrivateRedis) -> PrivateRedis:
    ready(_module_redis)
    _module_redis.flushall()
    return _module_redis


@pytest.fixture
def fresh_postgres(postgres_template: Path) -> Iterator[PrivatePostgres]:
    with running_postgres(postgres_template) as server:
        yield server


@pytest.fixture
def fresh_redis() -> Iterator[PrivateRedis]:
    with running_redis() as server:
        yield server


@pytest.fixture
def private_settings(settings: Settings, private_postgres: PrivatePostgres,
                     private_redis: PrivateRedis) -> Settings:
    return settings.replace(database_url=new_database(private_postgres),
                            redis_url=private_redis.url)
