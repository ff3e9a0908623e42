"""`wait_s` on GET /api/v1/jobs/{id} and /api/v1/workflows/{id}: the answer is held until the job
(workflow) finishes or `wait_s` passes, woken by the commit that finishes it.

Invariant: a waiting request holds no thread and no pooled connection. Its finish is watched
(taskline.finishing: one LISTEN connection per process) before its state is read, so a finish
committed in between still wakes it. Under the API's gunicorn worker the route then raises
Parked: the worker keeps the connection on its event loop (taskline_producer.http.intake). When
the watch of a job's waiter fires, the worker answers it without running its request again
(taskline_producer.http.woken: every waiter woken together is answered from one read of their
finished jobs); otherwise (a workflow, a job not finished after all, the deadline) it runs the
same request again with the wait over, which reads the state once more and answers. Served
otherwise (Flask's own server, tests), the request's thread waits instead.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flask import Flask, current_app, request

from taskline.finishing import FinishListener, Watch
from taskline.metrics import WAITING_REQUESTS, WAITS_ENDED
from taskline.settings import Settings
from taskline_producer.http import auth, request_metrics
from taskline_producer.schemas.errors import InvalidParameter

EXTENSION = "taskline_waits"
MAX_WAIT_S = 30.0
LIVE_WAIT_S = 5.0
PARKING = "taskline.parking"
"""The environ key of the Parking the API's worker offers a request (absent elsewhere)."""
WAIT_UNTIL = "taskline.wait_until"
"""The environ key set on a request run again after a wake-up: its first deadline
(time.monotonic()); past it, it answers at once."""

Read = Callable[[], tuple[Any, bool]]
"""Reads the current answer and whether its job (workflow) is finished."""


@dataclass(frozen=True)
class Reply:
    """How a woken waiter of one job is answered without its request (taskline_producer.http.woken):
    GET /api/v1/jobs/{id}'s answer once the job is finished, from the same checks."""

    job_id: str
    route: str
    """The route's template and endpoint (the request metrics' label, the scope check)."""
    endpoint: str
    path: str
    token: str | None
    """The bearer token presented, checked again at the answer (None: authentication off)."""
    started: float
    """time.perf_counter() at the request's start (the request metrics' latency)."""


class Parked(BaseException):
    """Raised by a route whose answer waits on the event loop; the worker catches it (it
    passes Flask's error handlers, which would answer it 500)."""

    def __init__(self, watch: Watch, wait_s: float, listener: FinishListener,
                 reply: Reply | None = None) -> None:
        super().__init__()
        self.watch = watch
        self.wait_s = wait_s
        self.listener = listener
        self.reply = reply


class Waits:
    """This process's FinishListener, made on first use (again after a fork)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._listener: FinishListener | None = None
        self._pid = 0

    def listener(self) -> FinishListener:
        with self._lock:
            if self._listener is None or self._pid != os.getpid():
                s = self._settings
                self._listener = FinishListener(s.session_url, s.schema)
                self._pid = os.getpid()
                self._listener.start()
            return self._listener

    def close(self) -> None:
        with self._lock:
            if self._listener is not None and self._pid == os.getpid():
                self._listener.stop()
            self._listener = None


def init_app(app: Flask, settings: Settings) -> None:
    app.extensions[EXTENSION] = Waits(settings)


def close_waits(app: Flask) -> None:
    app.extensions[EXTENSION].close()


def wait_s() -> float | None:
    """The `wait_s` query parameter: seconds in 0..30, None when absent; 422 otherwise."""
    raw = request.args.get("wait_s")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_WAIT_S:  # NaN and infinities fail too
        raise InvalidParameter(f"wait_s must be a number of seconds from 0 to {MAX_WAIT_S:g}",
                               {"parameter": "wait_s"})
    return value


def job_reply(job_id: str) -> Reply:
    """The current request's Reply for job `job_id` (inside GET /api/v1/jobs/{id})."""
    rule = request.url_rule
    assert rule is not None and rule.endpoint is not None
    return Reply(job_id, rule.rule, rule.endpoint, request.path, auth.presented_token(),
                 request_metrics.started())


def answer(ids: Iterable[str], seconds: float | None, read: Read,
           reply: Callable[[], Reply] | None = None, *, watch: Callable[[], None]) -> Any:
    """What `read` answers once the watched ids' job (workflow) is finished, or after
    `seconds`; at once without `seconds` or when it is finished already. A request run again
    after a wake-up that did not finish it (a reconnection of the listener) waits on until its
    first deadline (WAIT_UNTIL). `reply` makes the Reply that answers it once woken without
    running it again (None: it is run again). `watch` has the finish signalled at its commit
    (taskline.store.watching): run once, before the first read, so a finish the read does not
    see yet signals."""
    until = request.environ.get(WAIT_UNTIL)
    if until is not None:
        seconds = until - time.monotonic()
    if not seconds or seconds <= 0:
        return read()[0]
    ids = [str(i) for i in ids]
    listener: FinishListener = current_app.extensions[EXTENSION].listener()
    if until is None and listener.listens:
        watch()  # a request run again flagged its ids on its first run
    # The process's first wait starts its LISTEN; a signal sent before it is live would be
    # missed, so wait for it (not live after this, the wait goes on: its reconnection or its
    # deadline ends it).
    listener.live.wait(LIVE_WAIT_S)
    parking = request.environ.get(PARKING)
    if parking is None:
        return _on_this_thread(listener, ids, time.monotonic() + seconds, read)
    watched = listener.watch(ids, parking.wake)
    view, done = _read_watched(listener, watched, read)
    if done:
        return view
    raise Parked(watched, seconds, listener, None if reply is None else reply())


def _read_watched(listener: FinishListener, watch: Watch, read: Read) -> tuple[Any, bool]:
    """`read()`, the watch forgotten unless the answer waits."""
    try:
        view, done = read()
    except BaseException:
        listener.unwatch(watch)
        raise
    if done:
        listener.unwatch(watch)
    return view, done


def _on_this_thread(listener: FinishListener, ids: list[str], deadline: float,
                    read: Read) -> Any:
    """Without the API's worker (Flask's own server): the request's thread waits."""
    WAITING_REQUESTS.inc()
    try:
        while True:
            woken = threading.Event()
            watch = listener.watch(ids, woken.set)
            view, done = _read_watched(listener, watch, read)
            remaining = deadline - time.monotonic()
            if done or remaining <= 0:
                listener.unwatch(watch)
                return view
            signalled = woken.wait(remaining)
            listener.unwatch(watch)
            WAITS_ENDED.labels("signalled" if signalled else "timeout").inc()
    finally:
        WAITING_REQUESTS.dec()
