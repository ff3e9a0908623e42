"""Redis key names: the only place that builds them.

Every key of a queue carries the hash tag `{queue}`, so each Lua script touches one cluster
slot. Scripts receive keys only through KEYS, built here.

Partitions (TASKLINE_QUEUE_PARTITIONS): partition 0 of a queue is its plain `{queue}` keys,
partition i > 0 carries the hash tag `{queue#i}` (`#` is never part of a queue name), so a
queue's lists can spread over several slots while a single partition keeps today's keys.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from taskline.jobs import MAX_PRIORITY, MIN_PRIORITY

PREFIX = "taskline"
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
QUEUES_SET = f"{PREFIX}:queues"
PROCESSING_PATTERN = f"{PREFIX}:{{*}}:processing:*"
"""Every queue's processing lists (QueueKeys.processing): one SCAN finds those of all queues."""
DISPATCH_MARKER = f"{PREFIX}:dispatch:rebuilt"
"""`<writer token>:<epoch ms>`: the ready lists hold every job queued in PostgreSQL as of that
instant (PostgreSQL's clock). Written last by the rebuild after Redis returns, then renewed by
the active maintenance instance while Redis stays up; a Redis restarted empty lacks it, and
one restored from an old snapshot holds an old one."""


def dispatch_marker_ms(marker: str | None) -> int:
    """The instant a rebuild marker vouches for, in epoch ms; -1 for none or a garbled one."""
    if not marker:
        return -1
    _, _, ms = marker.rpartition(":")
    return int(ms) if ms.isdigit() else -1


def valid_queue_name(name: object) -> bool:
    return isinstance(name, str) and QUEUE_NAME.fullmatch(name) is not None


PARTITION_SEP = "#"


def partition_of(job_id: str, partitions: int) -> int:
    """The partition a job's id lives in among `partitions` (its home): a stable hash, so
    every process finds an id where a producer with the same setting put it."""
    if partitions <= 1:
        return 0
    return zlib.crc32(str(job_id).encode()) % partitions


def split_partition(name: str) -> tuple[str, int]:
    """(queue, partition) of a name in the queues set: `q` is partition 0, `q#i` is i."""
    queue, sep, index = name.rpartition(PARTITION_SEP)
    if sep and index.isdigit():
        return queue, int(index)
    return name, 0


def partition_of_key(key: str) -> int:
    """The partition a queue key (`taskline:{q}:...` or `taskline:{q#i}:...`) belongs to."""
    return split_partition(key[len(PREFIX) + 2:key.index("}")])[1]


def worker_key(worker_id: str) -> str:
    """Heartbeat key of a worker; it expires when the worker stops beating."""
    return f"{PREFIX}:worker:{worker_id}"


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one partition of a queue (partition 0: the queue's plain keys)."""

    queue: str
    partition: int = 0

    def __post_init__(self) -> None:
        if not valid_queue_name(self.queue):
            raise ValueError(f"invalid queue name {self.queue!r}")
        if self.partition < 0:
            raise ValueError(f"invalid partition {self.partition!r}")

    @property
    def name(self) -> str:
        """The partition's name in the queues set and its hash tag: `q` or `q#i`."""
        return self.queue if not self.partition else f"{self.queue}{PARTITION_SEP}{self.partition}"

    @property
    def base(self) -> str:
        return f"{PREFIX}:{{{self.name}}}"

    def ready(self, priority: int) -> str:
        return f"{self.base}:ready:{priority}"

    @property
    def ready_by_urgency(self) -> list[str]:
        """Ready lists, most urgent first: the order a worker takes from them."""
        return [self.ready(p) for p in range(MAX_PRIORITY, MIN_PRIORITY - 1, -1)]

    def processing(self, worker_id: str) -> str:
        return f"{self.base}:processing:{worker_id}"

    @property
    def holders(self) -> str:
        """Set of the workers that may hold a processing list of this queue: the fetch script
        adds a worker as it moves ids into its list, reconciliation forgets one whose list is
        gone. Found without SCAN, which on Redis Cluster would have to visit every node."""
        return f"{self.base}:holders"

    @property
    def processing_pattern(self) -> str:
        return f"{self.base}:processing:*"

    def worker_of(self, processing_key: str) -> str:
        return processing_key.rsplit(":processing:", 1)[1]

    @property
    def retry(self) -> str:
        return f"{self.base}:retry"

    @property
    def scheduled(self) -> str:
        return f"{self.base}:scheduled"

    @property
    def dlq(self) -> str:
        return f"{self.base}:dlq"

    @property
    def signal(self) -> str:
        return f"{self.base}:signal"

    @property
    def paused(self) -> str:
        """Present while the queue is paused: the fetch script takes nothing from it. A copy of
        the queue_pauses row, restored by workers and reconciliation when Redis lost it."""
        return f"{self.base}:paused"

    def snapshot(self, name: str) -> str:
        return f"{self.base}:reconcile:{name}"
