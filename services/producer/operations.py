"""The operations blueprint: the dead-letter queue, the worker registry and queue depths.

Invariant: read-only (pausing a queue is taskline_producer.pauses). Counts come from
PostgreSQL (the truth); Redis depths are reported beside them for the queues either side knows,
so an operator sees drift between the two at a glance, and are null (with the dispatch mode
`postgres`) while Redis is unreachable.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from taskline.dispatch.keys import valid_queue_name
from taskline.errors import DispatchUnavailable
from taskline_producer import paging, shapes
from taskline_producer.backends import backends
from taskline_producer.dispatch_state import dispatch_state, unreachable

bp = Blueprint("operations", __name__, url_prefix="/api/v1")


@bp.get("/dlq")
def list_dead() -> Response:
    args = request.args
    queue, size = paging.queue(args), paging.limit(args)
    after = paging.decode_cursor(args.get("cursor"))
    rows = backends().store.list_dead(queue=queue, after=after, limit=size + 1)
    page = rows[:size]
    cursor = None
    if len(rows) > size:
        cursor = paging.encode_cursor(page[-1]["failed_at"], page[-1]["job"].id)
    return jsonify({"jobs": [shapes.dead(row) for row in page], "next_cursor": cursor})


@bp.get("/workers")
def list_workers() -> Response:
    b = backends()
    rows = b.store.list_workers(within_s=3 * b.settings.heartbeat_s)
    return jsonify({"workers": [shapes.worker(row) for row in rows]})


@bp.get("/queues")
def list_queues() -> Response:
    """Counts from PostgreSQL always; Redis depths and the dispatch mode beside them, which
    say `postgres` rather than fail while Redis is unreachable."""
    b = backends()
    counts = list(b.store.queue_counts())
    paused = b.store.paused_queues()
    dispatch = dispatch_state(b.store, b.dispatcher)
    depths = None
    if dispatch["redis"] == "ok":
        try:
            names = b.dispatcher.known_queues() | {row.queue for row in counts} | set(paused)
            depths = {name: b.dispatcher.depths(name) for name in sorted(names)
                      if valid_queue_name(name)}
        except DispatchUnavailable:
            dispatch = unreachable()
    return jsonify({"queues": shapes.queues(counts, depths, paused), "dispatch": dispatch})
