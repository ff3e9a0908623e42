"""`python bench/costs.py`: what one job costs PostgreSQL and Redis, as the servers count it.

Starts a private PostgreSQL (fsync on, pg_stat_statements loaded) and a private Redis on free
loopback ports, so nothing else's traffic is counted, and runs the real `taskline api`,
`worker` and `maintenance` processes against them. For each phase (single enqueue over HTTP,
batch enqueue, running the jobs, idle maintenance) it reads what the servers counted:
statements (each one a round trip; BEGIN and COMMIT included), commits, rows written per table,
WAL bytes, Redis commands and Redis memory per waiting id. docs/scaling.md quotes its output.

With --expire, one retention pass then deletes every finished job (made 8 days old first):
its WAL and rows per job, and the bytes left on disk.

Usage: python bench/costs.py [--jobs N] [--expire] [--out bench-results/costs.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import redis
import requests

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.migrate import upgrade
from taskline.store.store import Store
from taskline_cli.localservers import PrivatePostgres, PrivateRedis, free_port
from taskline_maintenance.retention import Retention

ROOT = Path(__file__).resolve().parent.parent
DB = "taskline_costs"
# Marks this script's own queries, so the statement counts leave them out.
PROBE = "/* costs-probe */ "
TABLES = ("jobs", "job_events", "job_leases", "workers", "leader_leases", "dead_letter_jobs")


class CountingPostgres(PrivatePostgres):
    """A private PostgreSQL with fsync as in production and every statement counted."""

    def _argv(self) -> list[str]:
        return [*super()._argv(), "-c", "shared_preload_libraries=pg_stat_statements",
                "-c", "pg_stat_statements.track_utility=on", "-c", "pg_stat_statements.max=1000"]


class Stack:
    """The private servers and the environment that points taskline processes at them."""

    def __init__(self, pg: PrivatePostgres, rd: PrivateRedis) -> None:
        self.pg, self.rd = pg, rd
        self.url = pg.url(DB)
        self.redis = redis.Redis.from_url(rd.url, decode_responses=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLINE_")}
        env.update({"DATABASE_URL": self.url, "REDIS_URL": self.rd.url,
                    "TASKLINE_LOG_LEVEL": "WARNING", "TASKLINE_METRICS_PORT": "0"})
        return env

    @contextmanager
    def process(self, *args: str) -> Iterator[subprocess.Popen]:
        proc = subprocess.Popen([sys.executable, "-m", "taskline_cli.main", *args],
                                env=self.env(), stdout=subprocess.DEVNULL)
        try:
            yield proc
        finally:
            proc.terminate()
            proc.wait(60)

    def count(self, status: str) -> int:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(PROBE + "SELECT count(*) FROM taskline.jobs WHERE status = %s",
                               (status,))
            return row.fetchone()[0]


@contextmanager
def servers() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="taskline-costs-") as root:
        os.chmod(root, 0o711)  # the `postgres` account must pass through
        pg, rd = CountingPostgres(Path(root) / "pg"), PrivateRedis(Path(root) / "redis")
        try:
            pg.init()
            pg.start()
            rd.start()
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DB}")
            with psycopg.connect(pg.url(DB), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
            upgrade(pg.url(DB))
            yield Stack(pg, rd)
        finally:
            pg.close()
            rd.close()


# --- counters --------------------------------------------------------------------------------

def snapshot(stack: Stack) -> dict[str, object]:
    """The servers' cumulative counters (pg_stat_statements and Redis stats are reset first)."""
    with psycopg.connect(stack.pg.url(), autocommit=True) as conn:
        db = conn.execute("SELECT xact_commit, pg_current_wal_lsn() FROM pg_stat_database "
                          "WHERE datname = %s", (DB,)).fetchone()
    with psycopg.connect(stack.url, autocommit=True) as conn:
        # A partition's counts are its table's (migration 0021 partitions the history).
        tables = {name: (ins, upd, hot, dele) for name, ins, upd, hot, dele in conn.execute(
            PROBE + "SELECT COALESCE(r.relname, s.relname), sum(s.n_tup_ins)::bigint, "
            "sum(s.n_tup_upd)::bigint, sum(s.n_tup_hot_upd)::bigint, sum(s.n_tup_del)::bigint "
            "FROM pg_stat_user_tables s LEFT JOIN pg_class r ON r.oid = "
            "pg_partition_root(s.relid) AND r.oid <> s.relid GROUP BY 1")}
    return {"commits": db[0], "lsn": str(db[1]), "tables": tables,
            "redis_memory": stack.redis.info("memory")["used_memory"]}


