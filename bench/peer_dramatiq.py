"""The Dramatiq side of the side-by-side runs: no-op, Redis-round-trip and 10 ms actors on the
benchmark's Redis DB (the I/O job bodies are taskline's own, bench/iojobs.py).

Dramatiq's documented defaults are its recommended settings: one process per core and 8
threads each, the default middleware, late acknowledgement (at least once).
"""

from __future__ import annotations

import os

import dramatiq
import iojobs
from dramatiq.brokers.redis import RedisBroker

QUEUE = "bench_dramatiq"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop() -> None:
    return None


@dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="redis")
def redis_round_trip() -> None:
    iojobs.redis_round_trip(REDIS_URL)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def sleep10() -> None:
    iojobs.sleep10()
