"""Where an enqueue's time goes, per way in: the parts of one call, timed apart.

Usage: python bench/enqueue_costs.py [--calls N]

On the benchmark's stack (bench/stack.py: a private PostgreSQL with fsync on, the benchmark's
Redis DB), one process, after a warm-up, medians of `--calls` calls each:
- library: the validation and row encoding `taskline.enqueue` does in Python; the whole call on
  an autocommit psycopg connection (the statement with its commit); the same statement's
  execution time inside PostgreSQL (EXPLAIN ANALYZE, no commit); a bare one-row INSERT's
  autocommit round trip (the commit floor); and, with the outbox relay running in this
  process, the commit to the id's arrival in its Redis ready list;
- client: `Client.enqueue`'s own CPU and its wall time against the API (2 gunicorn processes).
Figures in ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import client_cpu
import psycopg
import redis
from stack import open_stack

import taskline
from taskline.client import Client
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.enqueuing import _STATEMENT_PARAMS, _body, _row
from taskline.jobspec import parse_job
from taskline.settings import Settings
from taskline.store.store import Store, _rows_json, driver_sql
from taskline_maintenance.outbox import OutboxRelay

WARMUP = 50


def median_ms(fn: Callable[[], object], calls: int) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def library(url: str, redis_url: str, calls: int) -> dict[str, float]:
    settings = Settings()

    def python_part() -> None:
        spec = parse_job(_body("bench.noop", None, {}), settings)
        _rows_json([_row(spec)])

    out = {"library_python_ms": median_ms(python_part, calls)}
    with psycopg.connect(url, autocommit=True) as conn:
        out["library_call_ms"] = median_ms(lambda: taskline.enqueue(conn, "bench.noop"), calls)
        out["bare_insert_commit_ms"] = median_ms(lambda: conn.execute(
            "INSERT INTO taskline.enqueue_outbox (job_id, queue) "
            "VALUES (gen_random_uuid(), 'x')"), calls)
        out["statement_in_postgres_ms"] = _explained(conn, calls)
        conn.execute("TRUNCATE taskline.enqueue_outbox")
        out["commit_to_redis_ms"] = _relayed(conn, url, redis_url, calls)
    return out


def _explained(conn: psycopg.Connection, calls: int) -> float:
    sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + driver_sql("enqueue_in_transaction")
    spec = parse_job(_body("bench.noop", None, {}), Settings())
    runs = []
    with conn.transaction(force_rollback=True):
        for _ in range(calls):
            plan = conn.execute(sql, {"jobs": _rows_json([_row(spec)]), **_STATEMENT_PARAMS,
                                      "limit_checked": False}).fetchone()[0][0]
            runs.append(plan["Execution Time"] + plan["Planning Time"])
    return statistics.median(runs)


def _relayed(conn: psycopg.Connection, url: str, redis_url: str, calls: int) -> float:
    """Median ms from an enqueue's return (its commit) to its id in the ready list."""
    store, dispatcher = Store.connect(url, pool_size=2), Dispatcher(redis_url)
    relay, stop = OutboxRelay(store, dispatcher, url), threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    client, ready = redis.Redis.from_url(redis_url), QueueKeys("default").ready(5)
    try:
        while relay.listens == 0:
            time.sleep(0.01)
        times = []
        for _ in range(calls):
            taskline.enqueue(conn, "bench.noop")
            committed = time.perf_counter()
            client.brpop([ready], timeout=5)
            times.append(time.perf_counter() - committed)
            time.sleep(0.005)
    finally:
        stop.set()
        thread.join(5)
        dispatcher.close()
        store.dispose()
    return 1000 * statistics.median(times)


def client(base: str, calls: int) -> dict[str, float]:
    """The client's CPU and wall time per enqueue, measured as bench/client_cpu.py does."""
    measured = client_cpu.measure(base, Client, calls)
    return {"client_cpu_ms": measured["cpu_ms_per_call"],
            "client_call_ms": measured["wall_ms_per_call"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    with open_stack(False) as stack:
        stack.reset()
        results = library(stack.url, stack.redis_url, args.calls)
        stack.reset()
        with stack.api() as base:
            results.update(client(base, args.calls))
    for name, value in results.items():
        print(f"{name:28s} {value:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
