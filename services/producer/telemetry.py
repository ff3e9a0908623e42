"""Request metrics and the /metrics exposition of the API.

Invariant: every label value is bounded. Routes are labelled by their template
(`/api/v1/jobs/<uuid:job_id>`, or `unmatched`), methods by a fixed set, status codes by what
HTTP allows, job types by the registered handler types (anything else is "other", as the worker
labels them) and queues through LabelGuard, so a client inventing paths, methods, job types or
queues cannot create unbounded series.
Under gunicorn, every process writes to PROMETHEUS_MULTIPROC_DIR and /metrics merges them.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.metrics_core import Metric

from taskline.handlers import registry
from taskline.jobs import Job
from taskline.metrics import (
    HTTP_LATENCY,
    HTTP_REQUESTS,
    JOB_CANCELLED,
    JOB_ENQUEUED,
    LabelGuard,
    TypeLabels,
    multiprocess_dir,
)

log = logging.getLogger(__name__)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Only the API writes single enqueues in groups (taskline_producer.grouping), so only the API
# creates this series.
ENQUEUE_GROUP_SIZE = Histogram(
    "taskline_enqueue_group_size", "Single enqueues written by one statement (group commit)",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16))


def type_labels(modules: Sequence[str]) -> TypeLabels:
    """Job types usable as labels: the types the handler modules register.

    The API never runs a handler; a module that fails to import here must not stop it from
    accepting jobs, so it costs only precise labels ("other" instead).
    """
    try:
        return TypeLabels(registry.load(modules))
    except Exception:
        log.exception("could not import the handler modules; job metrics label types 'other'",
                      extra={"action": "startup"})
        return TypeLabels(registry.load(()))


class JobMetrics:
    """Counts accepted and cancelled jobs; each label kept to a bounded set per process."""

    def __init__(self, types: Callable[[str], str] | None = None) -> None:
        self._types = types or TypeLabels(registry.registered_types())
        self._queues = LabelGuard()

    def accepted(self, job_type: str, queue: str, count: int = 1) -> None:
        JOB_ENQUEUED.labels(type=self._types(job_type), queue=self._queues(queue)).inc(count)

    def grouped(self, size: int) -> None:
        ENQUEUE_GROUP_SIZE.observe(size)

    def cancelled(self, queue: str) -> None:
        JOB_CANCELLED.labels(queue=self._queues(queue)).inc()


def job_log_extra(action: str, job: Job) -> dict[str, Any]:
    """The fields of a job-path log record, named as the worker and maintenance name them."""
    return {"action": action, "job_id": str(job.id), "queue": job.queue, "type": job.type,
            "attempt": job.attempts}


def _start_timer() -> None:
    g.taskline_started = time.perf_counter()


def _record(response: Response) -> Response:
    route = request.url_rule.rule if request.url_rule is not None else "unmatched"
    method = request.method if request.method in _METHODS else "other"
    status = str(response.status_code)
    HTTP_REQUESTS.labels(route=route, method=method, status=status).inc()
    started = g.get("taskline_started")
    if started is not None:
        HTTP_LATENCY.labels(route=route, method=method, status=status).observe(
            time.perf_counter() - started)
    return response


def init_app(app: Flask) -> None:
    """Time every request; registered first, so requests refused by auth are counted too."""
    app.before_request(_start_timer)
    app.after_request(_record)


class SettledFiles(prometheus_multiprocess.MultiProcessCollector):
    """prometheus-client's merge of every process's samples, minus files still being created.

    A process creates its `.db` file before sizing it, and prometheus-client fails the whole
    scrape on a file found at 0 bytes (client_python issue 1199); a process killed in that
    window would fail every later scrape. Such a file holds no sample yet: it is skipped.
    """

    def __init__(self, registry: CollectorRegistry, path: str) -> None:
        super().__init__(registry, path)
        self._folder = path

    def collect(self) -> Iterable[Metric]:
        files = [f for f in glob.glob(os.path.join(self._folder, "*.db")) if _sized(f)]
        return self.merge(files, accumulate=True)


def _sized(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except FileNotFoundError:  # a live gauge of a process that just exited
        return False


def exposition() -> Response:
    """The Prometheus text format of this process, or of every gunicorn process when shared."""
    folder = multiprocess_dir()
    if folder:
        registry = CollectorRegistry()
        SettledFiles(registry, folder)
    else:
        registry = REGISTRY
    return Response(generate_latest(registry), mimetype=None,
                    headers={"Content-Type": CONTENT_TYPE_LATEST})
