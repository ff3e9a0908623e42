"""Ordering keys in `make bench`: a drain of jobs spread over 100 ordering keys beside the same
drain without keys, in interleaved pairs.

Invariant: the two arms differ only in the `ordering_key` field: the same count of no-op jobs,
enqueued by the same batches, drained by 2 worker processes x 16 slots; with keys, job i carries
key i % KEYS, so at most KEYS jobs can run at once and each key's jobs start one at a time, in
enqueue order. The ratio keyed / plain of each pair is reported (the target: at least 0.5).
"""

from __future__ import annotations

from typing import Any

import scenarios as sc
from clients import post_concurrently
from stack import Stack

KEYS = 100
WORKERS = 2
SLOTS = 16


def _backlog(stack: Stack, jobs: int, keyed: bool) -> None:
    stack.reset()
    batches = jobs // 1000
    with stack.api() as base:
        for b in range(batches):  # each batch names its own keys in turn: i % KEYS overall
            batch = [{"type": "bench.noop", "payload": {},
                      **({"ordering_key": f"k{(b * 1000 + i) % KEYS}"} if keyed else {})}
                     for i in range(1000)]
            post_concurrently(base, "/api/v1/jobs/batch", {"jobs": batch}, 1, 1)


def drain(stack: Stack, jobs: int, keyed: bool) -> float:
    """Jobs/s of WORKERS x SLOTS draining `jobs` no-op jobs, over KEYS ordering keys or none."""
    _backlog(stack, jobs, keyed)
    with stack.workers(WORKERS, SLOTS):
        sc.wait_drained(stack, jobs)
    return sc.steady_rate(stack)


def pairs(stack: Stack, jobs: int, repeat: int) -> dict[str, Any]:
    plain, keyed = [], []
    for _ in range(repeat):
        plain.append(drain(stack, jobs, keyed=False))
        keyed.append(drain(stack, jobs, keyed=True))
    ratios = sorted(k / p for k, p in zip(keyed, plain, strict=True))
    return {"plain_jobs_per_s": plain, "keyed_jobs_per_s": keyed,
            "ratio_keyed_over_plain": {"median": ratios[len(ratios) // 2], "min": ratios[0],
                                       "max": ratios[-1], "runs": ratios}}
