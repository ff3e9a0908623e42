"""The Celery side of the side-by-side runs: no-op, Redis-round-trip and 10 ms tasks on the
benchmark's Redis DB (the I/O job bodies are taskline's own, bench/iojobs.py).

Settings follow Celery's "Optimizing" guide for many short tasks on 2 cores: the prefork pool
with one process per core, a large prefetch multiplier, results ignored, and no gossip, mingle
or heartbeat traffic. Acknowledgement is Celery's default (early: at most once). The I/O drains
start their workers with the threads pool instead (bench/peers.py says why).
"""

from __future__ import annotations

import os

import iojobs
from celery import Celery

QUEUE = "bench_celery"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
app = Celery("peer_celery", broker=REDIS_URL)
app.conf.update(task_ignore_result=True, worker_prefetch_multiplier=64,
                task_default_queue=QUEUE, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)


@app.task(name="noop")
def noop() -> None:
    return None


@app.task(name="redis")
def redis_round_trip() -> None:
    iojobs.redis_round_trip(REDIS_URL)


@app.task(name="sleep10")
def sleep10() -> None:
    iojobs.sleep10()
