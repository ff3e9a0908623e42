"""Fans the committed job events out to this process's event streams: one tail per process.

Invariant: a stream only ever carries committed events, in job_events id order. One thread per
process (started by the first stream, paused while there is none) reads job_events above its
cursor every `poll_s`; a Sequencer holds back ids after a gap until the gap is filled or can
no longer be (see taskline.events), so nothing is skipped that a running transaction may still
commit. Nothing is added to the write path: producers, workers and maintenance write their
job_events rows as before. PostgreSQL being down only pauses the tail; it resumes from its
cursor, so no event is lost to an outage.

Memory per stream is bounded: each event is serialized once into a frame every stream shares;
a subscription holds at most `queue_limit` frames, and one that falls that far behind is ended
(its client reconnects with Last-Event-ID and replays from job_events), never buffered further.
At most `max_streams` subscriptions exist at once, so streams never hold every request thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskline.errors import StoreUnavailable
from taskline.events import Change, Sequencer
from taskline.metrics import EVENT_STREAM_DROPS, EVENT_STREAMS
from taskline.store.views import ApiStore
from taskline_producer.operations.backends import backends

log = logging.getLogger(__name__)

SLOW = "slow"
SHUTDOWN = "shutdown"

PAGE = 1000  # rows per tail query; a full page is followed by the next one at once
RETRY_MIN_S = 0.5
RETRY_MAX_S = 5.0


@dataclass(frozen=True)
class Frame:
    """One job event as a Server-Sent Events frame; `id` is its job_events id."""

    id: int
    data: bytes

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Frame:
        change = Change.from_row(row)
        return cls(change.id, f"id: {change.id}\nevent: job\ndata: {change.to_json()}\n\n"
                   .encode())


class TooManyStreams(Exception):
    """This process already serves as many event streams as it may."""


class Subscription:
    """The frames one stream has yet to send, at most `limit`; ended for good past that."""

    def __init__(self, limit: int) -> None:
        self._frames: deque[Frame] = deque()
        self._limit = limit
        self._cond = threading.Condition()
        self.ended: str | None = None

    def offer(self, frame: Frame) -> None:
        with self._cond:
            if self.ended is not None:
                return
            if len(self._frames) >= self._limit:
                self._end(SLOW)
                return
            self._frames.append(frame)
            self._cond.notify()

    def end(self, reason: str) -> None:
        with self._cond:
            if self.ended is None:
                self._end(reason)

    def _end(self, reason: str) -> None:
        self._frames.clear()
        self.ended = reason
        EVENT_STREAM_DROPS.labels(reason=reason).inc()
        self._cond.notify_all()

    def take(self, timeout_s: float) -> list[Frame]:
        """Every frame queued, waiting up to `timeout_s` for one; [] on timeout or once ended."""
        with self._cond:
            if not self._frames and self.ended is None:
                self._cond.wait(timeout_s)
            frames = list(self._frames)
            self._frames.clear()
            return frames


class Broadcaster:
    """The tail thread and every subscription of this process."""

    def __init__(self, store: ApiStore, *, queue_limit: int, max_streams: int, poll_s: float,
                 gap_wait_s: float) -> None:
        self._store = store
        self.queue_limit = queue_limit
        self.max_streams = max_streams
        self.poll_s = poll_s
        self.gap_wait_s = gap_wait_s
        self._subs: set[Subscription] = set()
        self._lock = threading.Lock()
        self._live = threading.Event()  # the tail has a cursor: it sees every later commit
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._cursor = 0

    @property
    def cursor(self) -> int:
        """Every event up to this id has been offered to the streams open at the time."""
        return self._cursor

    def subscribe(self) -> Subscription:
        """A new subscription; TooManyStreams when `max_streams` are open already."""
        with self._lock:
            if self._stopping.is_set() or len(self._subs) >= self.max_streams:
                raise TooManyStreams
            sub = Subscription(self.queue_limit)
            self._subs.add(sub)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="taskline-events",
                                                daemon=True)
                self._thread.start()
        self._wake.set()
        EVENT_STREAMS.inc()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub not in self._subs:
                return
            self._subs.discard(sub)
        EVENT_STREAMS.dec()

    def streams(self) -> int:
        with self._lock:
            return len(self._subs)

    def wait_live(self, timeout_s: float) -> bool:
        """True once the tail holds a cursor: every event committed later reaches streams."""
        return self._live.wait(timeout_s)

    def stop(self) -> None:
        """End every stream and the tail thread (process shutdown)."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            subs = tuple(self._subs)
        for sub in subs:
            sub.end(SHUTDOWN)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.poll_s + 1)

    def _run(self) -> None:
        sequencer: Sequencer | None = None
        delay = RETRY_MIN_S
        while not self._stopping.is_set():
            if self._pause():
                sequencer = None  # resumed: start again from the newest event
                continue
            try:
                sequencer = sequencer or self._start()
                more = self._step(sequencer)
            except Exception as err:
                _log_failure(err, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            if not more:
                self._stopping.wait(self.poll_s)

    def _pause(self) -> bool:
        """With no stream open, stop reading until one opens; True when it did pause.

        The check and `live` being cleared happen under the lock subscribe takes, so a stream
        that opened just before keeps the cursor it read, and one that opens after waits for
        the new cursor: no stream can read a cursor the tail then jumps past.
        """
        with self._lock:
            if self._subs or self._stopping.is_set():
                return False
            self._live.clear()
            self._wake.clear()
        self._wake.wait()
        return True

    def _start(self) -> Sequencer:
        sequencer = Sequencer(self._store.last_event_id(), self.gap_wait_s)
        self._cursor = sequencer.cursor
        self._live.set()
        return sequencer

    def _step(self, sequencer: Sequencer) -> bool:
        """Publish what the next page releases; True when more rows may be waiting."""
        rows = self._store.events_after(sequencer.cursor, PAGE)
        released = sequencer.release([r["id"] for r in rows], self._store.transaction_horizon,
                                     time.monotonic())
        for row in rows[:len(released)]:
            self._publish(Frame.from_row(row))
        self._cursor = sequencer.cursor
        return len(rows) == PAGE and len(released) == len(rows)

    def _publish(self, frame: Frame) -> None:
        with self._lock:
            subs = tuple(self._subs)
        for sub in subs:
            sub.offer(frame)


def _log_failure(err: Exception, retry_in_s: float) -> None:
    if isinstance(err, StoreUnavailable):
        log.warning("event tail cannot reach PostgreSQL; retrying",
                    extra={"error": str(err), "retry_in_s": retry_in_s})
    else:
        log.error("event tail failed; retrying", exc_info=err, extra={"retry_in_s": retry_in_s})


def tail_history(**limits: Any) -> Broadcaster:
    """A Broadcaster tailing this process's store (the event stream's one per process)."""
    return Broadcaster(backends().store, **limits)
