"""Dispatch from PostgreSQL in `make bench`: what a Redis outage costs, measured in the same run
as the normal path it is compared with.

Invariant: Redis is made unreachable only for the processes under test, by giving them the
address of a closed port (a worker or API started while Redis is down must work too); the
backlog is enqueued beforehand through an API that reaches Redis, so both drains start from
the same queued jobs in PostgreSQL. Normal and degraded drains run in interleaved pairs, so a
noisy neighbour hits both alike, and each pair gives one share (degraded / normal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import scenarios as sc
from clients import Connection
from stack import Stack, wait_until

from taskline_cli.localservers import free_port


@contextlib.contextmanager
def redis_unreachable(stack: Stack) -> Iterator[None]:
    """Processes started inside the block are given a Redis address nothing listens on."""
    kept = stack.redis_url
    stack.redis_url = f"redis://127.0.0.1:{free_port()}/0"
    try:
        yield
    finally:
        stack.redis_url = kept


def drain_redis_down(stack: Stack, jobs: int, workers: int = 2) -> float:
    """Jobs/s of `workers` worker processes that cannot reach Redis, draining `jobs` no-op
    jobs straight from PostgreSQL."""
    sc._backlog(stack, jobs)
    with redis_unreachable(stack), stack.workers(workers, sc.DRAIN_CONCURRENCY):
        sc.wait_drained(stack, jobs)
    return sc.steady_rate(stack)


def drain_pairs(stack: Stack, jobs: int, repeat: int, workers: int = 2) -> dict[str, Any]:
    """Normal then Redis-down drains, `repeat` interleaved pairs; the share of each pair."""
    normal, down = [], []
    for _ in range(repeat):
        normal.append(sc.drain(stack, jobs, workers))
        down.append(drain_redis_down(stack, jobs, workers))
    shares = [d / n for d, n in zip(down, normal, strict=True)]
    return {"normal": _summary(normal), "redis_down": _summary(down),
            "share_redis_down_over_normal": _summary(shares)}


def pickup_redis_down(stack: Stack, jobs: int = 200, spacing_s: float = 0.02) -> dict[str, Any]:
    """An idle worker's pickup latency, ms, while neither it nor the API reaches Redis: the
    API's failed push is followed by a NOTIFY that wakes the worker's LISTEN."""
    stack.reset()
    sent, answered = {}, {}
    with redis_unreachable(stack), stack.api() as base, stack.workers(1, 4):
        sc.idle_workers(stack, 1)
        conn = Connection(base)
        body = b'{"type": "bench.stamp", "payload": {}}'
        for _ in range(jobs):
            t0 = sc.time.time()
            job = conn.post("/api/v1/jobs", body)
            answered[job["id"]], sent[job["id"]] = sc.time.time(), t0
            sc.time.sleep(spacing_s)
        conn.close()
        wait_until(lambda: stack.count("succeeded") >= jobs, timeout=60)
    rows = stack.sql("SELECT j.id::text, (j.result->>'started')::float8 FROM taskline.jobs j")
    return {"from_201_ms": sc.quantiles([(r[1] - answered[r[0]]) * 1000 for r in rows]),
            "from_request_ms": sc.quantiles([(r[1] - sent[r[0]]) * 1000 for r in rows])}


def _summary(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {"median": ordered[len(ordered) // 2], "min": ordered[0], "max": ordered[-1],
            "runs": values}
