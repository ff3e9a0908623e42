"""The API's gunicorn worker: requests are read on the event loop, with deadlines, and only a
whole request is handed to a thread.

gthread reads a request's head and body inside a pool thread, with no deadline: a few dozen
clients that send half a request and stay silent hold every thread, and nothing is answered.
Here the event loop reads every connection without blocking (taskline_producer.http.framing says
where a request ends), so a silent or slow connection costs a file descriptor and a buffer,
never a thread.

Invariant: a thread only ever parses bytes already received, so it never waits on a client to send;
a connection whose head does not arrive within `http_header_timeout_s`, or whose body does not
arrive within `http_body_timeout_s` after its head, is answered 408 and closed; a request the
framing refuses is answered (400, 431, 501) and closed; an answer to a request whose body was not
read in full says `Connection: close` (taskline_producer.schemas.errors.CLOSE_CONNECTION lets the
application ask for the same); a closing connection is drained on the event loop for at most
LINGER_S, so the client reads its answer before the close and no thread waits.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn.http import errors as http_errors
from gunicorn.http import wsgi

from taskline.metrics import WAITING_REQUESTS, WAITS_ENDED, WOKEN_ANSWERS
from taskline.settings import Settings
from taskline_producer.http import listcache, request_metrics, woken
from taskline_producer.http.balancer import BalancedThreadWorker
from taskline_producer.http.framing import Framed, Refused, RequestFramer
from taskline_producer.http.lanes import ListLane, is_list_read, lane_threads
from taskline_producer.http.waiting import PARKING, WAIT_UNTIL, Parked, Reply
from taskline_producer.schemas.errors import CLOSE_CONNECTION, error_bytes

log = logging.getLogger(__name__)

# How long a closing connection is drained so the client reads its answer before the close.
LINGER_S = 2.0
_RECV = 65536
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# gunicorn's own parse errors, answered in the error shape (the rest are 400 invalid_framing).
_GUNICORN_ERRORS: tuple[tuple[type[Exception], int, str], ...] = (
    (http_errors.LimitRequestLine, 414, "uri_too_long"),
    (http_errors.LimitRequestHeaders, 431, "headers_too_large"),
    (http_errors.UnsupportedTransferCoding, 501, "not_implemented"),
    (http_errors.ExpectationFailed, 417, "expectation_failed"),
)


@dataclass
class _Reading:
    """A connection the event loop reads; `phase` is idle, head, body or closing."""

    framer: RequestFramer
    phase: str
    deadline: float
    continued: bool = False


class IntakeWorker(BalancedThreadWorker):
    """gunicorn's gthread worker (balanced, taskline_producer.http.balancer) reading on its loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = getattr(self.app, "settings", None) or Settings()
        self.header_s = settings.http_header_timeout_s
        self.body_s = settings.http_body_timeout_s
        self.body_limit = settings.max_payload_bytes
        # TLS is read by the ssl module in a thread: such a server keeps gthread's reading.
        self.intake = not self.cfg.is_ssl
        self._reading: dict[Any, _Reading] = {}
        self._deadlines: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self._lane = ListLane(settings.api_list_threads, settings.api_list_rate,
                              quick=self._answerable)
        self._lane_threads = lane_threads(settings.api_list_threads, settings.api_list_nice)
        self._parked: dict[Any, tuple[Parked, float]] = {}
        """Connections whose answer waits for a job to finish (taskline_producer.http.waiting),
        with its deadline: on the event loop, holding no thread."""
        self._woken: list[Any] = []
        """Waiting connections woken (by the finish listener's thread) since the loop looked."""
        self._woken_lock = threading.Lock()
        self._burst: list[tuple[Any, Reply, float]] = []
        """Woken waiters the next burst answers (taskline_producer.http.woken), one at a time."""
        self._bursting = False
        self._flask: Any = None
        self._list_cache: listcache.ListCache | None = None
        self._serving = threading.local()

    def run(self) -> None:
        # After post_worker_init, which needs the Flask app itself as worker.wsgi.
        self._flask = self.wsgi
        self._list_cache = listcache.of(self._flask)
        self.wsgi = closing_when_asked(offering_parking(self.wsgi, self))
        try:
            super().run()
        finally:
            self._lane_threads.shutdown(wait=False)

    # --- the event loop side -------------------------------------------------------------

    def enqueue_req(self, conn: Any) -> None:
        """A new connection, or one with a whole request read, goes where it is due."""
        if not self.intake or getattr(conn, "framed", None) is not None:
            super().enqueue_req(conn)
        else:
            self._read(conn, b"", new=True)

    def _read(self, conn: Any, pending: bytes, new: bool = False) -> None:
        """Watch `conn` for its next request; `pending` is what was read of it already."""
        conn.framed = None
        conn.sock.setblocking(False)
        framer = RequestFramer(self.body_limit)
        now = time.monotonic()
        idle = not new and not pending
        state = _Reading(framer, "idle" if idle else "head",
                         now + (self.cfg.keepalive if idle else self.header_s))
        self._watch(conn, state)
        if pending:
            self._progress(conn, state, framer.feed(pending))

    def _watch(self, conn: Any, state: _Reading) -> None:
        if conn in self._reading:
            self.poller.unregister(conn.sock)
        self._reading[conn] = state
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
        heapq.heappush(self._deadlines, (state.deadline, next(self._seq), conn))

    def _unwatch(self, conn: Any) -> None:
        if self._reading.pop(conn, None) is not None:
            self.poller.unregister(conn.sock)

    def _on_readable(self, conn: Any, _sock: Any) -> None:
        state = self._reading[conn]
        try:
            data = conn.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data and state.phase != "closing":
            self._progress(conn, state, state.framer.feed(data))
        elif not data:
            # The client closed its side: a request it left half sent (a body shorter than its
            # Content-Length) is answered before the close; nothing is handed on.
            outcome = state.framer.close() if state.phase != "closing" else None
            if isinstance(outcome, Refused):
                _send(conn.sock, error_bytes(outcome.status, outcome.code, outcome.message))
            self._drop(conn)

    def _progress(self, conn: Any, state: _Reading, outcome: Framed | Refused | None) -> None:
        if isinstance(outcome, Framed):
            self._unwatch(conn)
            conn.framed = outcome
            if not is_list_read(outcome.message):
                super().enqueue_req(conn)
            elif self._lane.admit(conn):
                self._list(conn)
        elif isinstance(outcome, Refused):
            self._answer_and_close(conn, outcome.status, outcome.code, outcome.message)
        else:
            self._advance_phase(conn, state)

    def _advance_phase(self, conn: Any, state: _Reading) -> None:
        """Start the head deadline at a kept-alive request's first byte, the body one at its
        head's end; a client waiting for 100 Continue gets it once its head is read."""
        framer = state.framer
        if state.phase == "idle" and framer.started:
            self._set_deadline(conn, state, "head", self.header_s)
        if state.phase == "head" and framer.head_done:
            self._set_deadline(conn, state, "body", self.body_s)
        if framer.expects_continue and not state.continued:
            state.continued = True
            _send(conn.sock, _CONTINUE)

    def _list(self, conn: Any) -> None:
        """Start `conn`'s admitted list read: answered here when it repeats one the list cache
        holds (taskline_producer.http.listcache), handing its lane turn on at once, else run
        on the lane's threads (as gthread's enqueue_req)."""
        todo = [conn]
        while todo:
            conn = todo.pop(0)
            answer = self._cached_answer(conn)
            if answer is not None:
                todo += self._lane.done(conn)
                self._answer_on_loop(conn, answer)
            elif not conn.lane_slot:
                todo += self._lane.wait_for_slot(conn)
            else:
                fs = self._lane_threads.submit(self.handle, conn)
                fs.add_done_callback(
                    lambda f, c=conn: self.method_queue.defer(self.finish_request, c, f))

    def _loop_cache(self, conn: Any) -> listcache.ListCache | None:
        """The list cache, when the loop may answer `conn`'s request from it at all."""
        if not self.alive or not conn.framed.complete:
            return None
        return self._list_cache

    def _answerable(self, conn: Any) -> bool:
        """Whether the list cache holds an answer the loop may give `conn` now."""
        cache = self._loop_cache(conn)
        return cache is not None and cache.answerable(conn.framed.message)

    def _cached_answer(self, conn: Any) -> bytes | None:
        """The list cache's answer to `conn`'s request, if the loop may give it."""
        cache = self._loop_cache(conn)
        return None if cache is None else cache.answer_on_loop(self._flask, conn.framed.message)

    def _answer_on_loop(self, conn: Any, answer: bytes) -> None:
        """Write `answer` without a thread; a client whose buffer is full gets the rest from
        a thread, with the body deadline."""
        started = time.perf_counter()
        try:
            sent = conn.sock.send(answer)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the client left
            self._drop(conn)
            return
        request_metrics.record(listcache.ROUTE, "GET", 200, started)
        if sent == len(answer):
            self._read(conn, conn.framed.rest)
            return
        fs = self.tpool.submit(self._send_rest, conn, answer[sent:])
        fs.add_done_callback(lambda f: self.method_queue.defer(self.finish_request, conn, f))

    def _send_rest(self, conn: Any, rest: bytes) -> bool:
        """On a thread: the rest of an answer written on the loop; whether to keep the
        connection."""
        try:
            conn.sock.settimeout(self.body_s)
            conn.sock.sendall(rest)
        except OSError:
            return False
        return True

    def _set_deadline(self, conn: Any, state: _Reading, phase: str, seconds: float) -> None:
        state.phase, state.deadline = phase, time.monotonic() + seconds
        heapq.heappush(self._deadlines, (state.deadline, next(self._seq), conn))

    def _answer_and_close(self, conn: Any, status: int, code: str, message: str) -> None:
        log.info("request refused before the application", extra={
            "status": status, "code": code, "client": _peer(conn)})
        _send(conn.sock, error_bytes(status, code, message))
        self._linger(conn)

    def _linger(self, conn: Any) -> None:
        """Half-close, then drain until the client closes or LINGER_S passes (RFC 9112 9.6)."""
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._unwatch(conn)
            self._drop(conn)
            return
        self._watch(conn, _Reading(RequestFramer(0), "closing", time.monotonic() + LINGER_S))

    def _drop(self, conn: Any) -> None:
        self._unwatch(conn)
        self.nr_conns -= 1
        conn.close()

    def _expire(self) -> None:
        """Close what missed its deadline; a stopping worker drops idle connections at once
        and answers waiting requests."""
        now = time.monotonic()
        if not self.alive:
            for conn in [c for c, s in self._reading.items() if s.phase == "idle"]:
                self._drop(conn)
            for conn in list(self._parked):
                self._resume(conn, "stopping")
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, conn = heapq.heappop(self._deadlines)
            parked = self._parked.get(conn)
            if parked is not None and parked[1] == deadline:
                self._resume(conn, "timeout")
                continue
            state = self._reading.get(conn)
            if state is None or state.deadline != deadline:
                continue  # already gone, or given a later deadline since
            if state.phase in ("idle", "closing") or not state.framer.started:
                self._drop(conn)  # nothing of a request arrived: nothing to answer
            else:
                what = "headers" if state.phase == "head" else "body"
                self._answer_and_close(conn, 408, "request_timeout",
                                       f"the request {what} did not arrive in time")

    def murder_pending(self) -> None:
        # Called on every turn of gthread's loop, while serving and while stopping.
        super().murder_pending()
        self._expire()
        for conn in self._lane.due():  # list reads the pace held until now
            self._list(conn)
        if not self.alive:
            for conn in self._lane.release_all():  # answered before the worker exits
                self._list(conn)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self._deadlines:
            timeout = min(timeout, max(self._deadlines[0][0] - time.monotonic(), 0.0))
        paced = self._lane.next_due_s()
        if paced is not None:
            timeout = min(timeout, paced)
        super().wait_for_and_dispatch_events(timeout)

    # --- waiting requests (taskline_producer.http.waiting) ---------------------------------------

    def _park(self, conn: Any, parked: Parked) -> None:
        """Hold `conn`'s answer until its watch fires (`wake`) or its deadline passes."""
        deadline = time.monotonic() + parked.wait_s
        self._parked[conn] = (parked, deadline)
        WAITING_REQUESTS.inc()
        conn.sock.setblocking(False)
        self.poller.register(conn.sock, selectors.EVENT_READ,
                             partial(self._on_parked_readable, conn))
        heapq.heappush(self._deadlines, (deadline, next(self._seq), conn))
        if not self.alive:
            self._resume(conn, "signalled")
        elif parked.watch.fired:  # fired while its request was being read
            self.wake(conn)

    def wake(self, conn: Any) -> None:
        """Any thread (the finish listener's): answer `conn`'s waiting request now."""
        with self._woken_lock:
            self._woken.append(conn)
            if len(self._woken) > 1:
                return  # the loop is told already
        self.method_queue.defer(self._answer_woken)

    def _answer_woken(self) -> None:
        """Every waiter woken since the loop last looked: a job's waiter goes to the next
        burst, any other (a workflow's, or any in a stopping worker) runs its request again."""
        with self._woken_lock:
            woken, self._woken = self._woken, []
        for conn in woken:
            entry = self._parked.pop(conn, None)
            if entry is None:
                continue  # answered already, or its client left
            parked, deadline = entry
            self._unpark(conn, parked)
            WAITS_ENDED.labels("signalled").inc()
            if parked.reply is None or not self.alive:
                self._run_again(conn, deadline if self.alive else 0.0)
            else:
                self._burst.append((conn, parked.reply, deadline))
        self._start_burst()

    def _start_burst(self) -> None:
        if not self._burst or self._bursting:
            return  # a running burst starts the next when it ends
        burst, self._burst = self._burst, []
        self._bursting = True
        done = self.tpool.submit(self._answer_burst, burst)
        done.add_done_callback(lambda fs: self.method_queue.defer(self._burst_done, burst, fs))

    def _answer_burst(self, burst: list[tuple[Any, Reply, float]]) -> list[str]:
        """On a thread: read every job of `burst` at once and answer each waiter whose job is
        finished; "keep", "close" or "again" (run its request) for each."""
        try:
            answers = woken.answers(self._flask, [reply for _, reply, _ in burst])
        except Exception:
            # PostgreSQL unreachable, say: each request, run again, answers in the error shape.
            log.warning("woken waiters are answered by their requests", exc_info=True)
            return ["again"] * len(burst)
        return [self._send(conn, reply, answer) if answer is not None else "again"
                for (conn, reply, _), answer in zip(burst, answers, strict=True)]

    def _send(self, conn: Any, reply: Reply, answer: woken.Answer) -> str:
        """Write `answer` as gunicorn writes an application's (its Response)."""
        req, conn.parked_req = conn.parked_req, None
        resp = wsgi.Response(req, conn.sock, self.cfg)
        if not self.alive or not self.cfg.keepalive:
            resp.force_close()
        try:
            conn.sock.settimeout(self.body_s)  # as a request's thread writes (handle_request)
            resp.start_response("200 OK", answer.headers)
            resp.write(answer.body)
            resp.close()
        except OSError:
            return "close"  # the client left
        request_metrics.record(reply.route, "GET", 200, reply.started)
        WOKEN_ANSWERS.labels("burst").inc()
        return "close" if resp.should_close() or not conn.framed.complete else "keep"

    def _burst_done(self, burst: list[tuple[Any, Reply, float]], fs: Any) -> None:
        self._bursting = False
        try:
            outcomes = fs.result()
        except Exception:  # a bug: some answers may be written, so none is written again
            log.exception("woken waiters could not be answered")
            outcomes = ["close"] * len(burst)
        for (conn, _, deadline), outcome in zip(burst, outcomes, strict=True):
            if outcome == "keep":
                self._read(conn, conn.framed.rest)
            elif outcome == "close":
                self._linger(conn)
            else:
                self._run_again(conn, deadline if self.alive else 0.0)
        self._start_burst()

    def _run_again(self, conn: Any, until: float, signalled: bool = True) -> None:
        """Run a waiting request again: it answers, or waits on until `until` (0: at once)."""
        conn.wait_until = until
        if signalled:
            WOKEN_ANSWERS.labels("request").inc()
        self.enqueue_req(conn)

    def _resume(self, conn: Any, ended: str) -> None:
        """Run the waiting request again: it answers its job's state, or, woken by a signal
        that did not finish it (a reconnection's), waits on until its deadline."""
        entry = self._parked.pop(conn, None)
        if entry is None:
            return  # answered already, or its client left
        self._unpark(conn, entry[0])
        WAITS_ENDED.labels(ended).inc()
        signalled = ended == "signalled"
        self._run_again(conn, entry[1] if signalled and self.alive else 0.0, signalled)

    def _unpark(self, conn: Any, parked: Parked) -> None:
        WAITING_REQUESTS.dec()
        parked.listener.unwatch(parked.watch)
        with contextlib.suppress(KeyError, ValueError):
            self.poller.unregister(conn.sock)

    def _on_parked_readable(self, conn: Any, _sock: Any) -> None:
        """A waiting client closed its connection (then it is dropped), or sent more (read
        after the answer)."""
        try:
            gone = conn.sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            gone = True
        entry = self._parked.get(conn)
        if entry is None:
            return
        if gone:
            del self._parked[conn]
            self._unpark(conn, entry[0])
            self.nr_conns -= 1
            conn.close()
        else:
            with contextlib.suppress(KeyError, ValueError):
                self.poller.unregister(conn.sock)

    def serving(self) -> Any:
        """The connection whose request this thread serves (None off a request)."""
        return getattr(self._serving, "conn", None)

    def finish_request(self, conn: Any, fs: Any) -> None:
        """Back from its thread: hold a waiting answer, read the next request, or close the
        connection."""
        # A list read's turn goes on, even if this connection waits now.
        for following in self._lane.done(conn):
            self._list(following)
        parked = getattr(conn, "parked", None)
        if parked is not None:
            conn.parked = None
            self._park(conn, parked)
            return
        framed = getattr(conn, "framed", None)
        if framed is None:
            super().finish_request(conn, fs)
            return
        try:
            keep = not fs.cancelled() and fs.result()
        except Exception:
            keep = False
        if keep:
            self._read(conn, framed.rest)
        else:
            self._linger(conn)

    # --- the thread side -----------------------------------------------------------------

    def handle(self, conn: Any) -> Any:
        framed = getattr(conn, "framed", None)
        if framed is not None:
            # The thread parses only the bytes the loop read: it never waits on the client.
            conn.parser = http.get_parser(self.cfg, iter([framed.message]), conn.client)
            conn.initialized = conn.data_ready = True
        return super().handle(conn)

    def handle_request(self, req: Any, conn: Any) -> bool:
        framed = getattr(conn, "framed", None)
        if framed is not None:
            req.must_close = req.must_close or not framed.complete
            # The loop sent 100 Continue when it read the body (or must not: it was too large).
            req._expected_100_continue = False
            # A client that stops reading its answer frees the thread after this long.
            conn.sock.settimeout(self.body_s)
        self._serving.conn = conn
        try:
            return bool(super().handle_request(req, conn))
        except Parked as parked:
            # The frames of the request's run would stay alive for as long as it waits.
            parked.__traceback__ = None
            conn.parked = parked  # finish_request holds it on the event loop
            conn.parked_req = req  # a woken waiter's answer is written for it
            return True
        finally:
            self._serving.conn = None
            conn.wait_until = None

    def _keepalive_after(self, conn: Any, keepalive: bool) -> bool:
        framed = getattr(conn, "framed", None)
        if framed is None:
            return bool(super()._keepalive_after(conn, keepalive))
        # The body's bytes were read with the request: nothing is left to drain.
        return bool(keepalive) and framed.complete

    def handle_error(self, req: Any, client: Any, addr: Any, exc: Exception) -> None:
        """gunicorn's own parse errors in the error shape (gunicorn writes text/html)."""
        status, code, message = _error_answer(exc)
        if status == 500:
            log.error("error while serving a request", exc_info=exc)
        try:
            client.sendall(error_bytes(status, code, message))
        except OSError:
            log.debug("the error answer could not be sent")


