"""Request metrics of the API: a count and a latency per route, method and status.

Invariant: every label value is bounded. Routes are labelled by their template
(`/api/v1/jobs/<uuid:job_id>`, or `unmatched`), methods by a fixed set and status codes by
what HTTP allows, so a client inventing paths or methods cannot create unbounded series.
"""

from __future__ import annotations

import time

from flask import Flask, Response, g, request

from taskline.metrics import HTTP_LATENCY, HTTP_REQUESTS

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _start_timer() -> None:
    g.taskline_started = time.perf_counter()


def started() -> float:
    """time.perf_counter() at the current request's start."""
    return float(g.get("taskline_started") or time.perf_counter())


def _record(response: Response) -> Response:
    route = request.url_rule.rule if request.url_rule is not None else "unmatched"
    method = request.method if request.method in _METHODS else "other"
    record(route, method, response.status_code, g.get("taskline_started"))
    return response


def record(route: str, method: str, status: int, started_at: float | None) -> None:
    """Count one answer of `route` (a template), and its latency since `started_at`."""
    HTTP_REQUESTS.labels(route=route, method=method, status=str(status)).inc()
    if started_at is not None:
        HTTP_LATENCY.labels(route=route, method=method, status=str(status)).observe(
            time.perf_counter() - started_at)


def init_app(app: Flask) -> None:
    """Time every request; registered first, so requests refused by auth are counted too."""
    app.before_request(_start_timer)
    app.after_request(_record)
