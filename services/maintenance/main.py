"""Entry point of `taskline maintenance`: the leader and every component, each in a thread.

Invariant: components act only while this instance holds the maintenance lease, and the lease
is released only after every component has stopped (or the stop deadline passed), so on a
clean shutdown a standby takes over within one renewal period and the two never overlap.
SIGTERM or SIGINT stops the process within about `STOP_TIMEOUT_S` seconds with exit status 0.
Started while PostgreSQL is unreachable, the instance waits for it before any component runs
(taskline.startup), answering 503 on `/readyz` of its metrics port; a signal ends that wait at
once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from taskline import doctor, metrics, startup
from taskline.dispatch.dispatcher import Dispatcher
from taskline.handlers import registry
from taskline.metrics import LOOP_ERRORS, LabelGuard, TypeLabels
from taskline.settings import Settings
from taskline.startup import Readiness
from taskline.store.store import Store
from taskline.store.views import MaintenanceStore
from taskline_maintenance.audit_retention import AuditRetention
from taskline_maintenance.auditor import Auditor
from taskline_maintenance.depths import DepthGauges
from taskline_maintenance.lapser import Lapser
from taskline_maintenance.leader import Leader, leader_ttl
from taskline_maintenance.limits import LimitGauges
from taskline_maintenance.ordering import OrderingGauges
from taskline_maintenance.outbox import OutboxRelay
from taskline_maintenance.pauses import PauseMarkers
from taskline_maintenance.promoter import Promoter
from taskline_maintenance.reaper import Reaper
from taskline_maintenance.rebuilder import Rebuilder
from taskline_maintenance.reconciler import Reconciler
from taskline_maintenance.retention import Retention
from taskline_maintenance.scheduler import Scheduler

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 2.0
"""How long shutdown waits for components to finish their current pass, seconds."""


class Maintenance:
    """One maintenance instance: a leader loop and the component loops it gates."""

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, settings: Settings, *,
                 holder: str | None = None, types: Callable[[str], str] | None = None) -> None:
        queues = LabelGuard()
        self.leader = Leader(store, leader_ttl(settings), holder)
        self.reaper = Reaper(store, dispatcher, settings, types=types, queues=queues)
        self.promoter = Promoter(store, dispatcher, settings, queues=queues)
        self.lapser = Lapser(store, dispatcher, queues=queues)
        self.reconciler = Reconciler(store, dispatcher, settings, queues=queues)
        self.rebuilder = Rebuilder(store, dispatcher, self.reconciler)
        self.depths = DepthGauges(store, dispatcher, settings, queues=queues)
        self.pauses = PauseMarkers(store, dispatcher, queues=queues)
        self.limits = LimitGauges(store, settings)
        self.ordering = OrderingGauges(store, settings, queues=queues)
        self.audit_retention = AuditRetention(store, settings)
        self.auditor = Auditor(store, settings)
        # Checks leadership between its batches too: a pass can be long after an outage.
        self.retention = Retention(store, dispatcher, settings, active=self.leader.holds)
        # The @periodic declarations of the handler modules loaded so far (type_labels).
        self.scheduler = Scheduler(store, dispatcher, settings,
                                   declarations=registry.periodic_declarations())
        # LISTEN needs a session: none behind a transaction pooler without a direct URL.
        self.outbox = OutboxRelay(store, dispatcher, settings.session_url, queues=queues)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._spawn("leader", lambda: self.leader.run(self._stop))
        for name, component in (("reaper", self.reaper), ("promoter", self.promoter),
                                ("lapser", self.lapser),
                                ("reconciler", self.reconciler), ("rebuilder", self.rebuilder),
                                ("depths", self.depths), ("pauses", self.pauses),
                                ("limits", self.limits), ("ordering", self.ordering),
                                ("audit_retention", self.audit_retention),
                                ("audit", self.auditor),
                                ("retention", self.retention),
                                ("scheduler", self.scheduler), ("outbox", self.outbox)):
            self._spawn(name, lambda c=component: c.run(self._stop, self.leader.holds))

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        # Exported as 0 from the start: "no errors" reads as 0 on a dashboard, not "no data".
        LOOP_ERRORS.labels(loop=name)
        thread = threading.Thread(target=target, name=f"maintenance-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every loop, wait for passes in flight (up to the deadline), then release."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            log.warning("stopping with passes still in flight: %s", stuck,
                        extra={"action": "shutdown"})
        self.leader.release()
        self.depths.clear()
        self.pauses.clear()
        self.limits.clear()
        self.ordering.clear()


def type_labels(settings: Settings) -> TypeLabels:
    """Job types usable as metric labels: the registered handlers' types.

    Maintenance never runs handlers; a handler module that fails to import must not stop the
    service that repairs the system, so it costs only precise labels ("other" instead).
    """
    try:
        return TypeLabels(registry.load(settings.handlers))
    except Exception:
        log.exception("could not import the handler modules; DLQ metrics label them 'other'",
                      extra={"action": "startup"})
        return TypeLabels(registry.load(()))


def _stop_on_signals(stop: threading.Event) -> None:
    def handle(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name,
                 extra={"action": "shutdown"})
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def run(settings: Settings, metrics_port: int, *, fallback: bool = False) -> int:
    """Run maintenance until SIGTERM or SIGINT; returns the exit status. `fallback`:
    `metrics_port` is the default one, not given, so a taken one moves on to the next free
    port (taskline.metrics.serve), and several instances share a host."""
    stop = threading.Event()
    _stop_on_signals(stop)
    store = Store.connect(settings.database_url, pool_size=doctor.MAINTENANCE_POOL_SIZE,
                          schema=settings.schema,
                          application_name="taskline-maintenance",
                          transaction_pooled=settings.transaction_pooled)
    store.max_queues = settings.max_queues  # the scheduler's jobs count against it
    # The breaker keeps a Redis outage from costing every pass a timeout (promoter, reaper).
    dispatcher = Dispatcher(settings.redis_url, breaker=True,
                            partitions=settings.queue_partitions)
    readiness = Readiness(degraded=lambda: "Redis unreachable" if dispatcher.redis_down else None)
    try:
        metrics_port = metrics.serve(metrics_port, ready=readiness.answer,
                                     fallback=fallback) or 0
    except OSError as err:
        log.error("cannot serve /metrics", extra={"action": "start", "port": metrics_port,
                                                  "error": str(err)})
        return 2
    service = Maintenance(store, dispatcher, settings, types=type_labels(settings))
    # Started before PostgreSQL answers, every component would fail its passes: wait instead.
    if not startup.wait_for("PostgreSQL", store.ping, stop, readiness):
        log.warning("stopped while waiting for PostgreSQL", extra={"action": "shutdown"})
        return 0
    service.start()
    readiness.working()
    # What an operator got wrong (autovacuum off, an evicting Redis ...), logged beside the work.
    doctor.warn_at_start(settings, doctor.Plan(workers=0, api_processes=0, maintenance=1))
    log.info("maintenance started", extra={"action": "startup", "holder": service.leader.holder,
                                           "metrics_port": metrics_port})
    while not stop.wait(0.5):
        pass
    readiness.stopping()
    service.stop()
    dispatcher.close()
    store.dispose()
    log.info("maintenance stopped", extra={"action": "shutdown"})
    return 0
