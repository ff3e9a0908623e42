"""The database behind the `taskline_db` fixture: migrated once per test session, emptied of
taskline's rows after each test.

TASKLINE_TEST_DATABASE_URL names it (it is created if missing, then migrated); without it a
private PostgreSQL is started in a temporary directory, as `taskline dev` starts one (its
programs must be installed), and stopped at the session's end.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

from taskline.localservers import PrivatePostgres
from taskline.settings import Settings
from taskline.store.migrate import upgrade
from taskline.store.store import Store, sqlalchemy_url

URL_VARIABLE = "TASKLINE_TEST_DATABASE_URL"
DATABASE_NAME = "taskline_test"
"""The database made on a private server."""
LOCK_TIMEOUT_MS = 5000
"""How long emptying the tables waits for a lock a test left held (an open transaction)."""


@dataclass
class TestDatabase:
    """A migrated database: `url` for libpq and psycopg, `sqlalchemy_url` for
    `create_engine`, `schema` its installation's schema."""

    __test__ = False  # not a test class, despite its name

    url: str
    schema: str = "taskline"
    _server: PrivatePostgres | None = field(default=None, repr=False)
    _tmp: Any = field(default=None, repr=False)

    @property
    def sqlalchemy_url(self) -> str:
        return sqlalchemy_url(self.url)

    def __str__(self) -> str:
        return self.url

    def connect(self, **kwargs: Any) -> Any:
        """A new psycopg connection to it (the caller closes it)."""
        import psycopg

        return psycopg.connect(self.url, **kwargs)

    def empty(self) -> None:
        """Delete every row of taskline's tables (jobs, workflows, schedules, limits...)."""
        store = Store.connect(self.url, pool_size=1, schema=self.schema)
        try:
            tables = store.schema_tables()
            if not tables:
                return
            names = sql.SQL(", ").join(sql.Identifier(self.schema, t) for t in tables)
            with self.connect(autocommit=True) as conn:
                conn.execute(sql.SQL("SET lock_timeout = {}").format(LOCK_TIMEOUT_MS))
                conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(names))
        finally:
            store.dispose()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._tmp is not None:
            self._tmp.cleanup()


def provide(env: dict[str, str] | None = None) -> TestDatabase:
    """The session's database, migrated: TASKLINE_TEST_DATABASE_URL's, else a private one."""
    env = dict(os.environ) if env is None else env
    schema = Settings.from_env(env={k: v for k, v in env.items() if k == "TASKLINE_SCHEMA"}
                               ).schema
    url = env.get(URL_VARIABLE, "")
    if url:
        upgrade(url, schema=schema)
        return TestDatabase(url, schema)
    tmp = tempfile.TemporaryDirectory(prefix="taskline-test-")
    # Under root the server runs as the `postgres` OS user, which must enter this directory.
    os.chmod(tmp.name, 0o711)
    server = PrivatePostgres(Path(tmp.name) / "postgres", fast=True)
    try:
        server.init()
        server.start()
        url = server.url(DATABASE_NAME)
        upgrade(url, schema=schema)
    except BaseException:
        server.close()
        tmp.cleanup()
        raise
    return TestDatabase(url, schema, server, tmp)
