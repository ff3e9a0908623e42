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
from collections.abc import Callable
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
    """Admission of list reads to the lane's threads, on the worker's event loop (one thread).

    A read `quick` says the loop answers itself (a repeat the list cache holds) takes a token
    of the pace but no slot, and goes ahead of waiting reads that wait for a slot; a started
    read holds a slot when `conn.lane_slot` is set."""

    def __init__(self, limit: int, rate: float = 0.0,
                 quick: Callable[[Any], bool] | None = None) -> None:
        self.limit = limit
        self.rate = rate
        """List reads started per second at most (0: no pace)."""
        self.quick = quick or _never
        self.running = 0
        self.waiting: deque[Any] = deque()
        self._quick_waiting = 0
        """Waiting reads that were quick when they came: only then may `due` look past a
        read that waits for a slot."""
        self._tokens = max(rate, 1.0)
        self._stamp = time.monotonic()

    def admit(self, conn: Any) -> bool:
        """True: start `conn`'s list read now (on a thread if `conn.lane_slot`, else the loop
        answers it); False: it waits (kept here)."""
        conn.in_list_lane, conn.lane_slot = True, False
        conn.lane_quick = bool(self.quick(conn))
        # Ahead of waiting reads only when each of them waits for a slot a quick read needs not.
        passing = not self.waiting or (conn.lane_quick and self.running >= self.limit
                                       and not self._quick_waiting)
        if passing and self._startable(conn) and self._take():
            self._start(conn)
            return True
        self.waiting.append(conn)
        self._quick_waiting += conn.lane_quick
        return False

    def done(self, conn: Any) -> list[Any]:
        """`conn`'s list read finished: the waiting reads to start now."""
        if not getattr(conn, "in_list_lane", False):
            return []
        conn.in_list_lane = False
        if conn.lane_slot:
            conn.lane_slot = False
            self.running -= 1
        return self.due()

    def wait_for_slot(self, conn: Any) -> list[Any]:
        """A started quick read the loop could not answer after all (its entry expired, or
        its token no longer passes): it waits at the head for a slot; the reads to start now."""
        conn.lane_quick = False
        self.waiting.appendleft(conn)
        return self.due()

    def due(self) -> list[Any]:
        """Waiting reads whose turn came (a token, and a slot unless quick), in order; reads
        that wait for a slot keep their place."""
        started: list[Any] = []
        if not self.waiting:
            return started  # every turn of the event loop asks
        kept: deque[Any] = deque()
        while self.waiting and self._looking():
            conn = self.waiting.popleft()
            self._quick_waiting -= conn.lane_quick
            conn.lane_quick = conn.lane_quick and bool(self.quick(conn))
            if not self._startable(conn):
                kept.append(conn)
            elif self._take():
                self._start(conn)
                started.append(conn)
            else:
                self.waiting.appendleft(conn)
                self._quick_waiting += conn.lane_quick
                break
        if kept:
            kept.extend(self.waiting)
            self.waiting = kept
        return started

    def next_due_s(self) -> float | None:
        """Seconds until `due` may start a waiting read (None: nothing waits on the pace)."""
        if not self.waiting or self.rate <= 0 or not self._looking():
            return None
        self._refill()
        return max((1.0 - self._tokens) / self.rate, 0.0)

    def release_all(self) -> list[Any]:
        """Every waiting connection, to run at once on a thread (the worker is stopping)."""
        released = list(self.waiting)
        self.waiting.clear()
        self._quick_waiting = 0
        for conn in released:
            conn.lane_quick, conn.lane_slot = False, True
        self.running += len(released)
        return released

    def _looking(self) -> bool:
        """Whether a waiting read may start once a token is there: a slot is free, or a
        quick read waits."""
        return self.running < self.limit or self._quick_waiting > 0

    def _startable(self, conn: Any) -> bool:
        return bool(conn.lane_quick) or self.running < self.limit

    def _start(self, conn: Any) -> None:
        if not conn.lane_quick:
            conn.lane_slot = True
            self.running += 1

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


def _never(_conn: Any) -> bool:
    return False
