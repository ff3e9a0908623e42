"""A whole taskline deployment for one fault scenario: real services on private servers.

Invariant: every process and server a Cluster touches is one it started itself (the private
PostgreSQL and Redis handed to it, the api, workers and maintenance it spawned, each in a session
of its own), and every signal goes to a PID (or process group) it holds, never to a name. Each
service is a real `python -m taskline_cli.main ...` subprocess with short durations (lease 2 s,
heartbeat 0.5 s, reaper 0.5 s, reconcile 2 s, backoff 0.2/2/2). Optional TCP proxies sit between
all services of one kind and one server (`proxied={("worker", "postgres")}`), so a nemesis can
fault that link alone; the suite's own instruments (the checker, the handlers' execution log)
always talk to the servers directly.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import requests

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.migrate import upgrade
from taskline.store.queries import DEFAULT_SCHEMA
from taskline.store.store import Store
from taskline_cli.localservers import PrivatePostgres, PrivateRedis, free_port
from tests.faults import faulthandlers
from tests.helpers import service_env, wait_for
from tests.servers import new_database

REPO = Path(__file__).resolve().parents[2]
HANDLERS = "tests.faults.faulthandlers"
KINDS = ("api", "worker", "maintenance")
SERVERS = ("postgres", "redis")
DURATIONS: dict[str, Any] = {
    "lease_s": 2.0, "heartbeat_s": 0.5, "reaper_interval_s": 0.5, "reconcile_interval_s": 2.0,
    "backoff_base_s": 0.2, "backoff_factor": 2.0, "backoff_max_s": 2.0, "shutdown_grace_s": 3.0,
}
START_TIMEOUT_S = 30.0
SUPERVISE_EVERY_S = 0.2

_QUALIFIED = re.compile(r"(?<![\w.])taskline\.(?=[a-z_])")


class Service:
    """One service subprocess: its PID for the nemesis, its log, and how to run it again."""

    def __init__(self, kind: str, name: str, argv: list[str], env: dict[str, str],
                 log_dir: Path) -> None:
        self.kind, self.name, self.argv, self.env = kind, name, argv, env
        self.log_dir = log_dir
        self.logs: list[Path] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Spawn the process (again) in a session of its own; each run gets its own log file."""
        assert not self.alive, f"{self.name} is already running"
        self.starts += 1
        log_path = self.log_dir / f"{self.name}.{self.starts}.log"
        self.logs.append(log_path)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "taskline_cli.main", *self.argv], env=self.env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=REPO)

    def signal(self, sig: int, group: bool = False) -> None:
        """Send `sig` to the process (or its whole group) while it is unreaped."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group (the api's gunicorn workers die with their master)."""
        self.signal(signal.SIGCONT, group=True)
        self.signal(signal.SIGKILL, group=True)
        if self.proc is not None:
            self.proc.wait(10)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP, group=True)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT, group=True)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait; SIGKILL the group if it takes longer than `timeout`."""
        if not self.alive:
            self.signal(signal.SIGKILL, group=True)  # leftovers of a killed leader
            return
        self.thaw()
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.kill()
        self.signal(signal.SIGKILL, group=True)

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def with_port(url: str, port: int) -> str:
    """`url` pointing at 127.0.0.1:`port` instead of its own host and port."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


