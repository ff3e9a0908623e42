"""The recorder's write of outcomes while PostgreSQL refuses it: the first try, then retries at
0.05 s, 0.1 s, ... while a lease of the batch is valid, and nothing once none is."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from taskline.errors import StoreUnavailable
from taskline.execution.attempts import Attempts
from taskline.execution.outcomes import RETRY_FIRST_WAIT_S, SUCCESS, Recorder, Report
from taskline.metrics import TypeLabels
from taskline.settings import Settings
from taskline.store.store import Store
from tests.unit.test_worker_attempts import make_attempt


def recorder(store: Store, settings: Settings, forgotten: list) -> Recorder:
    return Recorder(store=store, dispatcher=None, worker_id="w1", settings=settings,
                    attempts=Attempts(4), types=TypeLabels(["echo"]), forget=forgotten.extend)


def refusing(times: int, calls: list[float]) -> Callable[[list[Report]], Any]:
    """A write PostgreSQL refuses `times` times, then answers with the reports it was given."""
    def write(live: list[Report]) -> Any:
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise StoreUnavailable("connection refused")
        return [r.attempt.lease_id for r in live]
    return write


def report(lease_id: int, valid: bool = True) -> Report:
    attempt = make_attempt(lease_id=lease_id, sent_at=time.monotonic() if valid else 0.0)
    return Report(attempt, SUCCESS)


def test_a_write_that_succeeds_at_once_is_tried_once(store: Store, settings: Settings):
    forgotten: list = []
    calls: list[float] = []
    reports = [report(1), report(2)]
    written = recorder(store, settings, forgotten)._persist(reports, refusing(0, calls))
    assert written == (reports, [1, 2]) and len(calls) == 1
    assert forgotten == [r.attempt for r in reports]  # decided: no longer fenced locally


def test_a_refused_write_is_retried_with_growing_waits(store: Store, settings: Settings):
    calls: list[float] = []
    reports = [report(1)]
    written = recorder(store, settings, [])._persist(reports, refusing(3, calls))
    assert written == (reports, [1]) and len(calls) == 4
    waits = [b - a for a, b in itertools.pairwise(calls)]
    assert waits[0] >= RETRY_FIRST_WAIT_S and waits[1] >= 2 * RETRY_FIRST_WAIT_S
    assert waits[2] >= 4 * RETRY_FIRST_WAIT_S


def test_only_reports_whose_lease_is_valid_are_written(store: Store, settings: Settings):
    calls: list[float] = []
    reports = [report(1), report(2, valid=False)]
    written = recorder(store, settings, [])._persist(reports, refusing(1, calls))
    assert written == (reports[:1], [1])


def test_nothing_is_written_once_no_lease_is_valid(store: Store, settings: Settings):
    calls: list[float] = []
    assert recorder(store, settings, [])._persist([report(1, valid=False)],
                                                  refusing(0, calls)) is None
    assert calls == []
    lapsing = report(1)
    lapsing.attempt.lease_deadline = time.monotonic() + 0.2
    assert recorder(store, settings, [])._persist([lapsing], refusing(100, calls)) is None
    assert 2 <= len(calls) <= 4  # retried while the lease was valid, then given up


def test_a_refused_write_whose_leases_lapsed_is_given_up_without_a_wait(store: Store,
                                                                        settings: Settings):
    calls: list[float] = []
    lapsing = report(1)

    def refused_as_the_lease_lapses(live: list[Report]) -> Any:
        calls.append(time.monotonic())
        lapsing.attempt.lease_deadline = 0.0
        raise StoreUnavailable("connection refused")

    started = time.monotonic()
    assert recorder(store, settings, [])._persist([lapsing], refused_as_the_lease_lapses) is None
    assert len(calls) == 1 and time.monotonic() - started < RETRY_FIRST_WAIT_S
