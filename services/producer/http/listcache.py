"""A short-lived cache of the workflow list: GET /api/v1/workflows is answered what the same
query by the same principal was answered less than `TASKLINE_API_LIST_CACHE_S` ago.

Each list counts the steps of its workflows by status in PostgreSQL: milliseconds of its CPU for
workflows of 1,000 steps. Clients listing in a loop (a script, dashboards left open) took the CPU
the enqueues needed (docs/performance.md); within the cache's age they cost one count per query.
A list may therefore be up to that old (its step counts, and workflows another API process
created); one this process submits or cancels a workflow empties its cache. 0 turns it off.

With authentication off, a list request whose bytes are exactly those of one answered from the
cache (or into it) is answered by the event loop itself (`answer_on_loop`), without a thread,
Flask or the list lane: a cache hit through Flask cost about a millisecond of the GIL the
enqueues need, and a lister polling in a loop sends the same bytes every time. Such an answer
carries what the thread's would, Date aside, and expires with the entry it came from.

Invariant: an entry is keyed by the request's path and query string and by the principal (its
kind, name and issuer), so no principal is answered what another's request read; only 200
answers are kept, at most MAX_ENTRIES per process (the oldest go first). The loop answers only
byte-identical requests (same Host, same headers), only with authentication off (no request
then has a principal of its own to check), only HTTP/1.1 requests without a body whose
connection stays open.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, current_app, request
from gunicorn import SERVER, util

from taskline_producer.http import auth

EXTENSION = "taskline_list_cache"
MAX_ENTRIES = 256
RAW_REQUEST = "taskline.raw_request"
"""The environ key under which the event loop passes a request's bytes (when it may answer
their repeats itself)."""
ROUTE = "/api/v1/workflows"
# The cached route's request line as HTTP/1.1 sends it, any query string.
_LOOP_LINE = re.compile(rb"GET /api/v1/workflows(?:\?[^\s]*)? HTTP/1\.1\r\n")
# Headers that would change the answer's framing or its connection: such requests go to Flask.
_FRAMING = (b"\r\ncontent-length:", b"\r\ntransfer-encoding:", b"\r\nexpect:",
            b"\r\nupgrade:")
_CONNECTION = re.compile(rb"\r\nconnection:[ \t]*([^\r]*)")


class ListCache:
    """Answers' bodies by key, each kept `ttl_s` seconds."""

    def __init__(self, ttl_s: float, on_loop: bool = False) -> None:
        self.ttl_s = ttl_s
        self.on_loop = on_loop and ttl_s > 0
        """Whether the event loop answers repeated requests (authentication off)."""
        self._lock = threading.Lock()
        self._entries: OrderedDict[Any, tuple[float, bytes]] = OrderedDict()
        self._answers: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        """Request bytes -> (expiry, body): what the event loop answers."""

    def get(self, key: Any) -> tuple[float, bytes] | None:
        """(expiry, body) of `key`'s answer while it is young enough."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] <= time.monotonic():
                return None
            return entry

    def put(self, key: Any, body: bytes) -> float:
        """Keep `body` as `key`'s answer; its expiry."""
        with self._lock:
            expiry = time.monotonic() + self.ttl_s
            _keep(self._entries, key, (expiry, body))
            return expiry

    def put_raw(self, message: bytes, expiry: float, body: bytes) -> None:
        """The request `message` is answered `body` on the loop until `expiry`."""
        with self._lock:
            _keep(self._answers, message, (expiry, body))

    def answer_on_loop(self, message: bytes) -> bytes | None:
        """The whole HTTP answer to the request `message` if the loop may give it, else None."""
        entry = self._answers.get(message)  # the event loop's; a dict read needs no lock
        if entry is None or entry[0] <= time.monotonic():
            return None
        body = entry[1]
        return b"".join((_head(len(body)), body))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._answers.clear()


def _keep(entries: OrderedDict[Any, tuple[float, bytes]], key: Any,
          entry: tuple[float, bytes]) -> None:
    entries[key] = entry
    entries.move_to_end(key)
    while len(entries) > MAX_ENTRIES:
        entries.popitem(last=False)


def loop_may_answer(message: bytes) -> bool:
    """Whether the event loop may answer the repeats of the request `message` (its whole
    bytes): a GET of the workflow list over HTTP/1.1 that keeps its connection open."""
    if _LOOP_LINE.match(message) is None or not message.endswith(b"\r\n\r\n"):
        return False
    head = message.lower()
    if any(name in head for name in _FRAMING):
        return False
    return all(value.strip() == b"keep-alive" for value in _CONNECTION.findall(head))


_HEADERS = [("Content-Type", "application/json"), *auth.answer_headers(ROUTE)]


def _head(length: int) -> bytes:
    """The status line and headers a thread writes for a 200 answer of `length` bytes."""
    lines = [f"HTTP/1.1 200 OK\r\nServer: {SERVER}\r\nDate: {util.http_date()}\r\n"
             f"Connection: keep-alive\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in
              (*_HEADERS, ("Content-Length", str(length)))]
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def init_app(app: Flask, ttl_s: float, on_loop: bool = False) -> None:
    """`on_loop`: the event loop may answer repeated requests (authentication is off)."""
    app.extensions[EXTENSION] = ListCache(ttl_s, on_loop)


def of(app: Flask) -> ListCache | None:
    cache: ListCache | None = app.extensions.get(EXTENSION)
    return cache


def cached(view: Callable[..., Response]) -> Callable[..., Response]:
    """Serve `view`'s 200 answers from the cache while they are young enough."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Response:
        cache: ListCache = current_app.extensions[EXTENSION]
        if cache.ttl_s <= 0:
            return view(*args, **kwargs)
        who = auth.principal()
        key = (request.full_path, who.kind, who.name, who.issuer)
        entry = cache.get(key)
        if entry is not None:
            expiry, body = entry
            response = current_app.response_class(body, mimetype="application/json")
        else:
            response = view(*args, **kwargs)
            if response.status_code != 200:
                return response
            body = response.get_data()
            expiry = cache.put(key, body)
        raw = request.environ.get(RAW_REQUEST)
        if cache.on_loop and raw is not None:
            cache.put_raw(raw, expiry, body)
        return response

    return wrapped


def forget() -> None:
    """This process changed what a list shows: its next lists read afresh."""
    current_app.extensions[EXTENSION].clear()
