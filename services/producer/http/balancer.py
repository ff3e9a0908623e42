"""Least-connections accepting for the API's gunicorn processes: a gthread worker that lets a
sibling holding fewer connections take a new one.

With one SO_REUSEPORT socket per process, the kernel places each connection by a hash, blind to
load: two keep-alive clients share one process in about half the runs, which then serves both
under one GIL while the other idles (docs/performance.md). With one shared socket
instead, every waiting process is woken and the first to call accept() wins, which is no better.
Here the processes share one listening socket and a table in shared memory of how many
connections each holds; a process holding more than the least-loaded live sibling stops
watching the socket for RECHECK_S, so the sibling takes the connection.

Invariant: a connection is never left waiting on a sibling that does not take it. A sibling
counts only while it beats (every turn of its event loop, at least once a second; a stopping
one withdraws its beat at once), and a process declines one pending connection for at most
MAX_YIELD_S before it accepts it anyway, so a stopped or hung sibling delays new connections
by that much at worst and loses none.
"""

from __future__ import annotations

import ctypes
import mmap
import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

# How long a process that declined stays off the socket before it looks again.
RECHECK_S = 0.002
# The longest one pending connection is left to a sibling before this process takes it.
MAX_YIELD_S = 0.05
# A sibling whose event loop has not turned for this long (a loop turns at least once a
# second) is stopped, hung or gone: it is not waited for.
STALE_S = 3.0


class _Slot(ctypes.Structure):
    _fields_ = [("claimed", ctypes.c_int64), ("connections", ctypes.c_int64),
                ("beat", ctypes.c_double)]


class ConnectionTable:
    """Open connections per worker process, in memory the master maps before it forks.

    The master alone claims and frees slots (pre_fork, child_exit: it is single-threaded);
    each worker writes only its own slot, and reads the others' without a lock: a count read
    mid-update is at worst one accept stale, which the next turn corrects.
    """

    def __init__(self, slots: int = 256) -> None:
        header = ctypes.sizeof(ctypes.c_int64)
        self._memory = mmap.mmap(-1, header + ctypes.sizeof(_Slot) * slots)  # shared, anonymous
        # Slots past the highest ever claimed are never read: an accept reads 2, not 256.
        self._used = ctypes.c_int64.from_buffer(self._memory)
        self._slots = (_Slot * slots).from_buffer(self._memory, header)

    def claim(self) -> int:
        """A free slot for a worker about to be forked, zeroed; in the master."""
        for index, slot in enumerate(self._slots):
            if not slot.claimed:
                slot.claimed, slot.connections, slot.beat = 1, 0, 0.0
                self._used.value = max(self._used.value, index + 1)
                return index
        raise RuntimeError(f"more than {len(self._slots)} API worker processes")

    def free(self, index: int) -> None:
        """The slot of a worker that exited; in the master."""
        self._slots[index].claimed = 0

    def publish(self, index: int, connections: int, now: float) -> None:
        """A worker's own count, and that its event loop turns."""
        slot = self._slots[index]
        slot.connections, slot.beat = connections, now

    def fewest_elsewhere(self, index: int, now: float) -> int | None:
        """The fewest connections a live sibling of slot `index` holds; None without one."""
        slots = self._slots
        counts = [slots[i].connections for i in range(self._used.value)
                  if i != index and slots[i].claimed and now - slots[i].beat < STALE_S]
        return min(counts, default=None)


class BalancedThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, accepting only while no live sibling holds fewer connections.

    `connection_table` and `balance_slot` are set by gunicorn.conf.py's hooks; without them
    (a server not started through it) the worker behaves exactly as gthread.
    """

    connection_table: ConnectionTable | None = None
    balance_slot = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume_at = 0.0
        self._yield_started: float | None = None
        self._yield_last = 0.0

    def accept(self, listener: Any) -> None:
        now = time.monotonic()
        if self._should_yield(now):
            self._resume_at = now + RECHECK_S
            self.set_accept_enabled(False)
            return
        self._yield_started = None
        super().accept(listener)
        self._publish(now)

    def set_accept_enabled(self, enabled: bool) -> None:
        # gthread's loop re-enables accepting every turn; a process that yielded waits first.
        if enabled and time.monotonic() < self._resume_at:
            return
        super().set_accept_enabled(enabled)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        now = time.monotonic()
        self._publish(now)
        if not self._accepting and self._resume_at > now:
            timeout = min(timeout, self._resume_at - now)
        super().wait_for_and_dispatch_events(timeout)

    def _publish(self, now: float) -> None:
        # A stopping process accepts no more: its beat is withdrawn so siblings stop yielding.
        if self.connection_table is not None:
            self.connection_table.publish(self.balance_slot, self.nr_conns,
                                          now if self.alive else 0.0)

    def _should_yield(self, now: float) -> bool:
        """Whether to leave the pending connection to a sibling holding fewer connections.

        One pending connection is yielded for at most MAX_YIELD_S: a yield within ten rechecks
        of the last one (a busy process turns late) continues the same wait.
        """
        if self.connection_table is None:
            return False
        fewest = self.connection_table.fewest_elsewhere(self.balance_slot, now)
        if fewest is None or self.nr_conns <= fewest:
            return False
        if self._yield_started is None or now - self._yield_last > 10 * RECHECK_S:
            self._yield_started = now
        self._yield_last = now
        return now - self._yield_started < MAX_YIELD_S


# gunicorn server hooks (gunicorn.conf.py calls them); they run in the master.

def share_table(server: Any) -> None:
    """on_starting: map the table before any worker is forked, so every worker shares it."""
    server.connection_table = ConnectionTable()


def assign_slot(server: Any, worker: Any) -> None:
    """pre_fork: the worker about to be forked gets the table and a slot of its own."""
    worker.connection_table = server.connection_table
    worker.balance_slot = server.connection_table.claim()


def free_slot(server: Any, worker: Any) -> None:
    """child_exit: the slot of a worker that exited is free for its replacement."""
    server.connection_table.free(worker.balance_slot)
