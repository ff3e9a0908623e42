"""The one loop skeleton of every periodic component (worker and maintenance alike).

Invariant: a failed pass never ends its loop. It is logged (with the traceback when the error
is unexpected; "PostgreSQL/Redis unreachable" is expected and logged without one, with the
driver's own message: `taskline.errors.detail`), counted in
`taskline_loop_errors_total{loop}`, and the next pass runs after the wait. A pass starts only
while `active()` is true (a maintenance component runs only while its instance leads). Every
finished pass, failed or not, is announced on the component's `passes` signal, which tests
wait on instead of sleeping.

A component subclasses `Periodic`: it names itself (`name`, the metric's `loop` label), says
how long to wait between passes (`interval_s`, optionally `next_wait`), and implements
`run_once() -> result`, which tests also call directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import ClassVar

from taskline.errors import DispatchUnavailable, StoreUnavailable, detail
from taskline.metrics import LOOP_ERRORS

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.25
"""How often an inactive component checks whether it became active, seconds."""
_EXPECTED = (StoreUnavailable, DispatchUnavailable)


def always() -> bool:
    return True


def guarded(name: str, step: Callable[[], object], target: str | None = None,
            ) -> tuple[bool, object]:
    """Run one pass (or one `target` of it): (True, its result), or (False, None) after
    logging and counting why."""
    extra = {"action": name} if target is None else {"action": name, "target": target}
    try:
        return True, step()
    except _EXPECTED as err:
        LOOP_ERRORS.labels(loop=name).inc()
        log.error("%s pass failed: %s", name, detail(err), extra=extra)
    except Exception:
        LOOP_ERRORS.labels(loop=name).inc()
        log.exception("%s pass failed unexpectedly", name, extra=extra)
    return False, None


class Passes:
    """A test signal: counts finished passes and lets a caller wait for the next ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0
        self.failures = 0
        self.last: object = None

    def done(self, ok: bool, result: object) -> None:
        with self._cond:
            self.count += 1
            self.failures += not ok
            self.last = result
            self._cond.notify_all()

    def wait(self, after: int | None = None, timeout: float = 10.0) -> object:
        """Block until more than `after` passes (default: as many as now) have finished;
        returns the newest pass's result. TimeoutError when none came in `timeout` seconds."""
        with self._cond:
            floor = self.count if after is None else after
            if not self._cond.wait_for(lambda: self.count > floor, timeout):
                raise TimeoutError(f"no pass within {timeout} s (passes so far: {self.count})")
            return self.last


class Periodic:
    """Base of a periodic component: `run(stop, active)` loops over `run_once`."""

    name: ClassVar[str]
    fixed_rate: ClassVar[bool] = False
    """Passes start every `interval_s` however long the last one took (lease renewal: on a
    slow link a pass lasts seconds, and a full period after it would eat the lease's margin).
    Otherwise the wait after a pass is `next_wait()`."""

    def __init__(self) -> None:
        self.passes = Passes()

    @property
    def interval_s(self) -> float:
        raise NotImplementedError

    def run_once(self) -> object:
        raise NotImplementedError

    def next_wait(self) -> float:
        """Seconds to sleep after a pass, at most `interval_s` (default: the interval)."""
        return self.interval_s

    def idle(self) -> None:
        """Called whenever the component finds itself inactive (e.g. to clear gauges)."""

    def run(self, stop: threading.Event, active: Callable[[], bool] = always) -> None:
        """A pass as soon as the component is active, then one per wait, until `stop`."""
        while not stop.is_set():
            if not active():
                guarded(self.name, self.idle)
                stop.wait(min(self.interval_s, IDLE_POLL_S))
                continue
            started = time.monotonic()
            ok, result = guarded(self.name, self.run_once)
            self.passes.done(ok, result)
            self.sleep(stop, self._wait(started))

    def sleep(self, stop: threading.Event, seconds: float) -> None:
        """The wait between passes (a component woken early overrides it)."""
        stop.wait(seconds)

    def _wait(self, started: float) -> float:
        if self.fixed_rate:
            return max(started + self.interval_s - time.monotonic(), 0.0)
        try:
            return min(self.interval_s, self.next_wait())
        except _EXPECTED as err:
            log.warning("%s: next wake-up unknown (%s); waiting the interval", self.name,
                        detail(err), extra={"action": self.name})
            return self.interval_s
