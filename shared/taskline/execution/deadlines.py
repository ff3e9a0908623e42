"""Deadlines: call a function when a monotonic instant passes, from one thread, without polling.

Invariant: callbacks run on the deadline thread in due order and must be quick (set flags,
enqueue work); each one re-checks its own condition, because what it guards may have finished
or been extended since it was scheduled. Cancelled entries are dropped lazily and the heap is
rebuilt once they outnumber the live ones, so memory stays bounded by the live deadlines.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from taskline.service import guarded

log = logging.getLogger(__name__)

_COMPACT_MIN = 64


@dataclass(eq=False)
class Deadline:
    """A scheduled call; cancel it through `Deadlines.cancel`."""

    at: float
    fn: Callable[[], None]
    cancelled: bool = False
    popped: bool = False


class Deadlines:
    """A heap of deadlines served by `run(stop)` on a dedicated thread."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap) - self._cancelled

    def call_at(self, at: float, fn: Callable[[], None]) -> Deadline:
        """Run `fn()` once `time.monotonic()` reaches `at`."""
        return self.call_many([(at, fn)])[0]

    def call_many(self, calls: Sequence[tuple[float, Callable[[], None]]]) -> list[Deadline]:
        """`call_at` for each (at, fn), under one acquisition of the lock.

        The worker arms a deadline per claimed job from the fetch loop while every handler
        thread arms and cancels its own: one acquisition per claimed batch keeps that lock
        (and the GIL hand-offs it causes) off the per-job path.
        """
        deadlines = [Deadline(at, fn) for at, fn in calls]
        with self._cond:
            first = self._heap[0][0] if self._heap else None
            for deadline in deadlines:
                heapq.heappush(self._heap, (deadline.at, next(self._seq), deadline))
            if first is None or self._heap[0][0] < first:
                self._cond.notify_all()
        return deadlines

    def cancel(self, deadline: Deadline | None) -> None:
        self.cancel_many((deadline,))

    def cancel_many(self, deadlines: Iterable[Deadline | None]) -> None:
        """`cancel` each of `deadlines` (None entries are skipped) under one acquisition."""
        with self._cond:
            for deadline in deadlines:
                if deadline is None or deadline.cancelled or deadline.popped:
                    continue
                deadline.cancelled = True
                self._cancelled += 1
            if self._cancelled > _COMPACT_MIN and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def wake(self) -> None:
        """Make `run` re-check its stop flag."""
        with self._cond:
            self._cond.notify_all()

    def run(self, stop: threading.Event) -> None:
        """Serve deadlines until `stop` is set (call `wake` after setting it)."""
        while True:
            due = self._next_due(stop)
            if due is None:
                return
            for deadline in due:
                guarded("deadlines", deadline.fn)

    def _next_due(self, stop: threading.Event) -> list[Deadline] | None:
        with self._cond:
            while not stop.is_set():
                now = time.monotonic()
                due = self._pop_due(now)
                if due:
                    return due
                self._cond.wait(self._heap[0][0] - now if self._heap else None)
            return None

    def _pop_due(self, now: float) -> list[Deadline]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            deadline = heapq.heappop(self._heap)[2]
            deadline.popped = True
            if deadline.cancelled:
                self._cancelled -= 1
            else:
                due.append(deadline)
        return due
