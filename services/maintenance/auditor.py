"""The periodic audit of the recorded history: `taskline audit verify` as a maintenance pass.

Invariant: it only reads (taskline.audit_verify over taskline.store.history, page by page in
consistent snapshots), runs on the active instance only, every TASKLINE_AUDIT_INTERVAL_S
(0, the default: never), over the jobs created in the last `WINDOW_S` and the flow limit
settings in force since then, so a pass's work is bounded by a day of history, not by all of
it. Each pass sets `taskline_audit_violations{rule}` to what it found (0 for a clean rule), so
the gauge says what the newest pass saw, and logs each violation (at most `LOGGED` a pass) at
ERROR with its rule and job id.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from taskline.audit_verify import RULES, verify
from taskline.metrics import AUDIT_VIOLATIONS
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.history import HistoryReader
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

WINDOW_S = 86_400.0
"""A pass audits the jobs created in the last day (`taskline audit verify` audits any span)."""
LOGGED = 100
"""Violations logged per pass; the gauge counts them all."""
OFF_POLL_S = 3600.0
"""How often a component whose audit is off wakes (to notice nothing), seconds."""


@dataclass(frozen=True)
class AuditResult:
    """What one pass judged and found."""

    jobs: int = 0
    violations: Counter[str] = field(default_factory=Counter)

    @property
    def changed(self) -> bool:
        return False  # it never changes anything


class Auditor(Periodic):
    """Audits the last day of history every TASKLINE_AUDIT_INTERVAL_S while this instance
    leads."""

    name = "audit"

    def __init__(self, store: MaintenanceStore, settings: Settings, *,
                 window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.store = store
        self.settings = settings
        self.window_s = window_s
        self.reader = HistoryReader(store.engine, store.schema)

    @property
    def interval_s(self) -> float:
        return self.settings.audit_interval_s or OFF_POLL_S

    def run_once(self) -> AuditResult:
        if self.settings.audit_interval_s <= 0:
            return AuditResult()
        since = self.reader.now() - timedelta(seconds=self.window_s)
        stats: dict[str, int] = {}
        found: Counter[str] = Counter()
        for violation in verify(self.reader, since, stats=stats):
            found[violation.rule] += 1
            if sum(found.values()) <= LOGGED:
                log.error("audit: %s", violation.message, extra={
                    "action": "audit_violation", "rule": violation.rule,
                    "job_id": violation.job_id})
        for rule in RULES:
            AUDIT_VIOLATIONS.labels(rule=rule).set(found[rule])
        log.info("audit pass", extra={"action": "audit", "jobs": stats.get("jobs", 0),
                                      "violations": sum(found.values())})
        return AuditResult(stats.get("jobs", 0), found)

    def idle(self) -> None:
        """A standby instance exports no verdict: the leader's is the one to read."""
        AUDIT_VIOLATIONS.clear()