def _error_answer(exc: Exception) -> tuple[int, str, str]:
    for kind, status, code in _GUNICORN_ERRORS:
        if isinstance(exc, kind):
            return status, code, str(exc)
    if isinstance(exc, http_errors.ParseException):
        return 400, "invalid_framing", f"the request is not valid HTTP/1.1: {exc}"
    return 500, "internal_error", "internal error; it has been logged"


class Parking:
    """What a request's environ offers its route (PARKING): `wake()` answers it, from any
    thread, once the route raised Parked."""

    __slots__ = ("_conn", "_worker")

    def __init__(self, worker: IntakeWorker, conn: Any) -> None:
        self._worker = worker
        self._conn = conn

    def wake(self) -> None:
        self._worker.wake(self._conn)


def offering_parking(app: Callable[..., Iterable[bytes]],
                     worker: IntakeWorker) -> Callable[..., Iterable[bytes]]:
    """WSGI middleware: a request read on the event loop may wait there (PARKING); one run
    again after a wake-up is told its first deadline (WAIT_UNTIL); a list request whose
    repeats the loop may answer from the list cache carries its bytes (RAW_REQUEST)."""

    def wrapped(wsgi_env: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        conn = worker.serving()
        framed = getattr(conn, "framed", None)
        if framed is not None:
            wsgi_env[PARKING] = Parking(worker, conn)
            if listcache.loop_may_answer(framed.message):
                wsgi_env[listcache.RAW_REQUEST] = framed.message
            until = getattr(conn, "wait_until", None)
            if until is not None:
                wsgi_env[WAIT_UNTIL] = until
        return app(wsgi_env, start_response)

    return wrapped


def closing_when_asked(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """WSGI middleware: an answer whose request set CLOSE_CONNECTION in its environ closes
    the connection (`Connection: close`), as gunicorn ignores a Connection header of the app's."""

    def wrapped(wsgi_env: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            response = getattr(start_response, "__self__", None)  # gunicorn's Response
            if wsgi_env.get(CLOSE_CONNECTION) and response is not None:
                response.force_close()
            return start_response(status, headers, exc_info)

        return app(wsgi_env, start)

    return wrapped


def _send(sock: socket.socket, data: bytes) -> None:
    """Best effort, without blocking: an answer this small fits in a fresh socket's buffer."""
    try:
        sock.send(data)
    except OSError as err:
        if err.errno not in (errno.EAGAIN, errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
            log.debug("early answer not sent: %s", err)


def _peer(conn: Any) -> str:
    client = conn.client
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) else str(client)
