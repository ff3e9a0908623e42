"""HTTP load for the benchmark: closed-loop clients, each its own process, posting prepared bodies.

Invariant: the client is not the bottleneck. Every client is a separate OS process (no GIL
shared with the others) holding one keep-alive connection through http.client, and request
bodies are serialised once, before the clock starts; answers are read whole but not decoded
(the server's work ends with the bytes). All clients start together on an event and the clock
stops when the last one is done. Any non-2xx answer fails the measurement.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

HEADERS = {"Content-Type": "application/json"}


class Connection:
    """One keep-alive HTTP/1.1 connection to the API."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        self._conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def post(self, path: str, body: bytes) -> dict[str, Any]:
        return json.loads(self.send(path, body))

    def send(self, path: str, body: bytes) -> bytes:
        """POST and read the whole answer, undecoded: decoding a 1,000-job batch's answer
        costs the client ~5 ms of CPU, taken from the cores the server is measured on."""
        self._conn.request("POST", path, body=body, headers=HEADERS)
        response = self._conn.getresponse()
        data = response.read()
        if response.status >= 300:
            raise RuntimeError(f"POST {path} answered {response.status}: {data[:200]!r}")
        return data

    def close(self) -> None:
        self._conn.close()


def _client(base: str, path: str, body: bytes, requests: int, warmup: int, go: Any,
            ready: Any, done: Any) -> None:
    conn = Connection(base)
    for _ in range(warmup):  # connect, and warm the server's code paths and pools
        conn.send(path, body)
    ready.put(True)
    go.wait()
    for _ in range(requests):
        conn.send(path, body)
    conn.close()
    done.put(requests)


def run_together(target: Callable[..., None], args: tuple, count: int,
                 on_ready: Callable[[], None] | None = None) -> tuple[float, int]:
    """Start `count` processes of `target(*args, go, ready, done)`, wait until each has put
    on `ready` (connected and warmed up), run `on_ready`, then set `go` and time until each has
    put its count on `done`: (seconds, the counts added up). A process that fails raises."""
    return run_each(target, [args] * count, on_ready)


def run_each(target: Callable[..., None], args_each: Sequence[tuple],
             on_ready: Callable[[], None] | None = None) -> tuple[float, int]:
    """As run_together, one process per entry of `args_each`, each with its own arguments."""
    ctx = mp.get_context("fork")
    go, ready, done = ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, go, ready, done)) for args in args_each]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    if on_ready is not None:
        on_ready()
    started = time.perf_counter()
    go.set()
    finished = sum(done.get(timeout=600) for _ in procs)
    elapsed = time.perf_counter() - started
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError("a benchmark client failed")
    return elapsed, finished


def post_concurrently(base: str, path: str, body: Any, requests: int, clients: int,
                      warmup: int = 0, on_ready: Callable[[], None] | None = None) -> float:
    """Seconds for `clients` processes to POST `body` `requests` times in all; each first
    posts `warmup` requests before the clock starts, which are not counted. `on_ready` runs
    once every client is connected and warmed up, before the clock starts."""
    if requests % clients:
        # A remainder would be posted by no one, and a drain would wait for it for ever.
        raise ValueError(f"{requests} requests do not share evenly among {clients} clients")
    data = json.dumps(body, separators=(",", ":")).encode()
    share = requests // clients
    elapsed, finished = run_together(_client, (base, path, data, share, warmup), clients,
                                     on_ready)
    if finished != share * clients:
        raise RuntimeError("a benchmark client stopped early")
    return elapsed


def enqueue_batches(base: str, jobs: int, job: dict[str, Any], batch: int = 1000,
                    clients: int = 1, warmup: int = 0,
                    on_ready: Callable[[], None] | None = None) -> float:
    """Seconds to enqueue `jobs` copies of `job` in batches of `batch` over HTTP."""
    body = {"jobs": [job] * batch}
    return post_concurrently(base, "/api/v1/jobs/batch", body, jobs // batch, clients, warmup,
                             on_ready)
