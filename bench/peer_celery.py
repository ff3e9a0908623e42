"""The Celery side of the side-by-side run: a no-op task on the benchmark's Redis DB.

Settings follow Celery's "Optimizing" guide for many short tasks on 2 cores: the prefork pool
with one process per core, a large prefetch multiplier, results ignored, and no gossip, mingle
or heartbeat traffic. Acknowledgement is Celery's default (early: at most once).
"""

from __future__ import annotations

import os

from celery import Celery

QUEUE = "bench_celery"
app = Celery("peer_celery", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"))
app.conf.update(task_ignore_result=True, worker_prefetch_multiplier=64,
                task_default_queue=QUEUE, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)


@app.task(name="noop")
def noop() -> None:
    return None
