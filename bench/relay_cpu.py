"""`python bench/relay_cpu.py --before DIR --after DIR`: the outbox relay's CPU per job an
application enqueues in bulk, in interleaved pairs of two checkouts.

Every job written by `taskline.enqueue_many` (or `enqueue`) inside an application's transaction
reaches Redis through maintenance's outbox relay: the relay hears each job's announcement,
pushes the ids and deletes their outbox rows. This measures that relay's own CPU per job, alone:
each run of a side is this script started with that checkout's virtualenv (so it imports that
checkout's taskline and maintenance) on a fresh database its own `taskline migrate` made and an
empty Redis DB. It builds the relay as maintenance does, listening on a connection of its own,
then `--batches` times writes `--batch` no-op jobs in one autocommit `enqueue_many` and turns
the relay until it has pushed them and deleted their rows; the figure is the thread CPU time
(`time.thread_time`) of those turns over the jobs, so the producer and PostgreSQL are left out.
It checks that Redis holds every id. Pairs alternate which side runs first.

Usage: python bench/relay_cpu.py --before DIR --after DIR [--pairs 7] [--batches 20]
           [--batch 1000] [--out bench-results/relay_cpu.json]
Environment: BENCH_DATABASE_URL (an admin connection; default the local server as root),
BENCH_REDIS_URL (default redis://127.0.0.1:6379/9, flushed by every run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from library_pairs import run_in_tree
from pairs import alternating, compared

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
NOOP = "bench.noop"
HOUR_S = 3600.0


def measure(url: str, batches: int, batch: int) -> dict[str, Any]:
    """The relay's thread CPU per job over `batches` bulk enqueues of `batch` jobs (one warm-up
    batch first)."""
    import psycopg
    import redis

    import taskline
    from taskline.dispatch.dispatcher import Dispatcher
    from taskline.store.store import Store
    from taskline_maintenance.outbox import OutboxRelay

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    store, dispatcher = Store.connect(url), Dispatcher(REDIS_URL)
    relay = OutboxRelay(store, dispatcher, url, backstop_s=HOUR_S)  # no drain by the clock
    relay._turn()  # maintenance's first turn: listens, then drains the (empty) outbox
    jobs = [{"type": NOOP}] * batch
    cpu = 0.0
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(batches + 1):
            taskline.enqueue_many(conn, jobs)
            started = time.thread_time()
            pushed = 0
            while pushed < batch:
                turned = relay._turn()
                pushed += turned.pushed if turned is not None else 0
            relay._forget_pushed()
            if n:  # the first batch warms up (statements prepared, scripts loaded)
                cpu += time.thread_time() - started
    relay._close()
    held = sum(client.llen(key) for key in client.keys("taskline:*:ready:*"))
    if held != (batches + 1) * batch:
        raise RuntimeError(f"Redis holds {held} ids, {(batches + 1) * batch} were enqueued")
    return {"taskline": str(Path(taskline.__file__).resolve().parent),
            "relay_cpu_us_per_job": cpu / (batches * batch) * 1e6}


def run_side(tree: Path, batches: int, batch: int) -> float:
    """One run of `tree`'s code on a fresh database its own `taskline migrate` made."""
    result = run_in_tree(tree, Path(__file__), "--measure",
                         ["--batches", str(batches), "--batch", str(batch)])
    return float(result["relay_cpu_us_per_job"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/relay_cpu.json"))
    parser.add_argument("--measure", metavar="DATABASE_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.batches, args.batch)))
        return 0
    if args.before is None or args.after is None:
        parser.error("--before and --after are required")
    pairs = []
    for n in range(args.pairs):
        run = {side: run_side(getattr(args, side), args.batches, args.batch)
               for side in alternating(n)}
        pairs.append(run)
        print(f"pair {n + 1}: before {run['before']:.2f}, after {run['after']:.2f} us/job, "
              f"ratio {run['before'] / run['after']:.3f}", flush=True)
    ratios = [p["before"] / p["after"] for p in pairs]
    summary = compared(ratios, (p["before"] for p in pairs), (p["after"] for p in pairs))
    print(f"relay CPU per job, before / after: ratio median {summary['median_ratio']:.3f} "
          f"(min {summary['min']:.3f}, max {summary['max']:.3f}); before "
          f"{summary['before_median']:.2f} us, after {summary['after_median']:.2f} us")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"pairs": pairs, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
