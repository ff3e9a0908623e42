"""The API's /metrics exposition: this process's samples, or every gunicorn process's.

Invariant: under gunicorn every process writes to PROMETHEUS_MULTIPROC_DIR and a scrape merges
every file that holds samples, so one scrape sees the whole API whichever process answers it.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from flask import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.metrics_core import Metric

from taskline.metrics import multiprocess_dir


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
