"""Workflow benchmarks: a fan-out into one fan-in, and the handoff along a chain.

Invariant: both time the engine's release path only, on the same host clock as the handler
stamps (`bench.stamp` returns when its handler started). `fan_in`: from the POST of a workflow
of N parallel steps and one step after all of them, to that last step's start. `chain`: along
a chain of N steps, each step's start minus its parent's start (a `bench.stamp` handler returns
at once, so that is the parent's completion write, its release of the child, the push and the
child's pickup), against the same run's idle pickup of a single job (pickup_idle_worker's
from_201_ms), the target being a median handoff at most 1.5 x the pickup median.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from clients import Connection
from scenarios import DRAIN_CONCURRENCY, idle_workers, pickup, quantiles
from stack import Stack, wait_until

STAMP = {"type": "bench.stamp", "payload": {}}


def _submit(base: str, name: str, steps: list[dict[str, Any]]) -> tuple[float, dict[str, str]]:
    """(wall time just before the POST, step id -> job id)."""
    conn = Connection(base)
    body = json.dumps({"name": name, "steps": steps}).encode()
    t0 = time.time()
    answer = conn.post("/api/v1/workflows", body)
    conn.close()
    return t0, {s["id"]: s["job_id"] for s in answer["steps"]}


def _started(stack: Stack, job_ids: list[str]) -> dict[str, float]:
    rows = stack.sql("SELECT id::text, (result->>'started')::float8 FROM taskline.jobs "
                     "WHERE id = ANY(%s::uuid[])", job_ids)
    return {r[0]: float(r[1]) for r in rows}


def fan_in(stack: Stack, parts: int = 999, workers: int = 2) -> float:
    """Seconds from submitting `parts` parallel steps and their fan-in to the fan-in's start."""
    stack.reset()
    names = [f"p{i}" for i in range(parts)]
    steps = [{"id": n, "job": STAMP} for n in names]
    steps.append({"id": "fan_in", "job": STAMP, "after": names})
    with stack.api() as base, stack.workers(workers, DRAIN_CONCURRENCY):
        idle_workers(stack, workers)
        t0, jobs = _submit(base, "fan-in", steps)
        wait_until(lambda: stack.count("succeeded") >= parts + 1, timeout=600, interval=0.05)
    return _started(stack, [jobs["fan_in"]])[jobs["fan_in"]] - t0


def chain(stack: Stack, length: int = 100) -> dict[str, Any]:
    """Handoff latency along a chain of `length` steps, ms, and the idle pickup beside it."""
    idle = pickup(stack, jobs=100)["from_201_ms"]
    stack.reset()
    steps = [{"id": "s0", "job": STAMP}] + [{"id": f"s{i}", "job": STAMP, "after": [f"s{i - 1}"]}
                                            for i in range(1, length)]
    with stack.api() as base, stack.workers(1, 4):
        idle_workers(stack, 1)
        _t0, jobs = _submit(base, "chain", steps)
        wait_until(lambda: stack.count("succeeded") >= length, timeout=600, interval=0.05)
    started = _started(stack, list(jobs.values()))
    times = [started[jobs[f"s{i}"]] for i in range(length)]
    handoffs = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    ratio = quantiles(handoffs)["p50"] / idle["p50"] if idle["p50"] else None
    return {"handoff_ms": quantiles(handoffs), "idle_pickup_ms": idle,
            "p50_handoff_over_pickup": ratio,
            "within_1_5x": ratio is not None and ratio <= 1.5}


