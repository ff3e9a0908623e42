"""Group commit of concurrent single enqueues: the requests that arrive while one write is in
flight are written together, by one statement, when it returns.

Invariant: every request's answer waits for the write that holds its item to finish (its
commit, for the enqueuer), and a write fails only the requests whose items it held. A request
alone is written at once, as before: grouping only ever takes what is already waiting, it never
waits for more.

The request that finds no write in flight leads: it writes everything waiting (itself
included) and hands the results out. Those arriving meanwhile wait; when the write returns,
the first of them leads the next write with all that came. A single PostgreSQL statement per
job costs about 17 times the CPU of one row in a multi-row statement (docs/performance.md),
so under concurrency this turns n statements, commits and pushes into one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Slot(Generic[Item, Result]):
    """One request's item, then its result or error; `ready` is set when either is known or
    when this request is to lead the next write."""

    __slots__ = ("error", "item", "lead", "ready", "result")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.result: Result | None = None
        # Replaced by the result or the write's error; left only if the leading thread itself
        # was interrupted, so no request ever takes a missing result for a written one.
        self.error: BaseException | None = RuntimeError("the group write was interrupted")
        self.lead = False
        self.ready = threading.Event()


class GroupWriter(Generic[Item, Result]):
    """Runs `write(items) -> results` (one result per item, in order) over the items of the
    requests waiting together.

    An error of a type in `item_errors` (a statement refusing what it was given) may come from
    one item alone: a group of several is then written again item by item, so only an item
    that cannot be written fails its request. Any other error (an outage) fails the whole
    group. `sizes(n)` is told the size of every write (a metric).
    """

    def __init__(self, write: Callable[[Sequence[Item]], Sequence[Result]],
                 item_errors: tuple[type[BaseException], ...] = (),
                 sizes: Callable[[int], None] = lambda n: None) -> None:
        self._write = write
        self._item_errors = item_errors
        self._sizes = sizes
        self._lock = threading.Lock()
        self._waiting: list[_Slot[Item, Result]] = []
        self._busy = False

    @property
    def waiting(self) -> int:
        """Requests waiting for the next write (the one in flight not counted)."""
        with self._lock:
            return len(self._waiting)

    def submit(self, item: Item) -> Result:
        """Write `item` with whatever else is waiting; its result, or its write's error."""
        slot: _Slot[Item, Result] = _Slot(item)
        with self._lock:
            self._waiting.append(slot)
            slot.lead = not self._busy
            self._busy = True
        if not slot.lead:
            slot.ready.wait()
        if slot.lead:
            self._lead()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _lead(self) -> None:
        """Write all that waits, hand out the results, then pass the lead on or stand down."""
        with self._lock:
            group, self._waiting = self._waiting, []
        try:
            self._run(group)
        finally:
            with self._lock:
                successor = self._waiting[0] if self._waiting else None
                self._busy = successor is not None
            if successor is not None:
                successor.lead = True
                successor.ready.set()

    def _run(self, group: list[_Slot[Item, Result]]) -> None:
        try:
            self._fill(group)
        finally:
            for slot in group:
                if not slot.lead:
                    slot.ready.set()

    def _fill(self, group: list[_Slot[Item, Result]]) -> None:
        self._sizes(len(group))
        try:
            results = self._write([slot.item for slot in group])
        except Exception as err:
            if len(group) > 1 and isinstance(err, self._item_errors):
                for slot in group:
                    self._fill([slot])
                return
            for slot in group:
                slot.error = err
        else:
            for slot, result in zip(group, results, strict=True):
                slot.result, slot.error = result, None
