"""The loop skeleton every periodic component shares: survives failed passes, runs only while
active, paces passes, and announces each pass on a signal tests wait on."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY

from taskline.errors import StoreUnavailable
from taskline.service import Passes, Periodic


class Steps(Periodic):
    """A component whose passes run the given callables in turn."""

    name = "test"

    def __init__(self, *steps, interval_s: float = 0.01) -> None:
        super().__init__()
        self.steps = list(steps)
        self.calls = 0
        self._interval_s = interval_s

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def run_once(self) -> object:
        self.calls += 1
        return self.steps[min(self.calls, len(self.steps)) - 1]()


def errors(loop: str) -> float:
    return REGISTRY.get_sample_value("taskline_loop_errors_total", {"loop": loop}) or 0


def test_a_loop_survives_a_failed_pass_and_counts_it():
    stop = threading.Event()

    def fail() -> None:
        raise RuntimeError("first pass fails")

    component = Steps(fail, lambda: stop.set() or "second")
    before = errors("test")
    component.run(stop)
    assert component.calls == 2
    assert errors("test") == before + 1
    assert component.passes.count == 2 and component.passes.failures == 1
    assert component.passes.last == "second"


def test_an_unreachable_store_is_a_counted_failure_too():
    stop = threading.Event()

    def down() -> None:
        raise StoreUnavailable()

    component = Steps(down, stop.set)
    before = errors("test")
    component.run(stop)
    assert errors("test") == before + 1


def test_an_inactive_loop_never_runs_its_pass_but_idles():
    stop = threading.Event()
    idled = []

    class Idle(Steps):
        def idle(self) -> None:
            idled.append(1)
            if len(idled) == 3:
                stop.set()

    component = Idle(lambda: None)
    component.run(stop, active=lambda: False)
    assert component.calls == 0 and len(idled) == 3


def test_tests_wait_on_the_pass_signal_instead_of_sleeping():
    stop = threading.Event()
    component = Steps(lambda: component.calls, interval_s=0.05)
    thread = threading.Thread(target=component.run, args=(stop,))
    thread.start()
    try:
        first = component.passes.wait(after=0, timeout=5)
        later = component.passes.wait(timeout=5)
        assert first >= 1 and later > first
    finally:
        stop.set()
        thread.join(5)


def test_a_pass_signal_times_out_when_no_pass_comes():
    with pytest.raises(TimeoutError):
        Passes().wait(timeout=0.05)


def test_fixed_rate_subtracts_the_pass_from_the_wait_and_fixed_delay_does_not():
    class Rate(Steps):
        fixed_rate = True

    six_seconds_ago = time.monotonic() - 6.0
    assert 3.0 < Rate(interval_s=10.0)._wait(six_seconds_ago) <= 4.0
    assert Steps(interval_s=10.0)._wait(six_seconds_ago) == 10.0
    assert Rate(interval_s=1.0)._wait(six_seconds_ago) == 0.0  # late: the next pass at once
