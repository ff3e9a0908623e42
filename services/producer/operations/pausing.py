"""Pausing and resuming a queue: the decision in PostgreSQL with its audit record, then its
marker in Redis.

Invariant: PostgreSQL decides (the claim rule reads the pause row); the Redis marker only
spares idle workers a fetch, so a marker Redis did not take is written by maintenance once Redis
answers, and the pause stands either way.
"""

from __future__ import annotations

import logging
from typing import Any

from taskline.errors import DispatchUnavailable
from taskline_producer.http.auth import principal
from taskline_producer.operations import auditing
from taskline_producer.operations.backends import backends

log = logging.getLogger(__name__)


def pause(name: str) -> dict[str, Any] | None:
    """Pause queue `name` (again: unchanged); its pause row as it stands."""
    b = backends()
    with b.store.transaction() as conn:
        row = b.store.pause_queue(name, principal().name, conn)
        if row is not None:
            auditing.record_in(conn, "queue.pause", name)
    if row is not None:
        log.info("queue paused", extra={"action": "queue_paused", "queue": name})
    _mark(name, paused=True)
    return row or b.store.paused_queues().get(name)


def resume(name: str) -> None:
    """Resume queue `name` (not paused: unchanged)."""
    b = backends()
    with b.store.transaction() as conn:
        row = b.store.resume_queue(name, conn)
        if row is not None:
            auditing.record_in(conn, "queue.resume", name)
    if row is not None:
        log.info("queue resumed", extra={"action": "queue_resumed", "queue": name})
    _mark(name, paused=False)


def _mark(name: str, *, paused: bool) -> None:
    """Copy the decision to Redis; when Redis is down, maintenance copies it once it is back."""
    try:
        backends().dispatcher.mark_paused(name, paused)
    except DispatchUnavailable as err:
        log.warning("queue pause marker not written; maintenance writes it when Redis answers",
                    extra={"action": "pause_marker", "queue": name, "error": str(err)})
