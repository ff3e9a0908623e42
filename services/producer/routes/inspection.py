"""The operations blueprint: the dead-letter queue, the worker registry and queue depths.

Invariant: read-only (pausing a queue is taskline_producer.routes.pauses). Counts come from
PostgreSQL (the truth); Redis depths are reported beside them for the queues either side knows,
so an operator sees drift between the two at a glance, and are null (with the dispatch mode
`postgres`) while Redis is unreachable.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from taskline.errors import DispatchUnavailable
from taskline_producer.operations.backends import backends
from taskline_producer.operations.dispatch_state import dispatch_state, unreachable
from taskline_producer.schemas import paging, shapes

bp = Blueprint("operations", __name__, url_prefix="/api/v1")

QUEUE_PAGE = 100
"""Queues in one answer of GET /api/v1/queues unless `limit` says otherwise."""


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


GROUPS_DEFAULT, GROUPS_MAX = 50, 500


@bp.get("/dlq/groups")
def dead_groups() -> Response:
    """Dead jobs grouped by the cause of their final error (taskline.fingerprint), most
    jobs first; a group's fingerprint selects its jobs in POST /dlq/retry and /dlq/purge."""
    args = request.args
    queue = paging.queue(args)
    size = paging.limit(args, default=GROUPS_DEFAULT, most=GROUPS_MAX)
    rows = backends().store.dlq_groups(queue=queue, limit=size)
    return jsonify({"groups": [shapes.dead_group(row) for row in rows]})


@bp.get("/workers")
def list_workers() -> Response:
    b = backends()
    rows = b.store.list_workers(within_s=3 * b.settings.heartbeat_s)
    return jsonify({"workers": [shapes.worker(row) for row in rows]})


@bp.get("/queues")
def list_queues() -> Response:
    """One page of queues by name (`limit` 1..500, default QUEUE_PAGE; `cursor`), with the
    totals over every queue. Counts from PostgreSQL always; Redis depths (asked for the
    page's queues only) and the dispatch mode beside them, which say `postgres` rather than
    fail while Redis is unreachable."""
    b = backends()
    size = paging.limit(request.args, QUEUE_PAGE)
    after = paging.decode_name_cursor(request.args.get("cursor"), paging.valid_queue_name)
    counts = list(b.store.queue_counts())
    paused = b.store.paused_queues()
    dispatch = dispatch_state(b.store, b.dispatcher)
    known: set[str] = set()
    if dispatch["redis"] == "ok":
        try:
            known = b.dispatcher.known_queues()
        except DispatchUnavailable:
            dispatch = unreachable()
    names = sorted(n for n in known | {row.queue for row in counts} | set(paused)
                   if paging.valid_queue_name(n) and (after is None or n > after))
    page = names[:size]
    depths = _depths(b.dispatcher, page) if dispatch["redis"] == "ok" else None
    if depths is None and dispatch["redis"] == "ok":
        dispatch = unreachable()
    shown = set(page)
    return jsonify({"queues": shapes.queues([r for r in counts if r.queue in shown], depths,
                                            {n: p for n, p in paused.items() if n in shown},
                                            names=page),
                    "totals": shapes.queue_totals(counts),
                    "next_cursor": paging.encode_name_cursor(page[-1])
                    if len(names) > size else None,
                    "dispatch": dispatch})


def _depths(dispatcher: Any, names: list[str]) -> dict[str, Any] | None:
    """Redis depths of the queues `names`; None when Redis stops answering."""
    try:
        return dispatcher.depths_of(names)
    except DispatchUnavailable:
        return None
