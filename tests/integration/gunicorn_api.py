"""`taskline api` under gunicorn as a subprocess on a database of its own, for tests that need
real sockets (framing, slow clients, fuzzing over HTTP); `running_api` yields where it listens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
import requests
from psycopg import sql

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from tests.conftest import ADMIN_URL, REDIS_URL, db_url
from tests.helpers import service, service_env, wait_for


@dataclass(frozen=True)
class Api:
    port: int
    database_url: str
    log_dir: Path

    def jobs(self) -> int:
        """How many jobs PostgreSQL holds."""
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute("SELECT count(*) FROM taskline.jobs").fetchone()
            return int(row[0]) if row else 0

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _admin(statement: sql.Composable) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


def _healthy(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def running_api(template_db: str, log_dir: Path, **env: str) -> Iterator[Api]:
    """Two gunicorn processes on a clone of `template_db`; `env` adds TASKLINE_* variables."""
    name = f"taskline_t_{uuid.uuid4().hex[:12]}"
    _admin(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                           sql.Identifier(template_db)))
    redis.Redis.from_url(REDIS_URL).flushdb()
    settings = Settings.from_env(env={}, database_url=db_url(name), redis_url=REDIS_URL)
    port = free_port()
    try:
        with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "2"],
                     service_env(settings, **env), log_dir) as proc:
            wait_for(lambda: _healthy(port) or proc.poll() is not None, timeout=20,
                     message="api up")
            assert proc.poll() is None, f"taskline api exited; see {log_dir}"
            yield Api(port, db_url(name), log_dir)
    finally:
        _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        redis.Redis.from_url(REDIS_URL).flushdb()