def reset(stack: Stack) -> dict[str, object]:
    with psycopg.connect(stack.url, autocommit=True) as conn:
        conn.execute(PROBE + "SELECT pg_stat_statements_reset()")
    stack.redis.config_resetstat()
    return snapshot(stack)


def statements(stack: Stack) -> list[tuple[int, str]]:
    """(calls, first line of the query) of every statement run in the taskline database."""
    with psycopg.connect(stack.url, autocommit=True) as conn:
        rows = conn.execute(
            PROBE + "SELECT calls, query FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s AND query NOT LIKE '%%costs-probe%%' "
            "ORDER BY calls DESC", (DB,)).fetchall()
    return [(calls, " ".join(query.split())[:90]) for calls, query in rows]


def difference(stack: Stack, before: dict, jobs: int) -> dict[str, object]:
    """Per-job costs since `before` (stats of exited backends are flushed within a second)."""
    time.sleep(1.5)
    after = snapshot(stack)
    with psycopg.connect(stack.pg.url(), autocommit=True) as conn:
        wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)",
                           (after["lsn"], before["lsn"])).fetchone()[0]
    stmts = statements(stack)
    rows = {name: [a - b for a, b in zip(after["tables"][name], before["tables"][name],
                                         strict=True)] for name in TABLES}
    commands = {k.removeprefix("cmdstat_"): v["calls"]
                for k, v in stack.redis.info("commandstats").items()}
    return {
        "jobs": jobs,
        "statements_per_job": sum(c for c, _ in stmts) / jobs,
        "commits_per_job": (after["commits"] - before["commits"]) / jobs,
        "wal_bytes_per_job": float(wal) / jobs,
        "rows_per_job": {t: {"inserted": r[0] / jobs, "updated": r[1] / jobs,
                             "hot_updated": r[2] / jobs, "deleted": r[3] / jobs}
                         for t, r in rows.items() if any(r)},
        "redis_commands_per_job": {k: v / jobs for k, v in sorted(commands.items())},
        "redis_memory_delta_per_job": (after["redis_memory"] - before["redis_memory"]) / jobs,
        "top_statements": stmts[:12],
    }


# --- phases ----------------------------------------------------------------------------------

def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


@contextmanager
def api(stack: Stack) -> Iterator[str]:
    port = free_port()
    with stack.process("api", "--bind", f"127.0.0.1:{port}", "--workers", "1"):
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(base), 30)
        yield base


