"""The event stream: `GET /api/v1/events`, every committed job state change as Server-Sent Events.

Invariant: a stream carries only committed changes, in job_events id order, each frame's `id`
its job_events id (see broadcaster). A client that reconnects with `Last-Event-ID` first gets
what it missed (the newest `replay_limit` events above that id, up to the tail's cursor) and
then the live changes (above it), without a hole or a repeat: a change both replayed and
tailed is sent once. An idle stream gets a comment every `heartbeat_s`, and a stream whose
client closed its connection ends within `gone_check_s` (not at its next write). A
process serves at most `max_streams` streams (503 beyond), and each stream holds at most
`queue_limit` unsent frames before it is ended.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request

from taskline_producer.operations import reads
from taskline_producer.operations.broadcaster import (
    Broadcaster,
    Frame,
    Subscription,
    TooManyStreams,
    tail_history,
)
from taskline_producer.schemas.errors import ApiError, InvalidParameter

bp = Blueprint("events", __name__, url_prefix="/api/v1")

EXTENSION = "taskline_events"
RETRY_AFTER_S = 5
_ID = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class StreamLimits:
    """How streams behave; every field is per process."""

    heartbeat_s: float = 15.0
    """Seconds of silence after which a stream sends a `: heartbeat` comment."""
    queue_limit: int = 2000
    """Unsent frames a stream may hold; one more and the stream is ended (slow client)."""
    max_streams: int = 8
    """Open streams; more get 503. Under gunicorn: half the threads (gunicorn.conf.py)."""
    replay_limit: int = 1000
    """Most events replayed to a reconnecting client; older ones are announced as a gap."""
    retry_ms: int = 2000
    """The reconnection delay the stream asks EventSource to use."""
    live_wait_s: float = 5.0
    """How long a new stream waits for this process's tail to start before a 503."""
    poll_s: float = 0.25
    """Seconds between two reads of job_events by the tail (while any stream is open)."""
    gap_wait_s: float = 5.0
    """Longest an id missing from job_events holds back the ids after it (see events.Sequencer)."""
    gone_check_s: float = 1.0
    """Seconds between two looks, on a quiet stream, at whether its client closed the connection."""


class StreamsBusy(ApiError):
    """This API process serves as many event streams as it may; retry later."""

    status = 503
    code = "too_many_streams"


class EventsUnavailable(ApiError):
    """The event stream cannot read PostgreSQL right now; retry later."""

    status = 503
    code = "store_unavailable"


class _Streams:
    """The limits and this process's Broadcaster, built on first use (again after a fork)."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._broadcaster: Broadcaster | None = None
        self._pid = 0

    def broadcaster(self) -> Broadcaster:
        with self._lock:
            if self._broadcaster is None or self._pid != os.getpid():
                limits = self.limits
                self._broadcaster = tail_history(
                    queue_limit=limits.queue_limit,
                    max_streams=limits.max_streams, poll_s=limits.poll_s,
                    gap_wait_s=limits.gap_wait_s)
                self._pid = os.getpid()
            return self._broadcaster

    def current(self) -> Broadcaster | None:
        with self._lock:
            return self._broadcaster if self._pid == os.getpid() else None

    def stop(self) -> None:
        """End every stream; the stopped broadcaster stays, so later streams get a 503."""
        broadcaster = self.current()
        if broadcaster is not None:
            broadcaster.stop()


def init_app(app: Flask, limits: StreamLimits | None = None) -> None:
    """Register the stream route's state; tests pass shorter limits."""
    app.extensions[EXTENSION] = _Streams(limits or StreamLimits())


def set_limits(app: Flask, **changes: Any) -> None:
    """Change the limits before the first stream of this process opens."""
    streams: _Streams = app.extensions[EXTENSION]
    streams.limits = replace(streams.limits, **changes)


def close_streams(app: Flask) -> None:
    """End every stream of this process and stop its tail (shutdown)."""
    app.extensions[EXTENSION].stop()


