"""The list lane: an API process's list reads run on threads of their own, at most `limit` at once.

A list or page read (the job, workflow, DLQ, audit, queue and schedule lists, a workflow's
steps) costs tens of times a single enqueue. Without a bound, 32 clients listing in a loop hold
every request thread, and an enqueue waits behind them for a thread: measured, its p50 went from
5 ms to 90 ms. Here a framed request is classified on the event loop from its request line; at
most `limit` list reads run at once per process (`TASKLINE_API_LIST_THREADS`), and the others
wait in arrival order, holding a connection and its read bytes but no thread. The admitted ones
run on the lane's own `limit` threads (`lane_threads`), never on the request threads, so every
other request always finds a thread; those threads may run at a lower OS priority
(`TASKLINE_API_LIST_NICE`). With `rate` set (`TASKLINE_API_LIST_RATE`), at most that many
list reads start per second per process (a token bucket holding one second's worth): clients
listing in a closed loop take every answer the API gives, so the pace of those answers, not
what one costs, bounds the CPU they take from the enqueues (docs/performance.md). Listing
clients are answered, later, never refused.

Invariant: every admitted list read is matched by one `done`, which hands its slot to the
oldest waiting one when the pace allows, else `due` starts it once a token is there (the event
loop asks every turn, and wakes by `next_due_s`); nothing waits once the worker stops
(`release_all`).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# A GET of a collection (its query string, if any, follows) or of one workflow (its steps).
_LIST_READ = re.compile(
    rb"GET /api/v1/(?:jobs|dlq|dlq/groups|audit|queues|schedules|workflows"
    rb"|workflows/[^/?\s]+)(?:\?[^\s]*)? ")


def is_list_read(message: bytes) -> bool:
    """Whether the framed request `message` (its head first) is a list or page read."""
    return _LIST_READ.match(message, 0, 512) is not None


def lane_threads(limit: int, nice: int) -> ThreadPoolExecutor:
    """The `limit` threads that run admitted list reads, each `nice` steps below the process's
    priority (Linux sets a thread's nice by its id)."""
    return ThreadPoolExecutor(max_workers=limit, thread_name_prefix="list-lane",
                              initializer=_lower_priority, initargs=(nice,))


def _lower_priority(nice: int) -> None:
    if nice <= 0:
        return
    tid = threading.get_native_id()
    # Relative to the process's own nice; lowering a priority needs no privilege.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))


class ListLane:
    """Admission of list reads to the lane's threads, on the worker's event loop (one thread)."""

    def __init__(self, limit: int, rate: float = 0.0) -> None:
        self.limit = limit
        self.rate = rate
        """List reads started per second at most (0: no pace)."""
        self.running = 0
        self.waiting: deque[Any] = deque()
        self._tokens = max(rate, 1.0)
        self._stamp = time.monotonic()

    def admit(self, conn: Any) -> bool:
        """True: run `conn`'s list read now; False: it waits for a slot (kept here)."""
        conn.in_list_lane = True
        if self.running < self.limit and not self.waiting and self._take():
            self.running += 1
            return True
        self.waiting.append(conn)
        return False

    def done(self, conn: Any) -> Any | None:
        """`conn`'s list read finished: the waiting connection to run next, if any."""
        if not getattr(conn, "in_list_lane", False):
            return None
        conn.in_list_lane = False
        if self.waiting and self._take():
            return self.waiting.popleft()
        self.running -= 1
        return None

    def due(self) -> list[Any]:
        """Waiting connections whose turn came with the pace's tokens: run them now."""
        started = []
        while self.waiting and self.running < self.limit and self._take():
            self.running += 1
            started.append(self.waiting.popleft())
        return started

    def next_due_s(self) -> float | None:
        """Seconds until `due` may start a waiting read (None: nothing waits on the pace)."""
        if not self.waiting or self.running >= self.limit or self.rate <= 0:
            return None
        self._refill()
        return max((1.0 - self._tokens) / self.rate, 0.0)

    def _take(self) -> bool:
        if self.rate <= 0:
            return True
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._tokens + (now - self._stamp) * self.rate, max(self.rate, 1.0))
        self._stamp = now

    def release_all(self) -> list[Any]:
        """Every waiting connection, to run at once (the worker is stopping)."""
        released = list(self.waiting)
        self.waiting.clear()
        self.running += len(released)
        return released
