"""On Redis Cluster in `make bench`: the 2-worker drain and 8 clients' single enqueues with a
3-master, 3-replica Redis Cluster, in interleaved pairs with the same scenarios on the single
Redis (`pairs`), and on the cluster with TASKLINE_QUEUE_PARTITIONS 3 against 1
(`partition_pairs`: one queue's lists on three masters instead of one).

Invariant: only the processes under test are given the cluster. The cluster is started once
from the `redis-server` binary on free ports (tests/redis_cluster.py, as the tests do) and
stopped by PID; inside an arm the stack's REDIS_URL names one of its nodes, as an operator
writes it, and the benchmark's own Redis calls (flush, counters) go to the cluster through
redis-py's cluster client. PostgreSQL is the same in both arms.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pooled
from redis.cluster import RedisCluster
from stack import Stack

from tests.redis_cluster import RedisClusterServers


class _ClusterFlush(RedisCluster):
    """The cluster client with `flushdb` meaning every primary, as the stack's reset expects."""

    def flushdb(self, *args: Any, **kwargs: Any) -> Any:
        return self.flushall(target_nodes=RedisCluster.PRIMARIES)


@contextlib.contextmanager
def _cluster() -> Iterator[RedisClusterServers]:
    with tempfile.TemporaryDirectory(prefix="taskline-bench-cluster-") as root:
        cluster = RedisClusterServers(Path(root))
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.close()


def _on(cluster: RedisClusterServers) -> Callable[[Stack], contextlib.AbstractContextManager[None]]:
    """An arm: processes started inside it are given the cluster."""

    @contextlib.contextmanager
    def on_cluster(stack: Stack) -> Iterator[None]:
        kept_url, kept_client = stack.redis_url, stack.redis
        stack.redis_url = cluster.url
        stack.redis = _ClusterFlush.from_url(cluster.url)
        try:
            yield
        finally:
            stack.redis.close()
            stack.redis_url, stack.redis = kept_url, kept_client

    return on_cluster


def pairs(stack: Stack, jobs: int, repeat: int) -> dict[str, Any]:
    """Single Redis then cluster, `repeat` interleaved pairs (bench/pooled.py's pairs)."""
    with _cluster() as cluster:
        return pooled.pairs(stack, jobs, repeat, arm=_on(cluster), label="cluster",
                            base="single")


@contextlib.contextmanager
def _partitions(stack: Stack, n: int) -> Iterator[None]:
    kept = dict(stack.extra_env)
    stack.extra_env["TASKLINE_QUEUE_PARTITIONS"] = str(n)
    try:
        yield
    finally:
        stack.extra_env.clear()
        stack.extra_env.update(kept)


def partition_pairs(stack: Stack, jobs: int, repeat: int, partitions: int = 3
                    ) -> dict[str, Any]:
    """On the cluster, the default single partition then `partitions`, `repeat` interleaved
    pairs of the same two scenarios."""
    with _cluster() as cluster, _on(cluster)(stack):
        return pooled.pairs(stack, jobs, repeat,
                            arm=lambda s: _partitions(s, partitions),
                            label=f"partitions_{partitions}", base="partitions_1")
