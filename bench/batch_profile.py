"""`python bench/batch_profile.py`: where the API's time goes on a plain batch enqueue.

Runs the producer app in this process (Flask's test client, no HTTP server), against real
PostgreSQL and Redis, on a fresh database migrated by the checkout's own migrations, and posts
POST /api/v1/jobs/batch of 1,000 no-op jobs: warm-up batches, then `--batches` without the
profiler, reporting the CPU per job of this process and of its PostgreSQL backends (/proc),
then `--profiled` batches under cProfile, reporting Python function calls per job, the
profiled time per job (wall time: waits on PostgreSQL included) and the functions with most
own time. It imports only what every checkout since the batch API has, so one script measures
an older tree too (run it with that tree's virtualenv).

Usage: python bench/batch_profile.py [--batches 20] [--profiled 20] [--warmup 3] [--top 25]
           [--dump FILE] [--opcodes N]
`--opcodes N` also counts the Python bytecode instructions N batches execute, per job: what the
machine's load leaves unchanged, for comparing two checkouts on a busy host.
Environment: BENCH_DATABASE_URL (an admin connection, default the local server as root),
BENCH_REDIS_URL (default redis://127.0.0.1:6379/9; the logical database is flushed).
"""

from __future__ import annotations

import argparse
import os
import pstats
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis
from opcodes import count_opcodes
from psycopg import sql

from taskline.settings import Settings
from taskline.store.migrate import upgrade
from taskline_producer.app import close_app, create_app

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgresql://root@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
BODY = {"jobs": [{"type": "bench.noop", "payload": {}}] * 1000}


def _admin(statement: sql.Composable) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


def _post(client: object, batches: int) -> None:
    for _ in range(batches):
        answer = client.post("/api/v1/jobs/batch", json=BODY)  # type: ignore[attr-defined]
        assert answer.status_code == 201, answer.get_data(as_text=True)


def _profiler() -> Any:
    # This directory's profile.py would shadow the standard library module cProfile imports.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import cProfile
    return cProfile.Profile()


def _backends_cpu(name: str) -> float:
    """CPU seconds (user + system) so far of the PostgreSQL backends connected to `name`."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))]
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except FileNotFoundError:  # a backend that ended meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _measure(client: Any, name: str, batches: int) -> tuple[float, float]:
    """(API process CPU, PostgreSQL backends' CPU) per job, us, over `batches` batches."""
    pg, started = _backends_cpu(name), time.process_time()
    _post(client, batches)
    api = time.process_time() - started
    jobs = batches * 1000
    return api / jobs * 1e6, (_backends_cpu(name) - pg) / jobs * 1e6


def _opcodes(client: Any, batches: int) -> int:
    """Python bytecode instructions executed by `batches` batches (bench/opcodes.py)."""
    return count_opcodes(lambda: _post(client, batches))


def _report(profile: Any, jobs: int, top: int, dump: str | None) -> None:
    stats = pstats.Stats(profile)
    print(f"profiled: calls per job {stats.total_calls / jobs:.1f}, "  # type: ignore[attr-defined]
          f"time per job {stats.total_tt / jobs * 1e6:.1f} us")  # type: ignore[attr-defined]
    if dump:
        stats.dump_stats(dump)
    stats.sort_stats("tottime").print_stats(top)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=20, help="measured without the profiler")
    parser.add_argument("--profiled", type=int, default=20, help="batches under cProfile")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--dump", default=None, help="also write the raw pstats to this file")
    parser.add_argument("--opcodes", type=int, default=0,
                        help="batches whose Python bytecode instructions are counted")
    args = parser.parse_args()
    name = f"taskline_prof_{uuid.uuid4().hex[:10]}"
    url = urlunsplit(urlsplit(ADMIN_URL)._replace(path="/" + name))
    redis.Redis.from_url(REDIS_URL).flushdb()
    upgrade(url)
    try:
        app = create_app(Settings.from_env(env={}, database_url=url, redis_url=REDIS_URL,
                                           metrics_port=0, log_format="text"))
        client = app.test_client()
        _post(client, args.warmup)
        api, pg = _measure(client, name, args.batches)
        print(f"CPU per job: API process {api:.1f} us, PostgreSQL {pg:.1f} us "
              f"({args.batches} batches of 1,000)", flush=True)
        if args.opcodes:
            per_job = _opcodes(client, args.opcodes) / (args.opcodes * 1000)
            print(f"Python bytecode instructions per job: {per_job:.1f}", flush=True)
        if args.profiled:
            profile = _profiler()
            profile.runcall(_post, client, args.profiled)
        close_app(app)
    finally:
        _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        redis.Redis.from_url(REDIS_URL).flushdb()
    if args.profiled:
        _report(profile, args.profiled * 1000, args.top, args.dump)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
