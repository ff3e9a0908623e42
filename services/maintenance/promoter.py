"""The promoter: makes due retries and delayed first runs dispatchable.

Invariant: PostgreSQL decides what is due, in its own clock (`Store.promote_due`: scheduled or
retrying jobs with `next_run_at <= now()`, FOR UPDATE SKIP LOCKED, moved to queued with a
`promoted` event); only after that commit are the ids pushed to their ready lists
(`Dispatcher.promote`, which also drops them from the retry and scheduled sets). The retry and
scheduled sets in Redis are a mirror for depth reporting, never the source of what is due, so
a lost or stale set entry can delay nothing.

While Redis is unreachable the pass goes on: the promoted jobs are queued in PostgreSQL, the
workers claiming from there are notified (taskline.readiness), and the rebuild after Redis
returns pushes them.

If this process dies between the commit and the push, those jobs are queued in PostgreSQL but
absent from every ready list (their ids may still sit in a retry or scheduled set). The
reconciler restores them: it checks queued jobs against the ready and processing lists only,
pushes what is missing and drops the stale set entries.

Interval: `min(1.0, TASKLINE_REAPER_INTERVAL_S)` seconds, so a due job waits at most about a
second for promotion with the default settings, and less when tests shorten the reaper.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from taskline.dispatch.dispatcher import Dispatcher
from taskline.metrics import PROMOTED, LabelGuard
from taskline.mirror import Mirror
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.rows import Promoted
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

PAGE_SIZE = 1000
"""Jobs promoted per transaction; the promoter pages until nothing is due."""
MAX_INTERVAL_S = 1.0
"""Longest pause between promotion passes, seconds."""


def promote_interval(settings: Settings) -> float:
    return min(MAX_INTERVAL_S, settings.reaper_interval_s)


@dataclass(frozen=True)
class PromoteResult:
    """Counts of one promoter pass."""

    promoted: int = 0

    @property
    def changed(self) -> bool:
        return self.promoted > 0


class Promoter(Periodic):
    """Moves due jobs to queued in PostgreSQL, then pushes their ids to the ready lists."""

    name = "promoter"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, settings: Settings, *,
                 page_size: int = PAGE_SIZE, queues: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.store = store
        self.dispatcher = dispatcher
        self.mirror = Mirror.of(dispatcher, store)
        self.settings = settings
        self.page_size = page_size
        self.queue_label = queues or LabelGuard()

    @property
    def interval_s(self) -> float:
        return promote_interval(self.settings)

    def run_once(self) -> PromoteResult:
        promoted = 0
        while True:
            rows = self.store.promote_due(self.page_size)
            promoted += self._push(rows)
            if len(rows) < self.page_size:
                break
        if not promoted:
            log.debug("promoter pass: nothing due", extra={"action": "promote"})
        return PromoteResult(promoted)

    def _push(self, rows: list[Promoted]) -> int:
        # Committed: when Redis is unreachable, workers claiming from PostgreSQL are notified
        # and the rebuild after Redis returns pushes the ids. Later pages are promoted the same.
        self.mirror.follow([row.committed() for row in rows], action="promote")
        for queue, count in Counter(row.queue for row in rows).items():
            PROMOTED.labels(queue=self.queue_label(queue)).inc(count)
        for row in rows:
            log.info("job promoted", extra={"action": "promoted", "job_id": str(row.id),
                                            "queue": row.queue, "priority": row.priority})
        return len(rows)
