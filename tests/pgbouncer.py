"""A private PgBouncer in transaction pooling mode, for the tests that run taskline through one.

Debian's `pgbouncer` package (installed by .ci/run) is started on a free loopback port, in front
of one PostgreSQL, with a small pool (`POOL_SIZE` server connections per database and user), so
the clients' connections really share server connections between transactions, as in
production. PgBouncer refuses to run as root, so under root it runs as the `postgres` OS user
(as a private PostgreSQL does). Like every private server, it is a child process in a session of
its own and is only ever signalled by its PID; the shared PostgreSQL and Redis stay untouched.

Fixture (registered for every test by tests/conftest.py):
- `pgbouncer`: one PgBouncer per test module in front of the shared PostgreSQL, started (again)
  for each test.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from taskline_cli.localservers import LOOPBACK, PrivateServer, ServerError
from tests.servers import scratch_dir

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
POOL_SIZE = 2
"""Server connections per (database, user) pool: fewer than any taskline process opens."""


class PrivatePgBouncer(PrivateServer):
    """PgBouncer with pool_mode=transaction and trust authentication for `users`, in front of
    the PostgreSQL at `upstream_host`:`upstream_port` (every database name passes through)."""

    name = "pgbouncer"
    stop_signal = signal.SIGTERM  # immediate shutdown: clients are cut off, as in a crash

    def __init__(self, workdir: Path, upstream_port: int, *, users: tuple[str, ...] = ("root",),
                 upstream_host: str = LOOPBACK, pool_size: int = POOL_SIZE,
                 port: int | None = None) -> None:
        super().__init__(workdir, port)
        if not Path(BINARY).is_file():
            raise ServerError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.upstream = (upstream_host, upstream_port)
        self.users = users
        self.pool_size = pool_size
        self._account = _account()

    def url(self, database_url: str) -> str:
        """`database_url` (a URL of the upstream server) through this PgBouncer."""
        parts = urlsplit(database_url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}{LOOPBACK}:{self.port}"))

    def _argv(self) -> list[str]:
        return [BINARY, str(self._write_config())]

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        users = self.workdir / "userlist.txt"
        users.write_text("".join(f'"{user}" ""\n' for user in self.users))
        host, port = self.upstream
        config = self.workdir / "pgbouncer.ini"
        config.write_text(f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = {LOOPBACK}
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
admin_users = {self.users[0]}
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 2000
server_login_retry = 1
logfile =
pidfile =
""")
        for path in (users, config):
            path.chmod(0o644)
        return config

    def _ready(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex((LOOPBACK, self.port)) == 0

    def _run_as(self) -> dict[str, Any]:
        if self._account is None:
            return {}
        return {"user": self._account.pw_uid, "group": self._account.pw_gid, "extra_groups": []}


def _account() -> pwd.struct_passwd | None:
    """Who PgBouncer runs as: `postgres` under root (it refuses root), else the caller."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ServerError("PgBouncer refuses to run as root and there is no `postgres` OS "
                          "user to run it as") from None


@contextmanager
def running_pgbouncer(upstream_port: int, **options: Any) -> Iterator[PrivatePgBouncer]:
    """A started PgBouncer in front of the PostgreSQL on `upstream_port`; killed after."""
    with scratch_dir("taskline-pgbouncer-") as root:
        bouncer = PrivatePgBouncer(root / "pgbouncer", upstream_port, **options)
        try:
            bouncer.start(timeout=20)
            yield bouncer
        finally:
            bouncer.close()


@pytest.fixture(scope="module")
def _module_pgbouncer() -> Iterator[PrivatePgBouncer]:
    from tests.conftest import ADMIN_URL

    parts = urlsplit(ADMIN_URL)
    with running_pgbouncer(parts.port or 5432, upstream_host=parts.hostname or LOOPBACK,
                           users=(parts.username or "root",)) as bouncer:
        yield bouncer


@pytest.fixture
def pgbouncer(_module_pgbouncer: PrivatePgBouncer) -> PrivatePgBouncer:
    if not _module_pgbouncer.running:
        _module_pgbouncer.start(timeout=20)
    return _module_pgbouncer
