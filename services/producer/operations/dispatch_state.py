"""The dispatch mode as the API sees it, for `GET /api/v1/queues` and the dashboard.

Invariant: read-only, and never a 503 for Redis: when Redis does not answer, the mode is
`postgres` (workers claim straight from PostgreSQL), not an error. When it answers, the rebuild
marker tells whether its ready lists are vouched for: the active maintenance instance renews
it every quarter second while Redis keeps its content, so a marker older than `FRESH_S` (or
none) reads `rebuilding`: Redis came back empty or from an old snapshot and is being rebuilt,
or no maintenance instance runs.
"""

from __future__ import annotations

from typing import Any

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import dispatch_marker_ms
from taskline.errors import DispatchUnavailable
from taskline.store.views import ApiStore

FRESH_S = 5.0
"""A rebuild marker at most this old, seconds, vouches for Redis."""


def dispatch_state(store: ApiStore, dispatcher: Dispatcher) -> dict[str, Any]:
    """`{"mode", "redis", "rebuilt_age_s"}` (openapi.json `DispatchState`)."""
    try:
        marker = dispatcher.dispatch_marker()
    except DispatchUnavailable:
        return unreachable()
    at_ms = dispatch_marker_ms(marker)
    if at_ms < 0:
        return {"mode": "rebuilding", "redis": "ok", "rebuilt_age_s": None}
    age_s = max(store.now().timestamp() - at_ms / 1000, 0.0)
    return {"mode": "redis" if age_s <= FRESH_S else "rebuilding", "redis": "ok",
            "rebuilt_age_s": round(age_s, 3)}


def unreachable() -> dict[str, Any]:
    return {"mode": "postgres", "redis": "unreachable", "rebuilt_age_s": None}
