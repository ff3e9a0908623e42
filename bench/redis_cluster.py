"""The Redis side of dispatch on a single Redis and on a Redis Cluster, measured side by side.

Invariant: one dispatcher pushes N ids in batches of 100, fetches 16 at a time and acks them,
on the single Redis at `--redis-url` and on a private 3-master, 3-replica cluster this script
starts on free ports (tests.redis_cluster) and stops by PID; rounds alternate between the two,
so a noisy neighbour hits both alike. Only Redis is measured: no PostgreSQL, no handler.

    .venv/bin/python bench/redis_cluster.py --ids 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from tests.redis_cluster import RedisClusterServers

QUEUE = "bench-cluster"
PUSH_BATCH = 100
FETCH_BATCH = 16


def drain_rate(dispatcher: Dispatcher, n: int) -> float:
    """Ids per second through push, fetch and ack."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    started = time.perf_counter()
    for i in range(0, n, PUSH_BATCH):
        dispatcher.push([(QUEUE, 5, j) for j in ids[i:i + PUSH_BATCH]])
    done = 0
    while done < n:
        fetched = dispatcher.fetch(QUEUE, "bench-worker", FETCH_BATCH)
        dispatcher.ack([(QUEUE, j) for j in fetched], "bench-worker")
        done += len(fetched)
    rate = n / (time.perf_counter() - started)
    dispatcher.delete([QueueKeys(QUEUE).signal, QueueKeys(QUEUE).holders])
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--ids", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="taskline-bench-cluster-") as root:
        cluster = RedisClusterServers(Path(root))
        try:
            cluster.start()
            targets = {"single": Dispatcher(args.redis_url), "cluster": Dispatcher(cluster.url)}
            rates: dict[str, list[float]] = {name: [] for name in targets}
            for _ in range(args.rounds):
                for name, dispatcher in targets.items():
                    rates[name].append(drain_rate(dispatcher, args.ids))
            for name, found in rates.items():
                print(f"{name:8} median {statistics.median(found):8.0f} ids/s  "
                      f"rounds {' '.join(f'{r:.0f}' for r in found)}")
            for dispatcher in targets.values():
                dispatcher.close()
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
