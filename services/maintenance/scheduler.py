"""The scheduler: enqueues one job per slot of every schedule that is not paused.

Invariant: a slot gets at most one job, whoever fires it and however often. The slot's record
(`schedule_slots`, keyed by schedule and slot instant, never deleted) and its job are inserted
by one statement (`Store.fire_slot`), so a second attempt for the same slot, by this instance
after a restart or by another after a leader change (or a second replica that still believes
it leads), inserts nothing. Only after that commit is the job pushed to Redis (the ENQUEUE
move's step, `Dispatcher.follow`); if this process dies in between, the reconciler pushes it.

What is due is judged in PostgreSQL's clock (the schedules are read with `now()`), slot by
slot as taskline.schedules computes them (`due_slots`): every slot after the schedule's
`since` and its last fired slot, oldest first, each by its own statement, so a pass that
falls behind (a slow database, many schedules) fires the slots late but fires every one.
`catch_up` decides only about slots missed while no instance led: those before this
instance's leadership began (its first pass, or its first after `idle`). A pass
runs every `TICK_S` at most, sooner when a slot is due earlier, so a slot fires within about a
second of its instant while this instance leads; the pass's jobs are pushed to Redis in one
call after their commits. Between slots a schedule costs nothing but the read of its row: the
instant of its next slot is kept per (schedule, revision, last slot).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from taskline.access import parse_quotas
from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import QueueLimitReached
from taskline.jobs import Job
from taskline.metrics import (
    LOOP_ERRORS,
    SCHEDULE_FIRED,
    SCHEDULE_FOLDED,
    SCHEDULE_LAG,
    SCHEDULE_SKIPPED,
)
from taskline.mirror import Mirror
from taskline.quota import EnqueueQuotas
from taskline.schedules import (
    CATCH_UP,
    MAX_SLOTS_PER_PASS,
    NO_SLOT,
    QUOTA_CLIENT,
    Cron,
    InvalidSchedule,
    declared,
    due_slots,
    next_due,
)
from taskline.service import Periodic
from taskline.settings import Settings
from taskline.store.rows import ScheduleRow
from taskline.store.store import STATEMENT_ERRORS
from taskline.store.views import MaintenanceStore
from taskline.transitions import ENQUEUE, Committed

log = logging.getLogger(__name__)
SCHEDULE_ERRORS = LOOP_ERRORS.labels(loop="scheduler")

TICK_S = 0.5
"""Longest pause between passes, seconds: a due slot waits at most this long to be seen."""
MIN_WAIT_S = 0.02


@dataclass(frozen=True)
class SchedulerResult:
    """Counts of one pass."""

    fired: int = 0
    skipped: int = 0
    conflicts: int = 0
    """Slots another instance (or an earlier life of this one) had fired already."""


@dataclass(frozen=True)
class _Known:
    """What a schedule's row looked like when its next slot was computed."""

    revision: int
    last_slot: datetime | None
    next_due: datetime


