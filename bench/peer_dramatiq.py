"""The Dramatiq side of the side-by-side run: a no-op actor on the benchmark's Redis DB.

Dramatiq's documented defaults are its recommended settings: one process per core and 8
threads each, the default middleware, late acknowledgement (at least once).
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

QUEUE = "bench_dramatiq"
broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop() -> None:
    return None
