"""Pause markers: keeps each queue's Redis pause marker equal to PostgreSQL's queue_pauses,
and exports which queues are paused.

Invariant: PostgreSQL decides whether a queue is paused (no claim takes a job of a paused
queue); the marker only keeps workers from fetching what the claim would refuse. The API writes
the marker after its commit; this pass, once a second on the active maintenance instance,
writes a lost one (Redis flushed or restarted empty, an API that failed between its commit and
Redis) and removes one left behind (a resume whose Redis write failed), so a pause or a resume
reaches every worker within a second either way. `taskline_queue_paused{queue}` is 1 for each
paused queue and `taskline_queue_paused_since_timestamp_seconds{queue}` the instant it was
paused (exported by the leader only, cleared by a standby).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import valid_queue_name
from taskline.metrics import QUEUE_PAUSED, QUEUE_PAUSED_SINCE, LabelGuard
from taskline.service import Periodic
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
"""A pause or resume whose Redis write was lost reaches the workers at most this late."""


@dataclass(frozen=True)
class PauseResult:
    paused: int
    written: int
    removed: int


class PauseMarkers(Periodic):
    """Writes missing pause markers, removes stale ones, exports the paused gauges."""

    name = "pauses"
    @property
    def interval_s(self) -> float:
        return INTERVAL_S

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, *,
                 queues: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.store = store
        self.dispatcher = dispatcher
        self.queue_label = queues or LabelGuard()
        self._marked: set[str] = set()

    def idle(self) -> None:
        self.clear()

    def run_once(self) -> PauseResult:
        paused = self.store.paused_queues()
        # Queues Redis knows, those paused, and those marked last pass (a queue resumed while
        # holding no job is in neither of the first two).
        candidates = sorted(q for q in self.dispatcher.known_queues() | set(paused)
                            | self._marked if valid_queue_name(q))
        marked = self.dispatcher.paused_markers(candidates)
        missing = sorted(set(paused) - marked)
        stale = sorted(marked - set(paused))
        for queue in missing:
            self.dispatcher.mark_paused(queue, True)
        for queue in stale:
            self.dispatcher.mark_paused(queue, False)
        if missing or stale:
            log.info("pause markers repaired", extra={"action": "pause_markers",
                                                      "written": missing, "removed": stale})
        self._export(paused)
        self._marked = set(paused)
        return PauseResult(len(paused), len(missing), len(stale))

    def _export(self, paused: dict[str, dict]) -> None:
        QUEUE_PAUSED.clear()
        QUEUE_PAUSED_SINCE.clear()
        for queue, row in paused.items():
            label = self.queue_label(queue)
            QUEUE_PAUSED.labels(queue=label).set(1)
            QUEUE_PAUSED_SINCE.labels(queue=label).set(row["paused_at"].timestamp())

    def clear(self) -> None:
        QUEUE_PAUSED.clear()
        QUEUE_PAUSED_SINCE.clear()
