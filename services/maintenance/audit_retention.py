"""Audit retention: deletes audit records older than TASKLINE_RETAIN_AUDIT_S.

Invariant: only records older than the retention (in PostgreSQL's clock) are deleted, oldest
first, in batches of `BATCH` rows (each one short statement over the (at, id) index, so no
statement holds locks for long and no pass scans the table), at most `MAX_BATCHES` per pass;
a retention of 0 keeps every record. Runs only on the active maintenance instance, at least
every 10 reaper intervals, as the job retention does. Counted in taskline_audit_deleted_total.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from taskline import metrics
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.views import MaintenanceStore

log = logging.getLogger(__name__)

BATCH = 1000
"""Records deleted per statement."""
MAX_BATCHES = 100
"""Statements per pass; a larger backlog is worked off over the following passes."""
INTERVAL_REAPER_INTERVALS = 10
"""A pass runs every this many reaper intervals."""


@dataclass(frozen=True)
class AuditRetentionResult:
    """Counts of one pass."""

    deleted: int = 0

    @property
    def changed(self) -> bool:
        return self.deleted > 0


class AuditRetention(Periodic):
    """Deletes expired audit records in bounded batches while this instance leads."""

    name = "audit_retention"

    def __init__(self, store: MaintenanceStore, settings: Settings, *, batch: int = BATCH,
                 max_batches: int = MAX_BATCHES) -> None:
        super().__init__()
        self.store = store
        self.settings = settings
        self.batch = batch
        self.max_batches = max_batches

    @property
    def interval_s(self) -> float:
        return INTERVAL_REAPER_INTERVALS * self.settings.reaper_interval_s

    def run_once(self) -> AuditRetentionResult:
        retain_s = self.settings.retain_audit_s
        if retain_s <= 0:
            return AuditRetentionResult()
        deleted = 0
        for _ in range(self.max_batches):
            count = self.store.delete_expired_audit(retain_s, self.batch)
            deleted += count
            if count < self.batch:
                break
        if deleted:
            metrics.maintenance().audit_deleted.inc(deleted)
            log.info("audit records deleted by retention", extra={
                "action": "audit_retention", "deleted": deleted})
        else:
            log.debug("audit retention pass: nothing expired", extra={"action": "audit_retention"})
        return AuditRetentionResult(deleted)
