"""Fans the committed job events out to this process's event streams: one LISTEN per process.

Invariant: memory per stream is bounded. Each event is serialized once into a frame that every
stream shares; a subscription holds at most `queue_limit` frames, and one that falls that far
behind is ended (its client reconnects with Last-Event-ID and replays from job_events), never
buffered further. While the LISTEN connection is down every subscription is ended, because
its stream would otherwise miss events silently. At most `max_streams` subscriptions exist at
once in a process, so streams can never occupy every request thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from taskline.errors import StoreUnavailable
from taskline.events import Change
from taskline.metrics import EVENT_STREAM_DROPS, EVENT_STREAMS
from taskline.store.listener import Listener

log = logging.getLogger(__name__)

SLOW = "slow"
LISTENER_LOST = "listener_lost"
SHUTDOWN = "shutdown"

POLL_S = 0.25  # how often the listener thread looks up from LISTEN to see whether to stop
RECONNECT_MIN_S = 0.5
RECONNECT_MAX_S = 5.0


@dataclass(frozen=True)
class Frame:
    """One job event as a Server-Sent Events frame; `id` is its job_events id."""

    id: int
    data: bytes

    @classmethod
    def from_payload(cls, payload: str) -> Frame:
        """The frame of a trigger payload; ValueError when the payload is not one."""
        change = Change.from_payload(payload)
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

    def pending(self) -> int:
        with self._cond:
            return len(self._frames)


class Broadcaster:
    """One listener thread (started by the first subscription) feeding every subscription."""

    def __init__(self, listener: Listener, *, queue_limit: int, max_streams: int) -> None:
        self._listener = listener
        self.queue_limit = queue_limit
        self.max_streams = max_streams
        self._subs: set[Subscription] = set()
        self._lock = threading.Lock()
        self._live = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

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
        """True once LISTEN is in place: every event committed from then on reaches streams."""
        return self._live.wait(timeout_s)

    def stop(self) -> None:
        """End every stream and the listener thread (process shutdown)."""
        self._stopping.set()
        self._end_all(SHUTDOWN)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(POLL_S * 3)

    def _end_all(self, reason: str) -> None:
        with self._lock:
            subs = tuple(self._subs)
        for sub in subs:
            sub.end(reason)

    def _run(self) -> None:
        delay = RECONNECT_MIN_S
        while not self._stopping.is_set():
            if self._listen():
                delay = RECONNECT_MIN_S
            self._stopping.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)
        self._listener.close()

    def _listen(self) -> bool:
        """LISTEN and publish until the connection fails; True if it was up at all."""
        try:
            self._listener.open()
            self._live.set()
            while not self._stopping.is_set():
                for payload in self._listener.payloads(POLL_S):
                    self._publish(payload)
        except StoreUnavailable as err:
            log.warning("event listener cannot reach PostgreSQL; reconnecting",
                        extra={"error": str(err)})
        except Exception:
            log.error("event listener failed; reconnecting", exc_info=True)
        finally:
            self._listener.close()
        was_live = self._live.is_set()
        self._live.clear()
        if was_live:  # events committed from now until LISTEN again would be missed silently
            self._end_all(SHUTDOWN if self._stopping.is_set() else LISTENER_LOST)
        return was_live

    def _publish(self, payload: str) -> None:
        try:
            frame = Frame.from_payload(payload)
        except ValueError:
            log.warning("ignored a malformed event payload", extra={"payload": payload[:200]})
            return
        with self._lock:
            subs = tuple(self._subs)
        for sub in subs:
            sub.offer(frame)
