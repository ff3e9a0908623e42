"""`make bench`: taskline's throughput and latency on the real stack.

Starts a gunicorn API and worker processes against a fresh benchmark database (PostgreSQL with
fsync as configured on the server, the full audit trail kept) and a dedicated Redis logical DB,
then measures: single enqueue over HTTP (1 and 8 clients), batch enqueue over HTTP, drain of a
backlog of no-op jobs on 1 and 2 worker processes, and pickup latency of an idle worker. Every
scenario runs several times; medians and min-max are printed and written as JSON.

Usage: python bench/run.py [--jobs N] [--repeat R] [--out bench-results/latest.json]
Environment: BENCH_ADMIN_URL (PostgreSQL admin URL, default postgresql://root@127.0.0.1/postgres),
BENCH_REDIS_URL (default redis://127.0.0.1:6379/9; that logical DB is flushed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis
import requests

ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgresql://root@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
DB_NAME = "taskline_bench"
ROOT = Path(__file__).resolve().parent.parent


def db_url(name: str) -> str:
    return urlunsplit(urlsplit(ADMIN_URL)._replace(path="/" + name))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLINE_")}
    env.update({"DATABASE_URL": db_url(DB_NAME), "REDIS_URL": REDIS_URL,
                "TASKLINE_METRICS_PORT": "0", "TASKLINE_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1"})
    return env


@contextmanager
def process(*args: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "taskline_cli.main", *args],
                            env=service_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reset_state() -> None:
    """A fresh database and an empty Redis DB for each measurement."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    subprocess.run([sys.executable, "-m", "taskline_cli.main", "migrate"], env=service_env(),
                   check=True, stdout=subprocess.DEVNULL)
    redis.Redis.from_url(REDIS_URL).flushdb()


def count(status: str) -> int:
    with psycopg.connect(db_url(DB_NAME)) as conn:
        return conn.execute("SELECT count(*) FROM jobs WHERE status = %s", (status,)).fetchone()[0]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(interval)


@contextmanager
def api() -> Iterator[str]:
    port = free_port()
    with process("api", "--bind", f"127.0.0.1:{port}", "--workers", "2"):
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(base), timeout=30, interval=0.1)
        yield base


def _ready(base: str) -> bool:
    try:
        return requests.get(base + "/readyz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def single_enqueue(base: str, jobs: int, clients: int) -> float:
    """Jobs/s for `clients` threads each POSTing its share of `jobs` one at a time."""
    def client(n: int) -> None:
        with requests.Session() as session:
            for _ in range(n):
                r = session.post(base + "/api/v1/jobs", json={"type": "echo", "payload": {}})
                r.raise_for_status()

    threads = [threading.Thread(target=client, args=(jobs // clients,)) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (jobs // clients) * clients / (time.perf_counter() - start)


def batch_enqueue(base: str, jobs: int, batch: int = 1000) -> float:
    body = {"jobs": [{"type": "echo", "payload": {}} for _ in range(batch)]}
    with requests.Session() as session:
        start = time.perf_counter()
        for _ in range(jobs // batch):
            session.post(base + "/api/v1/jobs/batch", json=body).raise_for_status()
        return (jobs // batch) * batch / (time.perf_counter() - start)


def drain(base: str, jobs: int, workers: int, concurrency: int) -> float:
    """Jobs/s draining a backlog of `jobs` no-op jobs with `workers` worker processes."""
    batch_enqueue(base, jobs)
    procs = [process("worker", "--concurrency", str(concurrency)) for _ in range(workers)]
    start = time.perf_counter()
    for p in procs:
        p.__enter__()
    try:
        wait_until(lambda: count("succeeded") >= jobs, timeout=600, interval=0.05)
        return jobs / (time.perf_counter() - start)
    finally:
        for p in procs:
            p.__exit__(None, None, None)


def pickup_latency(base: str, jobs: int = 300, spacing_s: float = 0.02) -> dict[str, float]:
    """Enqueue-to-start latency (PostgreSQL clock: lease start minus row creation) of an idle
    worker, over `jobs` jobs spaced `spacing_s` apart."""
    with process("worker", "--concurrency", "4"), requests.Session() as session:
        time.sleep(2)  # let the worker start and go idle
        for _ in range(jobs):
            session.post(base + "/api/v1/jobs", json={"type": "echo"}).raise_for_status()
            time.sleep(spacing_s)
        wait_until(lambda: count("succeeded") >= jobs, timeout=60)
    with psycopg.connect(db_url(DB_NAME)) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM l.leased_at - j.created_at) * 1000 FROM job_leases l "
            "JOIN jobs j ON j.id = l.job_id ORDER BY 1").fetchall()
    ms = [float(r[0]) for r in rows]
    return {"p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95),
            "p99_ms": percentile(ms, 99)}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def repeat(fn: Callable[[str], float], times: int) -> dict[str, float]:
    results = []
    for _ in range(times):
        reset_state()
        with api() as base:
            results.append(fn(base))
    return {"median": statistics.median(results), "min": min(results), "max": max(results),
            "runs": results}


def machine() -> dict[str, str]:
    with psycopg.connect(ADMIN_URL) as conn:
        pg = conn.execute("SHOW server_version").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    return {"python": platform.python_version(), "cpus": str(os.cpu_count()),
            "platform": platform.platform(), "postgresql": pg, "fsync": fsync,
            "redis": redis.Redis.from_url(REDIS_URL).info()["redis_version"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "latest.json"))
    args = parser.parse_args()
    n, r = args.jobs, args.repeat
    scenarios: dict[str, Callable[[str], float]] = {
        "enqueue_single_1_client_jobs_per_s": lambda b: single_enqueue(b, min(n, 2000), 1),
        "enqueue_single_8_clients_jobs_per_s": lambda b: single_enqueue(b, min(n, 4000), 8),
        "enqueue_batch_jobs_per_s": lambda b: batch_enqueue(b, n),
        "drain_1_worker_jobs_per_s": lambda b: drain(b, n, 1, 16),
        "drain_2_workers_jobs_per_s": lambda b: drain(b, n, 2, 16),
    }
    report: dict[str, object] = {"machine": machine(), "jobs": n, "repeat": r}
    print(json.dumps(report["machine"]))
    for name, fn in scenarios.items():
        report[name] = repeat(fn, r)
        print(f"{name:40s} median {report[name]['median']:10.1f}  "
              f"min {report[name]['min']:10.1f}  max {report[name]['max']:10.1f}", flush=True)
    reset_state()
    with api() as base:
        report["pickup_latency"] = pickup_latency(base)
    print("pickup latency (idle worker, 300 jobs 20 ms apart):", report["pickup_latency"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
