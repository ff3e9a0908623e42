"""Blocking waits on several queues' signals where one BLPOP cannot span them (Redis Cluster:
each queue's keys live in the slot of its own hash tag).

Invariant: a signal taken is never lost to the worker that took it. One BLPOP per queue runs
in a thread of its own while the worker waits; the first to take a signal ends the wait. The
others are left running: a signal one of them takes after the wait ended ends the next wait at
once, and a queue whose BLPOP is still running gets no second one, so a worker holds at most
one blocked connection per queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for

MAX_THREADS = 64
"""Queues waited on at once by one worker; more queues wait in turn for a free thread."""
MIN_BLOCK_S = 0.01
"""The shortest block a BLPOP is sent with, seconds."""
MARGIN_S = 1.0
"""How much longer than its block a wait gives its BLPOPs to answer (their socket timeout
ends one that never does)."""


class QueueWaits:
    """One worker's waits: `wait(keys, timeout)` returns once a key's signal was taken (True)
    or every BLPOP still owed an answer timed out (False)."""

    def __init__(self, blpop: Callable[[str, float], object]) -> None:
        self._blpop = blpop
        self._lock = threading.Lock()
        self._pending: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="taskline-wait")

    def wait(self, keys: Sequence[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._collect():
                    return True  # also a signal taken after the last wait ended
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for key in keys:
                    if key not in self._pending:
                        # Never 0: BLPOP would block for ever.
                        self._pending[key] = self._pool.submit(self._blpop, key,
                                                               max(left, MIN_BLOCK_S))
                running = list(self._pending.values())
            # A BLPOP of an earlier, shorter wait may end first: then wait on for the rest.
            wait_for(running, timeout=left + MARGIN_S, return_when=FIRST_COMPLETED)

    def _collect(self) -> bool:
        """Forget the finished BLPOPs; whether one took a signal. A failed one raises its
        error (the caller counts Redis unavailable), after every finished one is forgotten."""
        woken, failure = False, None
        for key, future in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[key]
            if future.exception() is not None:
                failure = future.exception()
            elif future.result() is not None:
                woken = True
        if failure is not None and not woken:
            raise failure
        return woken

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
