"""The Redis step that follows each committed transition, chosen in one place from its move.

Invariant: Redis follows PostgreSQL. A caller commits a transition, then hands the committed
changes to `follow`, which performs each move's `Step` (taskline.transitions): no call site
decides for itself where an id goes next. Changes of one step are sent together (one pipeline
for pushes and acks), in the order given, so FIFO within a priority holds. A failure stops the
rest and surfaces as DispatchUnavailable: what was committed is durable, and reconciliation
puts Redis right.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from taskline.jobs import Status
from taskline.transitions import Committed, Step


class Dispatcher(Protocol):
    """The Redis operations the steps use (taskline.dispatch.dispatcher.Dispatcher has them);
    named here so this module does not import the dispatcher that calls it."""

    def push(self, jobs: Iterable[tuple[str, int, str]]) -> int: ...
    def schedule_many(self, queue: str, entries: Sequence[tuple[str, int]], *,
                      retry: bool = False) -> None: ...
    def promote(self, queue: str, priority: int, ids: Sequence[str]) -> int: ...
    def ack(self, items: Iterable[tuple[str, str]], worker_id: str) -> None: ...
    def retry_later(self, queue: str, worker_id: str, job_id: str, due_ms: int) -> None: ...
    def dead_letter(self, queue: str, worker_id: str, job_id: str) -> None: ...
    def requeue(self, queue: str, priority: int, job_id: str, from_worker: str, *,
                always: bool) -> bool: ...
    def unschedule(self, queue: str, job_id: str) -> None: ...
    def remove_from_dlq(self, queue: str, job_id: str) -> None: ...
    def unschedule_many(self, queue: str, ids: Sequence[str]) -> tuple[int, int]: ...
    def drop_dead(self, queue: str, ids: Sequence[str]) -> int: ...


def follow(dispatcher: Dispatcher, changes: Iterable[Committed]) -> None:
    """Perform the Redis step of every committed change, step by step."""
    by_step: dict[Step, list[Committed]] = defaultdict(list)
    for change in changes:
        by_step[change.move.step].append(change)
    for step, items in by_step.items():
        _STEPS[step](dispatcher, items)


def _push(d: Dispatcher, items: Sequence[Committed]) -> None:
    d.push([(c.queue, c.priority, c.job_id) for c in items])


def _schedule(d: Dispatcher, items: Sequence[Committed]) -> None:
    for queue, group in _grouped(items, lambda c: c.queue).items():
        d.schedule_many(queue, [(c.job_id, _due(c)) for c in group])


def _promote(d: Dispatcher, items: Sequence[Committed]) -> None:
    for (queue, priority), group in _grouped(items, lambda c: (c.queue, c.priority)).items():
        d.promote(queue, priority, [c.job_id for c in group])


def _ack(d: Dispatcher, items: Sequence[Committed]) -> None:
    for worker_id, group in _grouped(items, _worker).items():
        d.ack([(c.queue, c.job_id) for c in group], worker_id)


def _retry_later(d: Dispatcher, items: Sequence[Committed]) -> None:
    for c in items:
        d.retry_later(c.queue, _worker(c), c.job_id, _due(c))


def _dead_letter(d: Dispatcher, items: Sequence[Committed]) -> None:
    for c in items:
        d.dead_letter(c.queue, _worker(c), c.job_id)


def _requeue(d: Dispatcher, items: Sequence[Committed]) -> None:
    # PostgreSQL says queued: pushed even when the id is missing from the processing list.
    for c in items:
        d.requeue(c.queue, c.priority, c.job_id, _worker(c), always=True)


def _unschedule(d: Dispatcher, items: Sequence[Committed]) -> None:
    # Ready-list copies of a cancelled job are refused at claim and acked away there.
    for c in items:
        d.unschedule(c.queue, c.job_id)


def _undead(d: Dispatcher, items: Sequence[Committed]) -> None:
    for c in items:
        d.remove_from_dlq(c.queue, c.job_id)
    _push(d, items)


def _forget(d: Dispatcher, items: Sequence[Committed]) -> None:
    # A deleted job's id leaves the DLQ list (if it was dead) and the retry and scheduled sets
    # (leftovers of a crash between a commit and its Redis step). Ready-list copies of a job
    # cancelled while pending are refused at claim, as they are while the row exists.
    for queue, group in _grouped(items, lambda c: c.queue).items():
        d.unschedule_many(queue, [c.job_id for c in group])
        d.drop_dead(queue, [c.job_id for c in group if c.left is Status.DEAD])


def _nothing(_d: Dispatcher, _items: Sequence[Committed]) -> None:
    return None


_STEPS: dict[Step, Callable[[Dispatcher, Sequence[Committed]], None]] = {
    Step.NONE: _nothing, Step.PUSH: _push, Step.SCHEDULE: _schedule, Step.PROMOTE: _promote,
    Step.ACK: _ack, Step.RETRY_LATER: _retry_later, Step.DEAD_LETTER: _dead_letter,
    Step.REQUEUE: _requeue, Step.UNSCHEDULE: _unschedule, Step.UNDEAD: _undead,
    Step.FORGET: _forget,
}


def _grouped(items: Iterable[Committed], key: Callable[[Committed], object]) -> dict:
    groups: dict[object, list[Committed]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return groups


def _worker(change: Committed) -> str:
    if change.worker_id is None:
        raise ValueError(f"{change.move.name} of {change.job_id} names no worker")
    return change.worker_id


def _due(change: Committed) -> int:
    if change.due_ms is None:
        raise ValueError(f"{change.move.name} of {change.job_id} has no due time")
    return change.due_ms