class Scheduler(Periodic):
    """Fires due schedule slots through the normal enqueue path: commit, then push."""

    name = "scheduler"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, settings: Settings, *,
                 declarations: Iterable[tuple[str, dict[str, Any]]] = ()) -> None:
        super().__init__()
        self.store = store
        self.dispatcher = dispatcher
        self.mirror = Mirror.of(dispatcher, store)
        self.settings = settings
        self._declarations = list(declarations)
        self._declared = False
        self._known: dict[str, _Known] = {}
        self._crons: dict[tuple[str, str], Cron] = {}
        self._wait_s = TICK_S
        self._led_from: datetime | None = None
        """When this instance's current leadership began (PostgreSQL's clock, its first pass)."""
        self._passed: dict[str, datetime] = {}
        """Per schedule, the newest slot passed over by its client's quota (never fired)."""
        quotas = parse_quotas(settings.enqueue_quotas)
        self._quotas = EnqueueQuotas(settings.redis_url, quotas) if quotas else None
        for mode in CATCH_UP:  # 0, not "no data", on a dashboard before the first skip
            SCHEDULE_SKIPPED.labels(catch_up=mode)

    @property
    def interval_s(self) -> float:
        return TICK_S

    def next_wait(self) -> float:
        return self._wait_s

    def idle(self) -> None:
        """Not leading: the next pass to lead starts a new leadership (`_led_from`)."""
        self._led_from = None
        self._known.clear()
        self._passed.clear()

    def run_once(self) -> SchedulerResult:
        if not self._declared:
            self._declare()
        rows = self.store.active_schedules()
        if rows and self._led_from is None:
            self._led_from = rows[0].db_now
        self._known = {r.name: self._known[r.name] for r in rows if r.name in self._known}
        total = SchedulerResult()
        wait = TICK_S
        pushes: list[Committed] = []
        for row in rows:
            outcome = self._judge_one(row, pushes)
            if outcome is None:
                continue
            result, due = outcome
            total = SchedulerResult(total.fired + result.fired, total.skipped + result.skipped,
                                    total.conflicts + result.conflicts)
            wait = min(wait, max((due - row.db_now).total_seconds(), MIN_WAIT_S))
        self._push(pushes)
        self._wait_s = wait
        if not total.fired:
            log.debug("scheduler pass: nothing due", extra={"action": "scheduler"})
        return total

    def _cron(self, row: ScheduleRow) -> Cron:
        key = (row.cron, row.timezone)
        if key not in self._crons:
            self._crons[key] = Cron.parse(row.cron, row.timezone)
        return self._crons[key]

    def _judge_one(self, row: ScheduleRow, pushes: list[Committed]
                   ) -> tuple[SchedulerResult, datetime] | None:
        """`_judge`, where a schedule PostgreSQL refuses to enqueue (or whose expression finds
        no next slot, or whose queue would pass TASKLINE_MAX_QUEUES) costs that schedule's
        slot only, which stays due; an outage still fails the pass."""
        try:
            return self._judge(row, pushes)
        except (*STATEMENT_ERRORS, *NO_SLOT, QueueLimitReached) as err:
            SCHEDULE_ERRORS.inc()
            log.error("schedule %s could not be judged or fired: %s", row.name, err,
                      extra={"action": "scheduler", "schedule": row.name})
            return None

    def _judge(self, row: ScheduleRow, pushes: list[Committed]
               ) -> tuple[SchedulerResult, datetime] | None:
        """Fire every slot `row` owes, oldest first; the result and when it is next due.
        None when the schedule cannot be read."""
        known = self._known.get(row.name)
        if (known is not None and known.revision == row.revision
                and known.last_slot == row.last_slot and row.db_now < known.next_due):
            return SchedulerResult(), known.next_due
        try:
            cron = self._cron(row)
        except InvalidSchedule as err:  # written by hand past the API's validation
            log.error("schedule %s cannot be read: %s", row.name, err,
                      extra={"action": "scheduler", "schedule": row.name})
            return None
        since = max(row.since, row.last_slot or row.since, self._passed.get(row.name, row.since))
        due = due_slots(cron, since, row.db_now, self._led_from or row.db_now, row.catch_up)
        if due.skipped:
            SCHEDULE_SKIPPED.labels(catch_up=row.catch_up).inc(due.skipped)
        fired, over, last, newest = self._fire_all(row, due.slots, pushes)
        if last is None or len(due.slots) >= MAX_SLOTS_PER_PASS:  # re-read, or more due now
            return SchedulerResult(fired, due.skipped + over, int(last is None)), row.db_now
        next_slot = next_due(cron, max(since, last), row.db_now)
        self._known[row.name] = _Known(row.revision, newest, next_slot)
        return SchedulerResult(fired, due.skipped + over), next_slot

    def _fire_all(self, row: ScheduleRow, slots: list[datetime], pushes: list[Committed]
                  ) -> tuple[int, int, datetime | None, datetime | None]:
        """Fire `slots` in order: (fired, passed over by the creator's quota, the last slot
        judged or None when one was fired already (the schedule is re-read next pass), the
        schedule's last fired slot)."""
        fired = over = 0
        last, newest = max(row.since, row.last_slot or row.since), row.last_slot
        for slot in slots:
            if not self._within_quota(row, slot):
                over, last = over + 1, slot
                self._passed[row.name] = slot
                continue
            job, folded = self._fire(row, slot)
            if folded:  # a job still holds the schedule's unique key: this slot makes none
                last, newest = slot, slot
                continue
            if job is None:  # fired by another instance, or the schedule changed
                return fired, over, None, newest
            pushes.append(Committed(ENQUEUE, str(job.id), job.queue, job.priority))
            fired, last, newest = fired + 1, slot, slot
        return fired, over, last, newest

    def _within_quota(self, row: ScheduleRow, slot: datetime) -> bool:
        """Whether the enqueue quota of the client that wrote the schedule through the API
        takes the slot's job (taskline.schedules.QUOTA_CLIENT; none for `@periodic`). A
        slot it refuses is passed over, never fired: logged and counted as refused."""
        client = row.job.get(QUOTA_CLIENT)
        if self._quotas is None or client is None or self._quotas.take(client, 1).taken:
            return True
        log.warning("schedule slot passed over: its client's enqueue quota is used up", extra={
            "action": "schedule_quota", "schedule": row.name, "client": client,
            "scheduled_for": slot.isoformat()})
        return False

    def _fire(self, row: ScheduleRow, slot: datetime) -> tuple[Job | None, bool]:
        """Enqueue the slot's job with the slot's record: (the job, False); (None, False) when
        it was fired already; (the job holding the schedule's unique key, True) when the slot
        was folded into that job instead (docs/unique.md)."""
        if "unique" in row.job:
            job, folded = self.store.fire_unique_slot(row, slot)
            if folded and job is not None:
                SCHEDULE_FOLDED.inc()
                log.info("schedule slot folded into the job holding its unique key", extra={
                    "action": "schedule_slot_folded", "schedule": row.name,
                    "scheduled_for": slot.isoformat(), "job_id": str(job.id)})
                return job, True
        else:
            job = self.store.fire_slot(row, slot)
        return self._fired(row, slot, job), False

    def _fired(self, row: ScheduleRow, slot: datetime, job: Job | None) -> Job | None:
        """Count and log what firing the slot did; `job` (None: fired already)."""
        if job is None:
            log.info("schedule slot already fired", extra={
                "action": "schedule_slot_taken", "schedule": row.name,
                "scheduled_for": slot.isoformat()})
            return None
        SCHEDULE_FIRED.labels(queue=job.queue).inc()
        SCHEDULE_LAG.observe(max((job.created_at - slot).total_seconds(), 0.0))
        log.info("schedule slot fired", extra={
            "action": "schedule_fired", "schedule": row.name, "scheduled_for": slot.isoformat(),
            "job_id": str(job.id), "queue": job.queue, "type": job.type})
        return job

    def _push(self, pushes: list[Committed]) -> None:
        """Hand the pass's committed jobs to Redis in one call."""
        if not pushes:
            return
        self.mirror.follow(pushes, action="schedule_fired")

    def _declare(self) -> None:
        """Upsert the schedules declared in code (`@periodic`), once, on the first pass this
        instance leads (so a PostgreSQL outage at start delays them instead of losing them).
        A declaration that cannot be used is logged and left out; the others are written.
        Then the schedules the code declared before and no longer are reported, and deleted
        with TASKLINE_PRUNE_SCHEDULES."""
        written = []
        for name, spec in self._declarations:
            try:
                fields = declared(name, spec, self.settings)
            except InvalidSchedule as err:
                log.error("@periodic declaration refused: %s", err,
                          extra={"action": "schedule_declared", "schedule": name})
                continue
            self.store.upsert_schedule(name=name, **fields)
            written.append(name)
            log.info("schedule declared in code upserted",
                     extra={"action": "schedule_declared", "schedule": name})
        marks = self.store.mark_declared_schedules(written)
        self._undeclared(sorted(name for name, now in marks.items() if not now))
        self._declared = True

    def _undeclared(self, names: list[str]) -> None:
        """Schedules declared in code before and no longer: reported, or deleted if asked."""
        prune = self.settings.prune_schedules
        for name in names:
            if prune and self.store.delete_schedule(name):
                log.warning("schedule no longer declared in code: deleted "
                            "(TASKLINE_PRUNE_SCHEDULES)",
                            extra={"action": "schedule_pruned", "schedule": name})
            elif not prune:
                log.warning("schedule no longer declared in code: it still fires; delete it "
                            "(taskline schedules delete) or set TASKLINE_PRUNE_SCHEDULES=true",
                            extra={"action": "schedule_undeclared", "schedule": name})
