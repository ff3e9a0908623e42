"""Redis key names: the only place that builds them.

Every key of a queue carries the hash tag `{queue}`, so each Lua script touches one cluster
slot. Scripts receive keys only through KEYS, built here.
"""

from __future__ import annotations

import re
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


def worker_key(worker_id: str) -> str:
    """Heartbeat key of a worker; it expires when the worker stops beating."""
    return f"{PREFIX}:worker:{worker_id}"


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one queue."""

    queue: str

    def __post_init__(self) -> None:
        if not valid_queue_name(self.queue):
            raise ValueError(f"invalid queue name {self.queue!r}")

    @property
    def base(self) -> str:
        return f"{PREFIX}:{{{self.queue}}}"

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
