"""The operations blueprint: the dead-letter queue, the worker registry and queue depths.

Invariant: read-only (pausing a queue is taskline_producer.routes.pauses). Counts come from
PostgreSQL (the truth); Redis depths are reported beside them for the queues either side knows,
so an operator sees drift between the two at a glance, and are null (with the dispatch mode
`postgres`) while Redis is unreachable.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from taskline_producer.operations import reads
from taskline_producer.schemas import paging, shapes

bp = Blueprint("operations", __name__, url_prefix="/api/v1")

QUEUE_PAGE = 100
"""Queues in one answer of GET /api/v1/queues unless `limit` says otherwise."""


@bp.get("/dlq")
def list_dead() -> Response:
    args = request.args
    queue, size = paging.queue(args), paging.limit(args)
    after = paging.decode_cursor(args.get("cursor"))
    rows = reads.dead_page(queue, after, size + 1)
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
    rows = reads.dead_groups(queue, size)
    return jsonify({"groups": [shapes.dead_group(row) for row in rows]})


@bp.get("/workers")
def list_workers() -> Response:
    rows = reads.live_workers()
    return jsonify({"workers": [shapes.worker(row) for row in rows]})


@bp.get("/queues")
def list_queues() -> Response:
    """One page of queues by name (`limit` 1..500, default QUEUE_PAGE; `cursor`), with the
    totals over every queue. Counts from PostgreSQL always; Redis depths (asked for the
    page's queues only) and the dispatch mode beside them, which say `postgres` rather than
    fail while Redis is unreachable."""
    size = paging.limit(request.args, QUEUE_PAGE)
    after = paging.decode_name_cursor(request.args.get("cursor"), paging.valid_queue_name)
    page = reads.queues_page(after, size, paging.valid_queue_name)
    shown = set(page.names)
    return jsonify({"queues": shapes.queues([r for r in page.counts if r.queue in shown],
                                            page.depths,
                                            {n: p for n, p in page.paused.items() if n in shown},
                                            names=page.names),
                    "totals": shapes.queue_totals(page.counts),
                    "next_cursor": paging.encode_name_cursor(page.names[-1])
                    if page.more else None,
                    "dispatch": page.dispatch})
