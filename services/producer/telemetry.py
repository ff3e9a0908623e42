"""Request metrics and the /metrics exposition of the API.

Invariant: every label value is bounded. Routes are labelled by their template
(`/api/v1/jobs/<uuid:job_id>`, or `unmatched`), methods by a fixed set, job types and queues through
LabelGuard, so a client inventing paths, methods or job types cannot create unbounded series.
Under gunicorn, every process writes to PROMETHEUS_MULTIPROC_DIR and /metrics merges them.
"""

from __future__ import annotations

import time

from flask import Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess

from taskline.metrics import (
    HTTP_LATENCY,
    HTTP_REQUESTS,
    JOB_CANCELLED,
    JOB_ENQUEUED,
    LabelGuard,
    multiprocess_dir,
)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class JobMetrics:
    """Counts accepted and cancelled jobs; each label kept to a bounded set per process."""

    def __init__(self) -> None:
        self._types = LabelGuard()
        self._queues = LabelGuard()

    def accepted(self, job_type: str, queue: str) -> None:
        JOB_ENQUEUED.labels(type=self._types(job_type), queue=self._queues(queue)).inc()

    def cancelled(self, queue: str) -> None:
        JOB_CANCELLED.labels(queue=self._queues(queue)).inc()


def _start_timer() -> None:
    g.taskline_started = time.perf_counter()


def _record(response: Response) -> Response:
    route = request.url_rule.rule if request.url_rule is not None else "unmatched"
    method = request.method if request.method in _METHODS else "other"
    HTTP_REQUESTS.labels(route=route, method=method, status=str(response.status_code)).inc()
    started = g.get("taskline_started")
    if started is not None:
        HTTP_LATENCY.labels(route=route, method=method).observe(time.perf_counter() - started)
    return response


def init_app(app: Flask) -> None:
    """Time every request; registered first, so requests refused by auth are counted too."""
    app.before_request(_start_timer)
    app.after_request(_record)


def exposition() -> Response:
    """The Prometheus text format of this process, or of every gunicorn process when shared."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    return Response(generate_latest(registry), mimetype=None,
                    headers={"Content-Type": CONTENT_TYPE_LATEST})
