"""Queue pause and resume: POST /api/v1/queues/{name}/pause and /resume.

Invariant: PostgreSQL holds the pause (table queue_pauses) and decides: no claim takes a job of
a paused queue, whichever path fetched it. The queue's Redis pause marker only spares workers
fetching ids they could not claim; it is written after the commit, and a marker lost or left
behind is put right by maintenance within a second. A paused queue still accepts jobs; its
running jobs finish. Pausing a paused queue, or resuming one that is not, changes nothing and
answers 200 with the state.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response, jsonify

from taskline.errors import DispatchUnavailable
from taskline_producer.http.auth import principal
from taskline_producer.operations import auditing
from taskline_producer.operations.backends import backends
from taskline_producer.schemas import paging
from taskline_producer.schemas.errors import InvalidParameter
from taskline_producer.schemas.shapes import pause_state

log = logging.getLogger(__name__)

bp = Blueprint("pauses", __name__, url_prefix="/api/v1")


@bp.post("/queues/<name>/pause")
def pause_queue(name: str) -> Response:
    _check(name)
    b = backends()
    with b.store.transaction() as conn:
        row = b.store.pause_queue(name, principal().name, conn)
        if row is not None:
            auditing.record_in(conn, "queue.pause", name)
    if row is not None:
        log.info("queue paused", extra={"action": "queue_paused", "queue": name})
    _mark(name, paused=True)
    current = row or b.store.paused_queues().get(name)
    return jsonify(_shape(name, current))


@bp.post("/queues/<name>/resume")
def resume_queue(name: str) -> Response:
    _check(name)
    b = backends()
    with b.store.transaction() as conn:
        row = b.store.resume_queue(name, conn)
        if row is not None:
            auditing.record_in(conn, "queue.resume", name)
    if row is not None:
        log.info("queue resumed", extra={"action": "queue_resumed", "queue": name})
    _mark(name, paused=False)
    return jsonify(_shape(name, None))


def _check(name: str) -> None:
    if not paging.valid_queue_name(name):
        raise InvalidParameter("queue must be 1..64 characters of A-Z a-z 0-9 _ . : -",
                               {"parameter": "name"})


def _mark(name: str, *, paused: bool) -> None:
    """Copy the decision to Redis; when Redis is down, maintenance copies it once it is back."""
    try:
        backends().dispatcher.mark_paused(name, paused)
    except DispatchUnavailable as err:
        log.warning("queue pause marker not written; maintenance writes it when Redis answers",
                    extra={"action": "pause_marker", "queue": name, "error": str(err)})


def _shape(name: str, row: dict[str, Any] | None) -> dict[str, Any]:
    return {"name": name, **pause_state(row)}
