"""The loop every maintenance component runs in: one pass per interval while this instance
leads, surviving failed passes.

Invariant: a failed pass never ends the loop. It is logged (with the traceback when the error
is unexpected) and counted in `taskline_loop_errors_total{loop}`, and the next pass runs after
the interval. A pass starts only while `active()` is true (this instance holds the maintenance
lease); a pass already running when leadership is lost finishes its current step, which is
safe because every state change is a conditional UPDATE in PostgreSQL and every Redis move is
idempotent or repaired by the next reconciliation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from taskline.errors import DispatchUnavailable, StoreUnavailable
from taskline.metrics import LOOP_ERRORS

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.25
"""How often a component that is not active checks whether it became active, seconds."""


def always() -> bool:
    return True


def run_every(name: str, interval_s: float, step: Callable[[], object],
              stop: threading.Event, active: Callable[[], bool] = always,
              idle: Callable[[], None] | None = None,
              wait: Callable[[], float] | None = None) -> None:
    """Call `step` every `interval_s` seconds while `active()`, until `stop` is set.

    `idle` runs whenever the component finds itself inactive (e.g. to clear gauges that only
    the leader may export). A component that becomes active runs its first pass at once.
    `wait`, when given, returns the seconds to sleep after a pass (at most `interval_s`).
    """
    while not stop.is_set():
        if not active():
            if idle is not None:
                guarded(name, idle)
            stop.wait(min(interval_s, IDLE_POLL_S))
            continue
        guarded(name, step)
        stop.wait(interval_s if wait is None else next_wait(name, interval_s, wait))


def next_wait(name: str, interval_s: float, wait: Callable[[], float]) -> float:
    """The component's own wait, bounded by its interval; the interval when it fails."""
    try:
        return min(interval_s, wait())
    except (StoreUnavailable, DispatchUnavailable) as err:
        log.warning("%s: next wake-up unknown (%s); waiting the interval", name, err,
                    extra={"action": name})
        return interval_s


def guarded(name: str, step: Callable[[], object]) -> None:
    """Run one pass; log and count its failure instead of raising."""
    try:
        step()
    except (StoreUnavailable, DispatchUnavailable) as err:
        LOOP_ERRORS.labels(loop=name).inc()
        log.error("%s pass failed: %s", name, err, extra={"action": name})
    except Exception:
        LOOP_ERRORS.labels(loop=name).inc()
        log.exception("%s pass failed unexpectedly", name, extra={"action": name})
