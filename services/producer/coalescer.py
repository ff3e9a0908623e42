"""Group commit for single enqueues: the concurrent requests of one API process share a
transaction, so N requests cost one commit (one WAL flush) instead of N.

Invariant: every request gets the answer it would have got alone. One committer thread per
process takes every request waiting when it is free (natural batching: a request that finds it
idle is written at once, so a lone client waits for no window), writes them in one transaction
with `Enqueuer.commit`, and only after that commit hands the new jobs to Redis
(`Enqueuer.publish`); each request thread waits for its own result. If the group's transaction
fails with anything but StoreUnavailable, PostgreSQL rolled all of it back, so each request is
written again alone and one request's idempotency conflict never fails another. StoreUnavailable
may mean the commit's fate is unknown, so it is handed to every request of the group and none is
written again: nothing is ever inserted twice by this module.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

from taskline.errors import StoreUnavailable
from taskline_producer.jobspec import JobSpec

log = logging.getLogger(__name__)

MAX_GROUP = 64
"""Most requests written in one transaction."""
IDLE_EXIT_S = 30.0
"""The committer thread ends after this long without a request; the next one starts it again."""

Item = tuple[JobSpec, str | None]


class _Request:
    """One waiting request: its job spec, and later its answer or its error."""

    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None

    def finish(self, result: object = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class Coalescer:
    """Writes concurrent single enqueues in shared transactions, each caller getting its own
    answer. `commit(items)` writes items in one transaction and returns one answer each;
    `publish(answers)` makes the committed jobs dispatchable; `alone(item)` does both for
    one item in its own transaction."""

    def __init__(self, commit: Callable[[Sequence[Item]], list], publish: Callable[[list], object],
                 alone: Callable[[Item], object], max_group: int = MAX_GROUP) -> None:
        self._commit, self._publish, self._alone = commit, publish, alone
        self._max_group = max_group
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, item: Item) -> object:
        """Write one item (with whatever else is waiting) and return its answer, or raise the
        error it would have raised alone."""
        request = _Request(item)
        with self._lock:
            self._queue.put(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="enqueue-group",
                                                daemon=True)
                self._thread.start()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    # Requests are put under this lock, so none can slip in after the check.
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            group = [first]
            while len(group) < self._max_group:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write(group)

    def _write(self, group: list[_Request]) -> None:
        """Answer every request of `group`; never raises, so the committer thread lives on."""
        try:
            answers = self._commit([r.item for r in group])
        except StoreUnavailable as err:
            for request in group:
                request.finish(error=StoreUnavailable(str(err)))
            return
        except Exception as err:
            self._write_alone(group, err)
            return
        try:
            self._publish(answers)
        except Exception:
            # The jobs are committed; reconciliation makes them dispatchable.
            log.exception("enqueue group committed but not published", extra={"action": "enqueue"})
        for request, answer in zip(group, answers, strict=True):
            request.finish(answer)

    def _write_alone(self, group: list[_Request], err: Exception) -> None:
        """The group was rolled back: each request gets its own transaction (a lone request
        gets its own error back at once)."""
        if len(group) == 1:
            group[0].finish(error=err)
            return
        log.info("enqueue group of %d failed (%s); writing each request alone", len(group),
                 type(err).__name__, extra={"action": "enqueue"})
        for request in group:
            try:
                request.finish(self._alone(request.item))
            except Exception as alone_err:
                request.finish(error=alone_err)