def adopt_gunicorn_worker(app: Flask, threads: int) -> None:
    """Under gunicorn: streams take at most half the threads and end when the worker stops.

    Called from gunicorn's post_worker_init, after the worker installed its signal handlers.
    Without the SIGTERM hook a graceful stop would wait graceful_timeout for browsers that
    never hang up; ending the streams lets EventSource reconnect to a live process at once.
    """
    set_limits(app, max_streams=max(1, threads // 2))
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):  # not gunicorn's handler: leave SIGTERM's behaviour alone
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        # Locks are taken off the signal handler, in a thread of its own.
        threading.Thread(target=close_streams, args=(app,), daemon=True).start()
        previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def last_event_id() -> int | None:
    """The id a reconnecting client saw last: the Last-Event-ID header or `last_event_id`."""
    # An empty header is no header: it must not hide an invalid `last_event_id`.
    raw = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
    if not raw:
        return None
    if not _ID.fullmatch(raw):
        raise InvalidParameter("Last-Event-ID must be an event id (a non-negative integer)",
                               {"parameter": "last_event_id"})
    return int(raw)


@bp.get("/events")
def stream() -> Response:
    streams: _Streams = current_app.extensions[EXTENSION]
    limits = streams.limits
    after = last_event_id()
    broadcaster = streams.broadcaster()
    try:
        sub = broadcaster.subscribe()
    except TooManyStreams:
        raise StreamsBusy(headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    try:
        if not broadcaster.wait_live(limits.live_wait_s):
            raise EventsUnavailable(headers={"Retry-After": str(RETRY_AFTER_S)})
        replay, skipped = _replay(after, broadcaster.cursor, limits.replay_limit)
    except BaseException:
        broadcaster.unsubscribe(sub)
        raise
    body = EventStream(broadcaster, sub, replay, skipped, limits,
                       request.environ.get("gunicorn.socket"))
    return Response(body, mimetype="text/event-stream", headers={
        "Cache-Control": "no-cache, no-store", "X-Accel-Buffering": "no"})


def _replay(after: int | None, upto: int, limit: int) -> tuple[list[Frame], bool]:
    """The frames in (after, upto], at most `limit` (the newest), and whether more were cut.

    `upto` is the tail's cursor read after subscribing: what lies above it the tail sends, in
    order; what lies at or below it is committed (or never will be), so this read is complete.
    """
    if after is None:
        return [], False
    rows = reads.newest_events_after(after, upto, limit + 1)
    skipped = len(rows) > limit
    return [Frame.from_row(row) for row in rows[-limit:]], skipped


class EventStream:
    """One response body: preamble, replay, then live frames or heartbeats until ended."""

    def __init__(self, broadcaster: Broadcaster, sub: Subscription, replay: list[Frame],
                 skipped: bool, limits: StreamLimits, client: socket.socket | None = None) -> None:
        self._broadcaster = broadcaster
        self._client = client
        self._sub = sub
        self._replay = replay
        self._skipped = skipped
        self._limits = limits

    def __iter__(self) -> Iterator[bytes]:
        yield f"retry: {self._limits.retry_ms}\n: connected\n\n".encode()
        if self._skipped:
            yield _control("gap", {"replayed": len(self._replay)})
        if self._replay:
            yield b"".join(frame.data for frame in self._replay)
        replayed = {frame.id for frame in self._replay}
        yield from self._live(replayed)

    def _live(self, replayed: set[int]) -> Iterator[bytes]:
        """Live frames; a heartbeat after `heartbeat_s` of silence; the end when the client
        is gone (looked at every `gone_check_s`) or the subscription was ended."""
        limits = self._limits
        quiet_since = time.monotonic()
        while True:
            frames = self._sub.take(min(limits.gone_check_s, limits.heartbeat_s))
            if frames:
                data = b"".join(f.data for f in frames if f.id not in replayed)
                if data:
                    quiet_since = time.monotonic()
                    yield data
            elif self._sub.ended is not None:
                yield _control("dropped", {"reason": self._sub.ended})
                return
            elif client_gone(self._client):
                return
            elif time.monotonic() - quiet_since >= limits.heartbeat_s:
                quiet_since = time.monotonic()
                yield b": heartbeat\n\n"

    def close(self) -> None:
        """Called by the WSGI server when the response ends, whether or not it was read."""
        self._broadcaster.unsubscribe(self._sub)


def client_gone(client: socket.socket | None) -> bool:
    """Whether the client closed its side of `client` (None: cannot tell, so no)."""
    if client is None:
        return False
    # poll, not recv(MSG_DONTWAIT): a socket with a timeout waits for data before any recv.
    watch = select.poll()
    watch.register(client, select.POLLIN)
    if not watch.poll(0):
        return False  # nothing to read: still there
    try:
        return client.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _control(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
