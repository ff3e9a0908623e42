"""The worker's deadline thread: calls in due order, cancelled calls never run, and the heap
stays bounded by the live deadlines however many are cancelled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from taskline.execution.deadlines import Deadlines
from tests.helpers import wait_for


@pytest.fixture
def deadlines() -> Iterator[Deadlines]:
    d, stop = Deadlines(), threading.Event()
    thread = threading.Thread(target=d.run, args=(stop,), daemon=True)
    thread.start()
    yield d
    stop.set()
    d.wake()
    thread.join(5)
    assert not thread.is_alive()


def test_calls_run_once_in_due_order(deadlines: Deadlines):
    calls: list[str] = []
    now = time.monotonic()
    deadlines.call_at(now + 0.15, lambda: calls.append("late"))
    deadlines.call_at(now + 0.05, lambda: calls.append("early"))
    deadlines.call_at(now - 1, lambda: calls.append("overdue"))
    wait_for(lambda: len(calls) == 3, timeout=5, interval=0.01)
    assert calls == ["overdue", "early", "late"]


def test_a_cancelled_call_never_runs(deadlines: Deadlines):
    calls: list[str] = []
    now = time.monotonic()
    cancelled = deadlines.call_at(now + 0.05, lambda: calls.append("cancelled"))
    deadlines.call_at(now + 0.1, lambda: calls.append("kept"))
    deadlines.cancel(cancelled)
    wait_for(lambda: calls, timeout=5, interval=0.01)
    assert calls == ["kept"]


def test_a_failing_call_does_not_stop_the_thread(deadlines: Deadlines):
    calls: list[str] = []
    deadlines.call_at(time.monotonic(), lambda: 1 / 0)
    deadlines.call_at(time.monotonic() + 0.02, lambda: calls.append("after"))
    wait_for(lambda: calls, timeout=5, interval=0.01)


def test_cancelled_entries_do_not_accumulate():
    d = Deadlines()
    far = time.monotonic() + 3600
    for _ in range(10_000):
        d.cancel(d.call_at(far, lambda: None))
    kept = d.call_at(far, lambda: None)
    assert len(d) == 1
    assert len(d._heap) < 200  # compacted, not 10,001 entries
    d.cancel(kept)
    d.cancel(kept)  # cancelling twice is harmless
    assert len(d) == 0


def test_calls_armed_together_run_in_due_order_and_cancel_together(deadlines: Deadlines):
    calls: list[str] = []
    now = time.monotonic()
    deadlines.call_at(now + 30, lambda: calls.append("far"))  # the sleeper's current target
    armed = deadlines.call_many([(now + 0.1, lambda: calls.append("b")),
                                 (now + 0.05, lambda: calls.append("a")),
                                 (now + 0.08, lambda: calls.append("dropped"))])
    deadlines.cancel_many([armed[2], None])
    wait_for(lambda: len(calls) == 2, timeout=5, interval=0.01)
    assert calls == ["a", "b"]
    assert len(deadlines) == 1  # only "far" is left