class Cluster:
    """api + workers + maintenance on a private PostgreSQL and Redis; see the module docstring.

    `env` holds extra environment per service kind (e.g. faketime for the workers), `settings`
    overrides the short durations, `supervise` restarts workers that exit (like systemd or
    Kubernetes would).
    """

    def __init__(self, postgres: PrivatePostgres, redis: PrivateRedis, workdir: Path, *,
                 workers: int = 1, concurrency: int = 2, maintenance: int = 1, api: bool = True,
                 api_workers: int = 2, proxied: Iterable[tuple[str, str]] = (),
                 env: Mapping[str, Mapping[str, str]] | None = None,
                 settings: Mapping[str, Any] | None = None, supervise: bool = False) -> None:
        self.postgres, self.redis = postgres, redis
        self.workdir = Path(workdir)
        self.log_dir = self.workdir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.plan = {"worker": workers, "maintenance": maintenance, "api": 1 if api else 0}
        self.concurrency = concurrency
        self.api_workers = api_workers
        self.proxied = set(proxied)
        assert all(k in KINDS and s in SERVERS for k, s in self.proxied), self.proxied
        self.extra_env = {k: dict(v) for k, v in (env or {}).items()}
        self.overrides = {**DURATIONS, **(settings or {})}
        self.supervised = supervise
        self.on_restart: Callable[[Service, int], None] | None = None
        """Told of each restart by the supervisor: the service and the PID that had died."""
        self.services: list[Service] = []
        self.proxies: dict[tuple[str, str], Any] = {}
        self.restarts = 0
        self._names = itertools.count(1)
        self._supervisor: threading.Thread | None = None
        self._closing = threading.Event()
        self._lock = threading.RLock()
        self.settings: Settings
        self.store: Store
        self.dispatcher: Dispatcher
        self.api_url = ""

    # --- lifecycle -----------------------------------------------------------------------

    def start(self, services: bool = True) -> Cluster:
        """Create the scenario's database and connections, then (unless not `services`) start
        every service and wait until each is ready (see `start_services`)."""
        database_url = new_database(self.postgres)
        faulthandlers.create_tables(database_url)
        self.settings = Settings.from_env(
            env={}, database_url=database_url, redis_url=self.redis.url,
            handlers=(HANDLERS,), metrics_port=0, log_format="json", **self.overrides)
        if self.settings.schema != DEFAULT_SCHEMA:
            # The template holds the default schema: gone, a statement naming it would fail.
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {DEFAULT_SCHEMA} CASCADE")
            upgrade(database_url, create=False, schema=self.settings.schema)
        self.store = Store.connect(database_url, pool_size=4, schema=self.settings.schema)
        self.dispatcher = Dispatcher(self.redis.url, block_timeout_s=0.2,
                                     partitions=self.settings.queue_partitions)
        for kind, server in sorted(self.proxied):
            self._start_proxy(kind, server)
        if services:
            self.start_services()
        return self

    def start_services(self, wait: bool = True) -> None:
        """Start the planned api, maintenance and workers; with `wait`, until the api is ready
        and every worker registered (without: a server they need may still be down)."""
        if self.plan["api"]:
            self.add_api(wait=wait)
        for _ in range(self.plan["maintenance"]):
            self.add_maintenance()
        for _ in range(self.plan["worker"]):
            self.add_worker(wait=wait)
        if self.supervised:
            self.supervise()

    def wait_ready(self) -> None:
        """Until the api is ready and every live worker registered."""
        if self.plan["api"]:
            self.wait_api_ready()
        for service in self.workers:
            if service.alive:
                self.wait_worker_registered(service)

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the supervisor, every service (thawed first), every proxy, our connections."""
        self._closing.set()
        if self._supervisor is not None:
            self._supervisor.join(5)
        for service in self.services:  # all at once: their shutdowns overlap
            if service.alive:
                service.thaw()
                service.signal(signal.SIGTERM)
        for service in reversed(self.services):
            service.stop(timeout=5)
        for proxy in self.proxies.values():
            with contextlib.suppress(Exception):
                proxy.stop()
        for name in ("store", "dispatcher"):
            obj = getattr(self, name, None)
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.dispose() if name == "store" else obj.close()

    # --- services ------------------------------------------------------------------------

    @property
    def workers(self) -> list[Service]:
        return self.of_kind("worker")

    @property
    def maintenances(self) -> list[Service]:
        return self.of_kind("maintenance")

    @property
    def api(self) -> Service:
        return self.of_kind("api")[0]

    def of_kind(self, kind: str) -> list[Service]:
        with self._lock:
            return [s for s in self.services if s.kind == kind]

    def service_env(self, kind: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of one `kind` service: settings, proxy URLs, handlers on the path."""
        settings = self.settings.replace(database_url=self.url(kind, "postgres"),
                                         redis_url=self.url(kind, "redis"))
        env = service_env(settings, PYTHONPATH=str(REPO),
                          FAULT_LOG_DATABASE_URL=self.settings.database_url)
        env.update(self.extra_env.get(kind, {}))
        env.update(extra or {})
        return env

    def add_worker(self, concurrency: int | None = None,
                   env: Mapping[str, str] | None = None, wait: bool = True) -> Service:
        argv = ["worker", "--queues", "default", "--concurrency",
                str(concurrency or self.concurrency), "--metrics-port", "0"]
        service = self._spawn("worker", argv, env)
        if wait:
            self.wait_worker_registered(service)
        return service

    def add_maintenance(self, env: Mapping[str, str] | None = None) -> Service:
        return self._spawn("maintenance", ["maintenance", "--metrics-port", "0"], env)

    def add_api(self, env: Mapping[str, str] | None = None, wait: bool = True) -> Service:
        port = free_port()
        argv = ["api", "--bind", f"127.0.0.1:{port}", "--workers", str(self.api_workers)]
        service = self._spawn("api", argv, env)
        self.api_url = f"http://127.0.0.1:{port}"
        if wait:
            self.wait_api_ready()
        return service

    def restart(self, service: Service, wait: bool = True) -> None:
        """Start a service again after it exited or was killed (same command, same env)."""
        with self._lock:
            if service.alive:
                service.kill()
            service.signal(signal.SIGKILL, group=True)
            service.start()
            self.restarts += 1
        if wait and service.kind == "worker":
            self.wait_worker_registered(service)
        elif wait and service.kind == "api":
            self.wait_api_ready()

    def _spawn(self, kind: str, argv: list[str], env: Mapping[str, str] | None) -> Service:
        name = f"{kind}-{next(self._names)}"
        service = Service(kind, name, argv, self.service_env(kind, env), self.log_dir)
        service.start()
        with self._lock:
            self.services.append(service)
        return service

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows of one statement on the scenario's database, on a connection of its own that
        bypasses every proxy (autocommit); see `in_schema`."""
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            return conn.execute(self.in_schema(sql), params).fetchall()

    def in_schema(self, sql: str) -> str:
        """`sql`, written against the default schema's tables (`taskline.jobs`), for this
        cluster's TASKLINE_SCHEMA: the suite's statements run under any setting."""
        return _QUALIFIED.sub(f"{self.settings.schema}.", sql)

    def wait_worker_registered(self, service: Service) -> None:
        """Until the workers table has a live row for this process (it takes work then)."""
        def registered() -> bool:
            assert service.alive, f"{service.name} exited:\n{service.log_text()[-3000:]}"
            return self.query("SELECT 1 FROM taskline.workers "
                              "WHERE pid = %s AND stopped_at IS NULL", (service.pid,)) != []
        wait_for(registered, timeout=START_TIMEOUT_S, interval=0.1,
                 message=f"{service.name} to register")

    def wait_api_ready(self) -> None:
        def ready() -> bool:
            assert self.api.alive, f"api exited:\n{self.api.log_text()[-3000:]}"
            try:
                return requests.get(self.api_url + "/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False
        wait_for(ready, timeout=START_TIMEOUT_S, interval=0.1, message="the api to be ready")

    # --- supervision ---------------------------------------------------------------------

    def supervise(self) -> None:
        """Restart any worker that exits, like a process supervisor, until close()."""
        if self._supervisor is not None:
            return
        self._supervisor = threading.Thread(target=self._supervise, name="fault-supervisor",
                                            daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        while not self._closing.wait(SUPERVISE_EVERY_S):
            for service in self.workers:
                if not service.alive and not self._closing.is_set():
                    died = service.pid
                    self.restart(service, wait=False)
                    if self.on_restart is not None:
                        self.on_restart(service, died)

    # --- proxies -------------------------------------------------------------------------

    def _start_proxy(self, kind: str, server: str) -> None:
        from tests.faults.proxy import Proxy

        port = self.postgres.port if server == "postgres" else self.redis.port
        self.proxies[(kind, server)] = Proxy("127.0.0.1", port).start()

    def proxy(self, kind: str, server: str) -> Any:
        """The proxy between every `kind` service and `server` (asked for at construction)."""
        return self.proxies[(kind, server)]

    def url(self, kind: str, server: str) -> str:
        """The URL `kind` services use for `server`: the proxy's when there is one."""
        direct = self.settings.database_url if server == "postgres" else self.settings.redis_url
        proxy = self.proxies.get((kind, server))
        return with_port(direct, proxy.port) if proxy is not None else direct

    # --- what the checker reads ----------------------------------------------------------

    def worker_logs(self) -> list[Path]:
        return [p for s in self.workers for p in s.logs]

    def log_events(self, kinds: Iterable[str] = KINDS) -> list[dict[str, Any]]:
        """Every JSON log record of the services of `kinds` (non-JSON lines are skipped)."""
        records = []
        for service in (s for s in list(self.services) if s.kind in kinds):
            for line in service.log_text().splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        records.append({**json.loads(line), "_service": service.name})
        return records

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no job is pending or running in PostgreSQL."""
        def idle() -> bool:
            [(n,)] = self.query("SELECT count(*) FROM taskline.jobs WHERE status IN "
                                "('queued','scheduled','retrying','running')")
            return n == 0
        wait_for(idle, timeout=timeout, interval=0.2, message="every job to finish")

