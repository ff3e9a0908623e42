"""Flow-limit gauges, exported by the active maintenance instance only.

Invariant: one process exports them (a standby clears what it exported while leading), read
from PostgreSQL in one statement per pass: per scope, its limits, the queued jobs it applies to
(held back while its budget is used), its open leases and the starts inside its rate window.
Interval: every `TASKLINE_REAPER_INTERVAL_S` seconds, like the depth gauges.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskline.metrics import (
    LIMIT_CONCURRENCY,
    LIMIT_HELD,
    LIMIT_RATE,
    LIMIT_RUNNING,
    LIMIT_STARTED,
)
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.views import MaintenanceStore

_GAUGES = (LIMIT_HELD, LIMIT_RUNNING, LIMIT_STARTED, LIMIT_CONCURRENCY, LIMIT_RATE)


@dataclass(frozen=True)
class LimitResult:
    limits: int
    held: int


class LimitGauges(Periodic):
    """Sets the flow-limit gauges from PostgreSQL; clears them when not leading."""

    name = "limits"

    def __init__(self, store: MaintenanceStore, settings: Settings) -> None:
        super().__init__()
        self.store = store
        self.settings = settings

    @property
    def interval_s(self) -> float:
        return self.settings.reaper_interval_s

    def idle(self) -> None:
        self.clear()

    def run_once(self) -> LimitResult:
        rows = self.store.list_flow_limits()
        self.clear()  # a removed limit's series must go, not freeze at its last value
        for row in rows:
            scope = row["scope"]
            LIMIT_HELD.labels(scope=scope).set(row["held"])
            LIMIT_RUNNING.labels(scope=scope).set(row["running"])
            LIMIT_STARTED.labels(scope=scope).set(row["started"])
            if row["concurrency"] is not None:
                LIMIT_CONCURRENCY.labels(scope=scope).set(row["concurrency"])
            if row["rate_limit"] is not None:
                LIMIT_RATE.labels(scope=scope).set(row["rate_limit"])
        return LimitResult(len(rows), sum(r["held"] for r in rows))

    def clear(self) -> None:
        for gauge in _GAUGES:
            gauge.clear()
