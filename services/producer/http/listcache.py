"""A short-lived cache of the workflow list: GET /api/v1/workflows is answered what the same
query by the same principal was answered less than `TASKLINE_API_LIST_CACHE_S` ago.

Each list counts the steps of its workflows by status in PostgreSQL: milliseconds of its CPU for
workflows of 1,000 steps. Clients listing in a loop (a script, dashboards left open) took the CPU
the enqueues needed (docs/performance.md); within the cache's age they cost one count per query.
A list may therefore be up to that old (its step counts, and workflows another API process
created); one this process submits or cancels a workflow empties its cache. 0 turns it off.

A list request whose bytes are exactly those of one answered from the cache (or into it) is
answered by the event loop itself (`answer_on_loop`) when the list lane admits it, without a
thread, Flask or gunicorn's parser: through Flask a cache hit cost the API process about 1.7 ms
of CPU, as much as an enqueue, and a lister polling in a loop sends the same bytes every time.
The lane's pace still bounds how many lists are answered a second (the loop's answers take its
tokens as the threads' do), so cheaper answers mean less CPU taken from the enqueues, not more
answers (docs/performance.md). Such an answer carries what the thread's would, Date aside, and
expires with the entry it came from.

Invariant: an entry is keyed by the request's path and query string and by the principal (its
kind, name and issuer), so no principal is answered what another's request read; only 200
answers are kept, at most MAX_ENTRIES per process (the oldest go first). The loop answers only
byte-identical requests (same Host, same Authorization, same headers), only HTTP/1.1 requests
without a body whose connection stays open, and only those of no principal or a static token,
checked again at each answer (`auth.still_allowed`, no I/O); a JWT's requests go to Flask, whose
check may fetch keys and must see the token's expiry.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
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
ENDPOINT = "workflows.list_workflows"
# The cached route's request line as HTTP/1.1 sends it, any query string.
_LOOP_LINE = re.compile(rb"GET /api/v1/workflows(?:\?[^\s]*)? HTTP/1\.1\r\n")
# Headers that would change the answer's framing or its connection: such requests go to Flask.
_FRAMING = (b"\r\ncontent-length:", b"\r\ntransfer-encoding:", b"\r\nexpect:",
            b"\r\nupgrade:")
_CONNECTION = re.compile(rb"\r\nconnection:[ \t]*([^\r]*)")
RAW_MAX = 8192
"""The longest request (bytes) whose repeats the loop answers: its bytes are the entry's key,
so MAX_ENTRIES of them stay within 2 MiB per process."""


@dataclass(frozen=True)
class Raw:
    """What the loop answers a request's exact bytes with, until `expiry`."""

    expiry: float
    body: bytes
    token: str | None
    """The static token the answer was given to, checked again at each answer (None: no
    authentication)."""


class ListCache:
    """Answers' bodies by key, each kept `ttl_s` seconds."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._entries: OrderedDict[Any, tuple[float, bytes]] = OrderedDict()
        self._answers: OrderedDict[bytes, Raw] = OrderedDict()
        """Request bytes -> what the event loop answers them."""

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

    def put_raw(self, message: bytes, raw: Raw) -> None:
        """The request `message` is answered `raw.body` on the loop until `raw.expiry`."""
        with self._lock:
            _keep(self._answers, message, raw)

    def answerable(self, message: bytes) -> bool:
        """Whether the loop holds an answer to the request `message` now (its token aside)."""
        return self._fresh(message) is not None

    def answer_on_loop(self, app: Flask, message: bytes) -> bytes | None:
        """The whole HTTP answer to the request `message` if the loop may give it, else None."""
        raw = self._fresh(message)
        if raw is None:
            return None
        if raw.token is not None and not auth.still_allowed(app, raw.token, ENDPOINT):
            return None  # Flask answers it, in the error shape
        return b"".join((_head(len(raw.body)), raw.body))

    def _fresh(self, message: bytes) -> Raw | None:
        raw = self._answers.get(message)  # a dict read needs no lock
        return raw if raw is not None and raw.expiry > time.monotonic() else None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._answers.clear()


def _keep(entries: OrderedDict[Any, Any], key: Any, entry: Any) -> None:
    entries[key] = entry
    entries.move_to_end(key)
    while len(entries) > MAX_ENTRIES:
        entries.popitem(last=False)


def loop_may_answer(message: bytes) -> bool:
    """Whether the event loop may answer the repeats of the request `message` (its whole
    bytes): a GET of the workflow list over HTTP/1.1 that keeps its connection open."""
    if (len(message) > RAW_MAX or _LOOP_LINE.match(message) is None
            or not message.endswith(b"\r\n\r\n")):
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


def init_app(app: Flask, ttl_s: float) -> None:
    app.extensions[EXTENSION] = ListCache(ttl_s)


def of(app: Flask) -> ListCache | None:
    """The app's list cache, if it keeps one (TASKLINE_API_LIST_CACHE_S > 0)."""
    cache: ListCache | None = app.extensions.get(EXTENSION)
    return cache if cache is not None and cache.ttl_s > 0 else None


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
        if raw is not None and who.kind != "jwt":
            cache.put_raw(raw, Raw(expiry, body, auth.presented_token()))
        return response

    return wrapped


def forget() -> None:
    """This process changed what a list shows: its next lists read afresh."""
    current_app.extensions[EXTENSION].clear()
