"""The PostgreSQL store, Redis dispatcher and enqueuer one API process uses.

Invariant: connections are never shared across fork. What this holder creates it creates
lazily, in the process that first needs it, and again in any process forked after that (the pid
is checked), so every gunicorn worker has its own pool. A store or dispatcher passed in (tests)
is used as it is and never closed here.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from flask import current_app

from taskline.access import parse_quotas
from taskline.dispatch.dispatcher import Dispatcher
from taskline.mirror import Mirror
from taskline.quota import EnqueueQuotas
from taskline.settings import Settings
from taskline.store.store import Store
from taskline.store.views import ApiStore
from taskline_producer.operations.declared import DeclaredTypes
from taskline_producer.operations.enqueuer import Enqueuer
from taskline_producer.operations.job_metrics import JobMetrics, type_labels

# gthread runs 16 threads per process, at most 8 of them in event streams (which use the pool
# only to replay). The pool has no overflow: an overflow connection is closed when it is
# returned to a full pool, so more concurrent requests than the pool's size (each a keep-alive
# client) opened and closed a PostgreSQL connection every few requests, each a backend start.
# Ten kept connections are the cap that 5 plus 5 overflow gave, without that churn.
POOL_SIZE = 10


@dataclass(frozen=True)
class _Live:
    pid: int
    store: ApiStore
    dispatcher: Dispatcher
    enqueuer: Enqueuer
    quotas: EnqueueQuotas | None
    declared: DeclaredTypes


class Backends:
    """Per-process Store, Dispatcher and Enqueuer built from one Settings."""

    def __init__(self, settings: Settings, store: ApiStore | None = None,
                 dispatcher: Dispatcher | None = None) -> None:
        self.settings = settings
        self._given_store = store
        self._given_dispatcher = dispatcher
        self._lock = threading.Lock()
        self._live: _Live | None = None
        self.metrics = JobMetrics(type_labels(settings.handlers))

    def _current(self) -> _Live:
        live = self._live
        if live is not None and live.pid == os.getpid():
            return live
        with self._lock:
            if self._live is None or self._live.pid != os.getpid():
                # A forked child drops its parent's objects without closing their sockets.
                store = self._given_store or Store.connect(
                    self.settings.database_url, pool_size=POOL_SIZE, max_overflow=0,
                    schema=self.settings.schema, application_name="taskline-api",
                    transaction_pooled=self.settings.transaction_pooled)
                store.max_queues = self.settings.max_queues
                # The breaker skips pushes while Redis is known down: an enqueue then costs
                # no connect or socket timeout (the job is durable; workers are notified).
                dispatcher = self._given_dispatcher or Dispatcher(
                    self.settings.redis_url, breaker=True,
                    partitions=self.settings.queue_partitions)
                quotas = parse_quotas(self.settings.enqueue_quotas)
                self._live = _Live(os.getpid(), store, dispatcher,
                                   Enqueuer(store, dispatcher, self.metrics,
                                            self.settings.max_payload_bytes),
                                   EnqueueQuotas(self.settings.redis_url, quotas)
                                   if quotas else None,
                                   DeclaredTypes(store, self.settings))
            return self._live

    @property
    def store(self) -> ApiStore:
        return self._current().store

    @property
    def dispatcher(self) -> Dispatcher:
        return self._current().dispatcher

    @property
    def mirror(self) -> Mirror:
        """The process's Redis step after each commit (taskline.mirror)."""
        live = self._current()
        return Mirror.of(live.dispatcher, live.store)

    @property
    def enqueuer(self) -> Enqueuer:
        return self._current().enqueuer

    @property
    def declared(self) -> DeclaredTypes:
        """The job types workers declared, as this process last read them."""
        return self._current().declared

    @property
    def quotas(self) -> EnqueueQuotas | None:
        """Per-client enqueue quotas; None when none is configured."""
        return self._current().quotas

    def close(self) -> None:
        """Release what this process created (pools and Redis connections)."""
        with self._lock:
            live, self._live = self._live, None
        if live is None or live.pid != os.getpid():
            return
        if live.quotas is not None:
            live.quotas.close()
        if self._given_store is None:
            live.store.dispose()
        if self._given_dispatcher is None:
            live.dispatcher.close()


def backends() -> Backends:
    """The Backends of the app serving the current request."""
    return current_app.extensions["taskline"]
