"""Queue pause and resume: POST /api/v1/queues/{name}/pause and /resume.

Invariant: PostgreSQL holds the pause (table queue_pauses) and decides: no claim takes a job of
a paused queue, whichever path fetched it. The queue's Redis pause marker only spares workers
fetching ids they could not claim; it is written after the commit, and a marker lost or left
behind is put right by maintenance within a second. A paused queue still accepts jobs; its
running jobs finish. Pausing a paused queue, or resuming one that is not, changes nothing and
answers 200 with the state (the use case: taskline_producer.operations.pausing).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from taskline_producer.operations import pausing
from taskline_producer.schemas import paging
from taskline_producer.schemas.errors import InvalidParameter
from taskline_producer.schemas.shapes import pause_state

bp = Blueprint("pauses", __name__, url_prefix="/api/v1")


@bp.post("/queues/<name>/pause")
def pause_queue(name: str) -> Response:
    _check(name)
    return jsonify(_shape(name, pausing.pause(name)))


@bp.post("/queues/<name>/resume")
def resume_queue(name: str) -> Response:
    _check(name)
    pausing.resume(name)
    return jsonify(_shape(name, None))


def _check(name: str) -> None:
    if not paging.valid_queue_name(name):
        raise InvalidParameter("queue must be 1..64 characters of A-Z a-z 0-9 _ . : -",
                               {"parameter": "name"})


def _shape(name: str, row: dict[str, Any] | None) -> dict[str, Any]:
    return {"name": name, **pause_state(row)}
