"""Telling workers that jobs became queued, through Redis or, when Redis is out, PostgreSQL.

Invariant: a committed transition that makes a job queued reaches the workers either by its
Redis step (the id pushed to a ready list) or, when that step fails because Redis is
unreachable, by a notification on the PostgreSQL channel `taskline_enqueued` (payload: the
queue's name; sent by taskline.mirror, which every service commits through), which wakes the
workers dispatching from PostgreSQL. Nothing is notified while Redis answers, so the Redis path
pays nothing for it; a lost notification costs at most the workers' backstop poll, never a job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from taskline.enqueuing import CHANNEL
from taskline.errors import StoreUnavailable
from taskline.jobs import Status
from taskline.store.views import ReadyNotifier
from taskline.transitions import Committed

log = logging.getLogger(__name__)

# The one channel that says "jobs of this queue became queued" (`notify_ready` in
# store/sql/attempts.sql and the in-transaction enqueue's insert name it too).
__all__ = ["CHANNEL", "notify"]


def notify(store: ReadyNotifier, changes: Iterable[Committed]) -> None:
    """Notify the queues of the changes that made a job queued (best effort)."""
    queues = sorted({c.queue for c in changes if c.move.target is Status.QUEUED})
    if not queues:
        return
    try:
        store.notify_ready(queues)
    except StoreUnavailable as err:
        log.warning("could not notify workers of queued jobs; they find them by polling",
                    extra={"action": "notify_ready", "queues": queues, "error": str(err)})
