"""Behind PgBouncer in `make bench`: drain and enqueue through a transaction-pooling PgBouncer,
in interleaved pairs with the same scenarios connected directly.

Invariant: only the processes under test go through the pooler. A PgBouncer (Debian's package,
started as in the tests by tests/pgbouncer.py) sits in front of the benchmark's PostgreSQL with
`POOL_SIZE` server connections, fewer than the processes' pools hold together, so connections
are really shared between transactions; the processes get its address as DATABASE_URL,
`TASKLINE_DATABASE_POOLING=transaction` and the direct address as
`TASKLINE_DATABASE_DIRECT_URL` (for LISTEN and migrate), as docs/deployment.md describes. The
benchmark's own bookkeeping queries stay direct. Each run also reports the machine's CPU per job
(user + system of every process, from /proc/stat) over the measured phase.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import scenarios as sc
from clients import post_concurrently
from stack import Stack

from tests.pgbouncer import BINARY, running_pgbouncer

POOL_SIZE = 20
ENQUEUE_CLIENTS = 8


def available() -> bool:
    """Whether PgBouncer is installed (.ci/run installs Debian's package)."""
    return Path(BINARY).is_file()


@contextlib.contextmanager
def through_pgbouncer(stack: Stack) -> Iterator[None]:
    """Processes started inside the block reach PostgreSQL through a PgBouncer."""
    parts = urlsplit(stack.admin_url)
    with running_pgbouncer(parts.port or 5432, upstream_host=parts.hostname or "127.0.0.1",
                           users=(parts.username or "root",), pool_size=POOL_SIZE) as bouncer:
        kept = dict(stack.extra_env)
        stack.extra_env.update({"DATABASE_URL": bouncer.url(stack.url),
                                "TASKLINE_DATABASE_POOLING": "transaction",
                                "TASKLINE_DATABASE_DIRECT_URL": stack.url})
        try:
            yield
        finally:
            stack.extra_env.clear()
            stack.extra_env.update(kept)


def machine_cpu_s() -> float:
    """Seconds of user + system CPU the whole machine has spent since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system = (int(v) for v in fields[:3])
    irq, softirq = int(fields[5]), int(fields[6])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _cpu_of(phase: Callable[[], float], jobs: int) -> tuple[float, float]:
    """(the phase's result, machine CPU ms per job over it)."""
    before = machine_cpu_s()
    rate = phase()
    return rate, (machine_cpu_s() - before) * 1000 / jobs


def drain(stack: Stack, jobs: int, workers: int = 2) -> tuple[float, float]:
    """(jobs/s, CPU ms per job) of `workers` worker processes draining `jobs` no-op jobs."""
    sc._backlog(stack, jobs)

    def run() -> float:
        with stack.workers(workers, sc.DRAIN_CONCURRENCY):
            sc.wait_drained(stack, jobs)
        return sc.steady_rate(stack)

    return _cpu_of(run, jobs)


def enqueue(stack: Stack, jobs: int, clients: int = ENQUEUE_CLIENTS) -> tuple[float, float]:
    """(jobs/s, CPU ms per job) of `clients` client processes POSTing one job per request."""
    stack.reset()
    with stack.api() as base:
        before = machine_cpu_s()
        seconds = post_concurrently(base, "/api/v1/jobs", sc.NOOP, jobs, clients, warmup=20)
        cpu_ms = (machine_cpu_s() - before) * 1000 / jobs
    return jobs // clients * clients / seconds, cpu_ms


def pairs(stack: Stack, jobs: int, repeat: int,
          arm: Callable[[Stack], contextlib.AbstractContextManager[None]] | None = None,
          label: str = "pgbouncer", base: str = "direct") -> dict[str, Any]:
    """Plain then `arm` (through PgBouncer unless given), `repeat` interleaved pairs of each
    scenario; arm / plain ratios of the rate and of the CPU per job."""
    arm = arm or through_pgbouncer
    out: dict[str, Any] = {}
    for name, scenario in (("drain_2_workers", drain),
                           ("enqueue_single_8_clients", lambda s, n: enqueue(s, min(n, 4000)))):
        plain, armed = [], []
        for _ in range(repeat):
            plain.append(scenario(stack, jobs))
            with arm(stack):
                armed.append(scenario(stack, jobs))
        out[name] = {
            f"{base}_jobs_per_s": _summary([d[0] for d in plain]),
            f"{label}_jobs_per_s": _summary([p[0] for p in armed]),
            f"{base}_cpu_ms_per_job": _summary([d[1] for d in plain]),
            f"{label}_cpu_ms_per_job": _summary([p[1] for p in armed]),
            f"rate_{label}_over_{base}": _summary(
                [p[0] / d[0] for p, d in zip(armed, plain, strict=True)]),
            f"cpu_{label}_over_{base}": _summary(
                [p[1] / d[1] for p, d in zip(armed, plain, strict=True)]),
        }
    return out


def _summary(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {"median": ordered[len(ordered) // 2], "min": ordered[0], "max": ordered[-1],
            "runs": values}
