"""A short-lived cache of the workflow list: GET /api/v1/workflows is answered what the same
query by the same principal was answered less than `TASKLINE_API_LIST_CACHE_S` ago.

Each list counts the steps of its workflows by status in PostgreSQL: milliseconds of its CPU for
workflows of 1,000 steps. Clients listing in a loop (a script, dashboards left open) took the CPU
the enqueues needed (docs/performance.md); within the cache's age they cost one count per query.
A list may therefore be up to that old (its step counts, and workflows another API process
created); one this process submits or cancels a workflow empties its cache. 0 turns it off.

Invariant: an entry is keyed by the request's path and query string and by the principal (its
kind, name and issuer), so no principal is answered what another's request read; only 200
answers are kept, at most MAX_ENTRIES per process (the oldest go first).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, current_app, request

from taskline_producer.http import auth

EXTENSION = "taskline_list_cache"
MAX_ENTRIES = 256


class ListCache:
    """Answers' bodies by key, each kept `ttl_s` seconds."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._entries: OrderedDict[Any, tuple[float, bytes]] = OrderedDict()

    def get(self, key: Any) -> bytes | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] <= time.monotonic():
                return None
            return entry[1]

    def put(self, key: Any, body: bytes) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic() + self.ttl_s, body)
            self._entries.move_to_end(key)
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def init_app(app: Flask, ttl_s: float) -> None:
    app.extensions[EXTENSION] = ListCache(ttl_s)


def cached(view: Callable[..., Response]) -> Callable[..., Response]:
    """Serve `view`'s 200 answers from the cache while they are young enough."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Response:
        cache: ListCache = current_app.extensions[EXTENSION]
        if cache.ttl_s <= 0:
            return view(*args, **kwargs)
        who = auth.principal()
        key = (request.full_path, who.kind, who.name, who.issuer)
        body = cache.get(key)
        if body is not None:
            return current_app.response_class(body, mimetype="application/json")
        response = view(*args, **kwargs)
        if response.status_code == 200:
            cache.put(key, response.get_data())
        return response

    return wrapped


def forget() -> None:
    """This process changed what a list shows: its next lists read afresh."""
    current_app.extensions[EXTENSION].clear()