def _ready(base: str) -> bool:
    try:
        return requests.get(base + "/readyz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def enqueue_single(stack: Stack, jobs: int) -> dict[str, object]:
    with api(stack) as base, requests.Session() as session:
        before = reset(stack)
        for _ in range(jobs):
            session.post(base + "/api/v1/jobs", json={"type": "echo"}).raise_for_status()
    return difference(stack, before, jobs)


def enqueue_batch(stack: Stack, jobs: int, batch: int = 100) -> dict[str, object]:
    body = {"jobs": [{"type": "echo"} for _ in range(batch)]}
    with api(stack) as base, requests.Session() as session:
        before = reset(stack)
        for _ in range(jobs // batch):
            session.post(base + "/api/v1/jobs/batch", json=body).raise_for_status()
    return difference(stack, before, jobs // batch * batch)


def run_jobs(stack: Stack, jobs: int) -> dict[str, object]:
    before = reset(stack)
    with stack.process("worker", "--concurrency", "16", "--metrics-port", "0"):
        wait_until(lambda: stack.count("succeeded") >= jobs, 300)
    return difference(stack, before, jobs)


def idle_maintenance(stack: Stack, first_s: float = 120.0,
                     seconds: float = 30.0) -> tuple[dict[str, object], dict[str, object]]:
    """Per second, one active maintenance service with nothing to do: its first `first_s`
    (the first passes: a fresh install's empty `_legacy` history partitions dropped by
    retention, PostgreSQL's own autovacuum analysing the tables the run wrote), then the
    `seconds` after them (its steady polling). Figures are per second."""
    with stack.process("maintenance", "--metrics-port", "0"):
        before = reset(stack)
        time.sleep(first_s)
        first = difference(stack, before, int(first_s))
        before = reset(stack)
        time.sleep(seconds)
        steady = difference(stack, before, int(seconds))
    return first, steady


def storage(stack: Stack, jobs: int) -> dict[str, float]:
    """Bytes on disk per finished job, per table (heap and TOAST, then indexes; a partitioned
    table's partitions added up), and the status index's share of `jobs`."""
    with psycopg.connect(stack.url, autocommit=True) as conn:
        conn.execute(PROBE + "VACUUM ANALYZE")
        sizes = {name: (heap, index) for name, heap, index in conn.execute(
            PROBE + "SELECT COALESCE(r.relname, s.relname), sum(pg_table_size(s.relid))::bigint, "
            "sum(pg_indexes_size(s.relid))::bigint FROM pg_stat_user_tables s LEFT JOIN pg_class r "
            "ON r.oid = pg_partition_root(s.relid) AND r.oid <> s.relid GROUP BY 1").fetchall()}
        status_index = conn.execute(
            PROBE + "SELECT COALESCE(sum(pg_relation_size(indexrelid)), 0)::bigint "
            "FROM pg_stat_user_indexes WHERE indexrelname LIKE 'jobs_status_created%%'"
        ).fetchone()[0]
    out = {}
    for name in ("jobs", "job_events", "job_leases"):
        out[name] = sum(sizes[name]) / jobs
        out[f"{name}_table"] = sizes[name][0] / jobs
        out[f"{name}_indexes"] = sizes[name][1] / jobs
    out["jobs_status_created_index"] = status_index / jobs
    out["total"] = sum(out[name] for name in ("jobs", "job_events", "job_leases"))
    return out


def expire_all(stack: Stack, jobs: int) -> dict[str, object]:
    """WAL and rows of one retention pass deleting every finished job: the jobs and their
    history made 8 days old first (not counted), past the 7 days of succeeded jobs."""
    with psycopg.connect(stack.url, autocommit=True) as conn:
        conn.execute(PROBE + "UPDATE taskline.jobs SET finished_at = finished_at - "
                     "interval '8 days', created_at = created_at - interval '8 days'")
        conn.execute(PROBE + "UPDATE taskline.job_events SET created_at = created_at - "
                     "interval '8 days'")
        conn.execute(PROBE + "UPDATE taskline.job_leases SET leased_at = leased_at - "
                     "interval '8 days'")
        conn.execute(PROBE + "VACUUM ANALYZE")
    settings = Settings.from_env(env={}, database_url=stack.url, redis_url=stack.rd.url)
    store, dispatcher = Store.connect(stack.url, pool_size=2), Dispatcher(stack.rd.url)
    try:
        before = reset(stack)
        started = time.monotonic()
        Retention(store, dispatcher, settings, rest=lambda _s: None).run_once()
        took = time.monotonic() - started
        out = difference(stack, before, jobs)
    finally:
        store.dispose()
        dispatcher.close()
    out["pass_seconds"] = took
    out["jobs_left"] = stack.count("succeeded")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--expire", action="store_true",
                        help="then one retention pass deleting every finished job")
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "costs.json"))
    args = parser.parse_args()
    report: dict[str, object] = {}
    with servers() as stack:
        report["enqueue_single"] = enqueue_single(stack, args.jobs)
        report["enqueue_batch_100"] = enqueue_batch(stack, args.jobs)
        total = stack.count("queued")
        report["run_echo_jobs"] = run_jobs(stack, total)
        report["disk_bytes_per_finished_job"] = storage(stack, total)
        first, steady = idle_maintenance(stack)
        report["idle_maintenance_first_passes_per_second"] = first
        report["idle_maintenance_per_second"] = steady
        if args.expire:
            report["expire_all"] = expire_all(stack, total)
            report["disk_bytes_after_expiry"] = storage(stack, total)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
