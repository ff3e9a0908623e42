"""Job metrics of the API: jobs accepted (and those with tags) and cancelled, and the size of
grouped enqueues.

Invariant: every label value is bounded. Job types are labelled by the registered handler types
(anything else is "other", as the worker labels them) and queues through LabelGuard, so a
client inventing job types or queues cannot create unbounded series.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from prometheus_client import Histogram

from taskline.handlers import registry
from taskline.metrics import (
    ENQUEUE_FOLDED,
    JOB_CANCELLED,
    JOB_ENQUEUED,
    JOB_TAGGED,
    LabelGuard,
    TypeLabels,
)

log = logging.getLogger(__name__)

# Only the API writes single enqueues in groups (taskline_producer.operations.grouping), so only the
# API creates this series.
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

    def tagged(self, queue: str, count: int = 1) -> None:
        """Jobs accepted with tags (per queue only: tags are unbounded, see JOB_TAGGED)."""
        JOB_TAGGED.labels(queue=self._queues(queue)).inc(count)

    def folded(self, job_type: str, queue: str, outcome: str) -> None:
        """An enqueue folded into an existing job: duplicate, replaced or joined."""
        ENQUEUE_FOLDED.labels(type=self._types(job_type), queue=self._queues(queue),
                              outcome=outcome).inc()

    def grouped(self, size: int) -> None:
        ENQUEUE_GROUP_SIZE.observe(size)

    def cancelled(self, queue: str) -> None:
        JOB_CANCELLED.labels(queue=self._queues(queue)).inc()
