"""The benchmark's stack: PostgreSQL, Redis and the real taskline processes it starts and stops.

Invariant: every measurement starts from an empty benchmark database (migrated) and an empty
Redis logical DB, and every process the benchmark starts is stopped (by its own PID) when the
measurement ends. PostgreSQL runs with fsync on: by default a private cluster on a free
loopback port (initdb defaults, so nothing other programs do on the shared server, such as the
checkpoint every CREATE DATABASE forces, lands inside a measurement); `--shared-postgres`
uses BENCH_ADMIN_URL instead.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from taskline.store.queries import DEFAULT_SCHEMA, in_schema
from taskline_cli.localservers import PrivatePostgres, free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.helpers' /proc reading, shared with the tests
from tests.helpers import connections_per_process, every_process_serving  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
DB_NAME = "taskline_bench"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
SHARED_ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgresql://root@127.0.0.1:5432/postgres")


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(interval)


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL after `timeout`: this process only, never a name match."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


SET_PREFIX = "BENCH_SET_"


class Stack:
    """Where the benchmark's PostgreSQL and Redis are, and how taskline processes reach them."""

    def __init__(self, admin_url: str, redis_url: str = REDIS_URL) -> None:
        self.admin_url = admin_url
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        # BENCH_SET_TASKLINE_X=v in the benchmark's environment sets TASKLINE_X=v for every
        # process it starts (its own TASKLINE_ variables are not passed on): one setting's
        # effect is measured by pairs of one checkout (bench/pairs.py --after-env).
        self.extra_env: dict[str, str] = {
            k.removeprefix(SET_PREFIX): v for k, v in os.environ.items()
            if k.startswith(SET_PREFIX + "TASKLINE_")}
        self.api_pid = 0  # the gunicorn master serving now (the API's or the floor's)
        # Per measurement: the client connections each gunicorn process holds (see placement).
        self.placements: list[list[int]] = []
        self.group_sizes: list[float] = []
        self._sql: psycopg.Connection | None = None
        # The benchmark measures the installation as configured: TASKLINE_SCHEMA is passed to
        # every process, and the benchmark's own statements (written `taskline.jobs`) follow.
        self.schema = os.environ.get("TASKLINE_SCHEMA") or DEFAULT_SCHEMA
        self.private_postgres = False
        """Whether PostgreSQL is the benchmark's own cluster (its CPU is then the stack's)."""
        self.postgres_log: Path | None = None
        """The private cluster's server log (bench/history.py reads autovacuum's runs in it)."""
        self.db_name = DB_NAME
        """The database the processes use; bench/history.py switches it to compare two."""
        self.last_cpu: dict[str, float] | None = None
        """The last drain's CPU ms per job by component (bench/cpu.py), for run.py to report."""

    @property
    def url(self) -> str:
        return urlunsplit(urlsplit(self.admin_url)._replace(path="/" + self.db_name))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLINE_")}
        env["TASKLINE_SCHEMA"] = self.schema
        path = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
        env.update({"DATABASE_URL": self.url, "REDIS_URL": self.redis_url,
                    "TASKLINE_METRICS_PORT": "0", "TASKLINE_LOG_LEVEL": "WARNING",
                    "TASKLINE_HANDLERS": "benchjobs", "PYTHONPATH": path,
                    "PYTHONUNBUFFERED": "1", **self.extra_env})
        return env

    def spawn(self, *args: str) -> subprocess.Popen:
        """A `taskline` subcommand as its own process (stdout and stderr discarded)."""
        return subprocess.Popen([sys.executable, "-m", "taskline_cli.main", *args],
                                env=self.env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    @contextmanager
    def process(self, *args: str) -> Iterator[subprocess.Popen]:
        proc = self.spawn(*args)
        try:
            yield proc
        finally:
            stop(proc)

    @contextmanager
    def workers(self, count: int, concurrency: int) -> Iterator[list[subprocess.Popen]]:
        with ExitStack() as stack:
            yield [stack.enter_context(self.process("worker", "--concurrency", str(concurrency)))
                   for _ in range(count)]

    def reset(self) -> None:
        """A fresh database and an empty Redis DB."""
        self.close_sql()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {self.db_name}")
        subprocess.run([sys.executable, "-m", "taskline_cli.main", "migrate"], env=self.env(),
                       check=True, stdout=subprocess.DEVNULL)
        if os.environ.get("BENCH_DECLARED") == "1":  # bench/benchjobs.py's declared types
            subprocess.run([sys.executable, str(BENCH_DIR / "declare.py")], env=self.env(),
                           check=True, stdout=subprocess.DEVNULL)
        self.redis.flushdb()

    def sql(self, query: str, *params: object) -> list[tuple]:
        # One kept connection: the drains poll every 0.1 s, and a new connection per poll
        # would fork a PostgreSQL backend each time, on the CPU the measured stack needs.
        if self._sql is None or self._sql.closed:
            self._sql = psycopg.connect(self.url, autocommit=True)
        return self._sql.execute(in_schema(query, self.schema), params).fetchall()

    def postmaster_pid(self) -> int | None:
        """The private cluster's postmaster (the parent of this connection's backend)."""
        if not self.private_postgres:
            return None
        backend = self.sql("SELECT pg_backend_pid()")[0][0]
        with open(f"/proc/{backend}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])

    def redis_pid(self) -> int | None:
        """The Redis server's process, when it runs on this machine."""
        if urlsplit(self.redis_url).hostname not in ("127.0.0.1", "localhost", "::1"):
            return None
        pid = int(self.redis.info("server").get("process_id", 0))
        return pid if pid and os.path.exists(f"/proc/{pid}") else None

    def close_sql(self) -> None:
        if self._sql is not None:
            self._sql.close()
            self._sql = None

    def count(self, *statuses: str) -> int:
        return self.sql("SELECT count(*) FROM taskline.jobs WHERE status = ANY(%s)",
                        list(statuses))[0][0]

    @contextmanager
    def api(self, workers: int = 2) -> Iterator[str]:
        port = free_port()
        with self.process("api", "--bind", f"127.0.0.1:{port}", "--workers", str(workers)) as proc:
            self.api_pid = proc.pid  # gunicorn's master; its children serve the requests
            base = f"http://127.0.0.1:{port}"
            self._wait_serving(base, workers)
            yield base

    @contextmanager
    def http_floor(self, workers: int = 2) -> Iterator[str]:
        """bench/floor_app.py under gunicorn with the API's worker class, threads, sockets and
        connection balancing (bench/floor_gunicorn.conf.py)."""
        conf = runpy.run_path(str(ROOT / "services" / "producer" / "http" / "gunicorn.conf.py"))
        port = free_port()
        args = [sys.executable, "-m", "gunicorn", "--workers", str(workers),
                "--config", str(BENCH_DIR / "floor_gunicorn.conf.py"),
                "--worker-class", conf["worker_class"], "--threads", str(conf["threads"]),
                "--keep-alive", str(conf["keepalive"]), "--bind", f"127.0.0.1:{port}",
                "--log-level", "warning", *(["--reuse-port"] if conf["reuse_port"] else []),
                "floor_app:app"]
        proc = subprocess.Popen(args, env=self.env(), cwd=BENCH_DIR,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.api_pid = proc.pid
        try:
            base = f"http://127.0.0.1:{port}"
            self._wait_serving(base, workers)
            yield base
        finally:
            stop(proc)

    def _wait_serving(self, base: str, workers: int) -> None:
        """Until the server at `base` is ready and every one of its processes serves, so the
        clients that connect next are balanced over all of them."""
        port = urlsplit(base).port or 0
        wait_until(lambda: _ready(base) and every_process_serving(self.api_pid, port, workers),
                   timeout=60, interval=0.1)

    def record_placement(self, base: str) -> None:
        """Append how many of the connections to `base` each gunicorn process serves.

        Until change 29 the kernel placed connections by a hash, blind to load, and two
        keep-alive clients shared one process in about half the runs (docs/performance.md,
        change 27); the processes now accept by least connections (taskline_producer.http.balancer).
        Recorded with every enqueue measurement so that its spread can be read against it.
        """
        counts = connections_per_process(self.api_pid, urlsplit(base).port or 0)
        self.placements.append(sorted(counts.values(), reverse=True))

    def record_group_size(self, base: str) -> None:
        """Append the mean count of single enqueues written per statement since the API
        started (`taskline_enqueue_group_size`, summed over its processes; group commit)."""
        text = requests.get(base + "/metrics", timeout=10).text
        totals = {sample.name: sample.value for family in text_string_to_metric_families(text)
                  if family.name == "taskline_enqueue_group_size" for sample in family.samples}
        count = totals.get("taskline_enqueue_group_size_count")
        if count:
            self.group_sizes.append(round(totals["taskline_enqueue_group_size_sum"] / count, 2))

    def server_facts(self) -> dict[str, str]:
        with psycopg.connect(self.admin_url) as conn:
            facts = {name: str(conn.execute(f"SHOW {name}").fetchone()[0])
                     for name in ("server_version", "fsync", "synchronous_commit",
                                  "wal_sync_method", "shared_buffers")}
        facts["redis"] = self.redis.info()["redis_version"]
        return facts


def _ready(base: str) -> bool:
    try:
        return requests.get(base + "/readyz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def open_stack(shared_postgres: bool, *, postgres: type[PrivatePostgres] = PrivatePostgres,
               kind: type[Stack] = Stack) -> Iterator[Stack]:
    """The benchmark's stack (a `kind`): a private PostgreSQL (fsync on; a `postgres`, such as
    bench/costs.py's counting one) unless `shared_postgres`."""
    with ExitStack() as resources:
        admin_url = SHARED_ADMIN_URL
        if not shared_postgres:
            root = resources.enter_context(tempfile.TemporaryDirectory(prefix="taskline-bench-"))
            os.chmod(root, 0o711)  # the `postgres` account must pass through
            pg = postgres(Path(root) / "pg")
            resources.callback(pg.close)
            pg.init()
            pg.start()
            admin_url = pg.url()
        stack = kind(admin_url)
        stack.private_postgres = not shared_postgres
        stack.postgres_log = None if shared_postgres else pg.log_path
        resources.callback(stack.close_sql)
        yield stack
