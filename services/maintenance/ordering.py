"""Ordering-key gauges, exported by the active maintenance instance only.

Invariant: one process exports them (a standby clears what it exported while leading), read
from PostgreSQL in one statement per pass over the index of keyed unfinished jobs: per queue,
the keys with unfinished jobs and their queued jobs (a key's head may start; the others wait
their turn, so a queued count well above the key count means long lines behind slow heads).
Interval: every `TASKLINE_REAPER_INTERVAL_S` seconds, like the depth gauges.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from taskline.metrics import ORDERING_KEYS, ORDERING_QUEUED, LabelGuard
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.views import MaintenanceStore


@dataclass(frozen=True)
class OrderingResult:
    keys: int
    queued: int


class OrderingGauges(Periodic):
    """Sets the ordering-key gauges from PostgreSQL; clears them when not leading."""

    name = "ordering"

    def __init__(self, store: MaintenanceStore, settings: Settings, *,
                 queues: LabelGuard | None = None) -> None:
        super().__init__()
        self.store = store
        self.settings = settings
        self._label = queues or LabelGuard()

    @property
    def interval_s(self) -> float:
        return self.settings.reaper_interval_s

    def idle(self) -> None:
        self.clear()

    def run_once(self) -> OrderingResult:
        keys: Counter[str] = Counter()
        queued: Counter[str] = Counter()
        for row in self.store.ordering_key_counts():
            label = self._label(row.queue)  # queues past the label limit add up under 'other'
            keys[label] += row.keys
            queued[label] += row.queued
        self.clear()  # a queue whose lines emptied must read nothing, not its last value
        for label in keys:
            ORDERING_KEYS.labels(queue=label).set(keys[label])
            ORDERING_QUEUED.labels(queue=label).set(queued[label])
        return OrderingResult(sum(keys.values()), sum(queued.values()))

    def clear(self) -> None:
        ORDERING_KEYS.clear()
        ORDERING_QUEUED.clear()
