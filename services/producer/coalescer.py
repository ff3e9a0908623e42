"""Group commit for single enqueues: the concurrent requests of one API process share a
transaction, so N requests cost one commit (one WAL flush) instead of N.

Invariant: every request gets the answer it would have got alone. At most one group per process
is being written at a time, by one request's own thread (the leader): a request that finds no
group in flight leads at once, so a lone client waits for no window and no thread hand-off;
requests arriving meanwhile wait, and when the leader is done the first of them leads the next
group with all of them (natural batching). A leader writes its group in one transaction with
`Enqueuer.commit`, and only after that commit hands the new jobs to Redis (`Enqueuer.publish`);
each request waits for its own answer. If the group's transaction
fails with anything but StoreUnavailable, PostgreSQL rolled all of it back, so each request is
written again alone and one request's idempotency conflict never fails another. StoreUnavailable
may mean the commit's fate is unknown, so it is handed to every request of the group and none is
written again: nothing is ever inserted twice by this module.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from taskline.errors import StoreUnavailable
from taskline_producer.jobspec import JobSpec

log = logging.getLogger(__name__)

MAX_GROUP = 64
"""Most requests written in one transaction."""

Item = tuple[JobSpec, str | None]


class _Request:
    """One waiting request: its job spec, and later its answer or its error."""

    __slots__ = ("done", "error", "item", "result", "wake")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.wake = threading.Event()  # set when answered, or when it is to lead a group
        self.done = False
        self.result: object = None
        self.error: BaseException | None = None

    def finish(self, result: object = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True
        self.wake.set()


class Coalescer:
    """Writes concurrent single enqueues in shared transactions, each caller getting its own
    answer. `commit(items)` writes items in one transaction and returns one answer each;
    `publish(answers)` makes the committed jobs dispatchable; `alone(item)` does both for
    one item in its own transaction."""

    def __init__(self, commit: Callable[[Sequence[Item]], list], publish: Callable[[list], object],
                 alone: Callable[[Item], object], max_group: int = MAX_GROUP) -> None:
        self._commit, self._publish, self._alone = commit, publish, alone
        self._max_group = max_group
        self._lock = threading.Lock()
        self._pending: list[_Request] = []
        self._busy = False  # a leader is writing; pending is never non-empty without one

    def submit(self, item: Item) -> object:
        """Write one item (with whatever else is waiting) and return its answer, or raise the
        error it would have raised alone."""
        request = _Request(item)
        with self._lock:
            self._pending.append(request)
            lead, self._busy = not self._busy, True
        if lead:
            self._lead()
        while not request.done:
            request.wake.wait()
            if not request.done:  # handed the lead: its own request heads the pending list
                request.wake.clear()
                self._lead()
        if request.error is not None:
            raise request.error
        return request.result

    def _lead(self) -> None:
        """Write one group (this thread's own request first), then pass the lead on."""
        with self._lock:
            group = self._pending[:self._max_group]
            del self._pending[:self._max_group]
        try:
            self._write(group)
        finally:
            for request in group:
                if not request.done:  # only if _write itself was interrupted
                    request.finish(error=RuntimeError("enqueue group interrupted"))
            with self._lock:
                if self._pending:
                    self._pending[0].wake.set()
                else:
                    self._busy = False

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
