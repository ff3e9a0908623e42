"""Celery and Dramatiq draining the same no-op backlog on the same Redis, measured like taskline.

Invariant: each peer's backlog is enqueued before its workers start, and its rate is taken
between the moment 5 % of the backlog is done (start-up and warm-up excluded, as for taskline)
and the moment nothing is left unacknowledged, polled every 5 ms in Redis itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from stack import BENCH_DIR, Stack, stop

CORES = str(os.cpu_count() or 2)


def _env(stack: Stack) -> dict[str, str]:
    env = dict(os.environ)
    env["BENCH_REDIS_URL"] = stack.redis_url
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", ""))
                                        if p)
    return env


def _timed(remaining: Callable[[], int], jobs: int, timeout: float = 1200) -> float:
    """Jobs/s from 5 % done to all done, `remaining` polled every 5 ms."""
    deadline = time.monotonic() + timeout
    started = None
    while (left := remaining()) > 0:
        if started is None and left <= jobs * 0.95:
            started = time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError("peer drain did not finish")
        time.sleep(0.005)
    ended = time.perf_counter()
    return jobs * 0.95 / (ended - (started or ended))


def _drain(stack: Stack, argv: list[str], enqueue: str, remaining: Callable[[], int],
           jobs: int) -> float:
    stack.redis.flushdb()
    subprocess.run([sys.executable, "-c", enqueue], env=_env(stack), check=True, cwd=BENCH_DIR)
    if remaining() != jobs:
        raise RuntimeError(f"peer backlog holds {remaining()} of {jobs} messages")
    proc = subprocess.Popen(argv, env=_env(stack), cwd=BENCH_DIR, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        return _timed(remaining, jobs)
    finally:
        stop(proc)


def celery_drain(stack: Stack, jobs: int) -> float:
    from peer_celery import QUEUE
    r = stack.redis
    enqueue = f"from peer_celery import noop\nfor _ in range({jobs}): noop.delay()"
    argv = [sys.executable, "-m", "celery", "-A", "peer_celery", "worker", "-P", "prefork",
            "-c", CORES, "-Q", QUEUE, "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-l", "WARNING"]
    return _drain(stack, argv, enqueue, lambda: r.llen(QUEUE) + r.hlen("unacked"), jobs)


def dramatiq_drain(stack: Stack, jobs: int) -> float:
    from peer_dramatiq import QUEUE
    r = stack.redis
    enqueue = (f"from peer_dramatiq import noop, broker\n"
               f"for _ in range({jobs}): noop.send()")
    argv = [sys.executable, "-m", "dramatiq", "peer_dramatiq", "--processes", CORES,
            "--threads", "8"]
    return _drain(stack, argv, enqueue, lambda: r.hlen(f"dramatiq:{QUEUE}.msgs"), jobs)
