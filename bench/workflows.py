"""Workflow benchmarks: a fan-out into one fan-in, the handoff along a chain, and enqueues
beside clients listing large workflows.

Invariant: both time the engine's release path only, on the same host clock as the handler
stamps (`bench.stamp` returns when its handler started). `fan_in`: from the POST of a workflow
of N parallel steps and one step after all of them, to that last step's start. `chain`: along
a chain of N steps, each step's start minus its parent's start (a `bench.stamp` handler returns
at once, so that is the parent's completion write, its release of the child, the push and the
child's pickup), against the same run's idle pickup of a single job (pickup_idle_worker's
from_201_ms), the target being a median handoff at most 1.5 x the pickup median.
`enqueue_beside_lists`: one client's single enqueues, one at a time, in BLOCKS interleaved
pairs of blocks, quiet and then while LISTERS clients GET /api/v1/workflows in a closed loop over
LISTED workflows of 1,000 steps each; the target being the median over the pairs of the listing
block's enqueue p99 over its quiet block's at most 1.2 x, and every list answered 2xx.
"""

from __future__ import annotations

import http.client
import itertools
import json
import multiprocessing as mp
import os
import selectors
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from clients import Connection
from scenarios import DRAIN_CONCURRENCY, idle_workers, pickup, quantiles
from stack import Stack, wait_until

STAMP = {"type": "bench.stamp", "payload": {}}


def _submit(base: str, name: str, steps: list[dict[str, Any]]) -> tuple[float, dict[str, str]]:
    """(wall time just before the POST, step id -> job id)."""
    conn = Connection(base)
    body = json.dumps({"name": name, "steps": steps}).encode()
    t0 = time.time()
    answer = conn.post("/api/v1/workflows", body)
    conn.close()
    if answer["next_cursor"]:  # the answer holds the first page of steps: read them all
        answer = json.loads(_get(base, f"/api/v1/workflows/{answer['id']}?limit=1000")[1])
    return t0, {s["id"]: s["job_id"] for s in answer["steps"]}


def _get(base: str, path: str, conn: http.client.HTTPConnection | None = None
         ) -> tuple[int, bytes]:
    """(status, body) of one GET, on `conn` when given (kept alive), else a connection of its
    own."""
    own = conn is None
    if conn is None:
        parts = urlsplit(base)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    data = response.read()
    if own:
        conn.close()
    return response.status, data


def _started(stack: Stack, job_ids: list[str]) -> dict[str, float]:
    rows = stack.sql("SELECT id::text, (result->>'started')::float8 FROM taskline.jobs "
                     "WHERE id = ANY(%s::uuid[])", job_ids)
    return {r[0]: float(r[1]) for r in rows}


def fan_in(stack: Stack, parts: int = 999, workers: int = 2) -> float:
    """Seconds from submitting `parts` parallel steps and their fan-in to the fan-in's start."""
    stack.reset()
    names = [f"p{i}" for i in range(parts)]
    steps = [{"id": n, "job": STAMP} for n in names]
    steps.append({"id": "fan_in", "job": STAMP, "after": names})
    with stack.api() as base, stack.workers(workers, DRAIN_CONCURRENCY):
        idle_workers(stack, workers)
        t0, jobs = _submit(base, "fan-in", steps)
        wait_until(lambda: stack.count("succeeded") >= parts + 1, timeout=600, interval=0.05)
    return _started(stack, [jobs["fan_in"]])[jobs["fan_in"]] - t0


def chain(stack: Stack, length: int = 100) -> dict[str, Any]:
    """Handoff latency along a chain of `length` steps, ms, and the idle pickup beside it."""
    idle = pickup(stack, jobs=100)["from_201_ms"]
    stack.reset()
    steps = [{"id": "s0", "job": STAMP}] + [{"id": f"s{i}", "job": STAMP, "after": [f"s{i - 1}"]}
                                            for i in range(1, length)]
    with stack.api() as base, stack.workers(1, 4):
        idle_workers(stack, 1)
        _t0, jobs = _submit(base, "chain", steps)
        wait_until(lambda: stack.count("succeeded") >= length, timeout=600, interval=0.05)
    started = _started(stack, list(jobs.values()))
    times = [started[jobs[f"s{i}"]] for i in range(length)]
    handoffs = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    ratio = quantiles(handoffs)["p50"] / idle["p50"] if idle["p50"] else None
    return {"handoff_ms": quantiles(handoffs), "idle_pickup_ms": idle,
            "p50_handoff_over_pickup": ratio,
            "within_1_5x": ratio is not None and ratio <= 1.5}




LISTERS = 32
LISTED = 5
LISTED_STEPS = 1000
LISTER_PROCS = int(os.environ.get("BENCH_LISTER_PROCS", str(LISTERS)))
"""Processes the LISTERS connections are spread over: 32 (one each, the default) charges each
client's interpreter to the two cores the API runs on; 1 drives all 32 from one selector loop,
closer to 32 clients on other hosts (BENCH_LISTER_PROCS)."""


def _lister(base: str, stop: Any, counts: Any, conns: int, listing: Any,
            measuring: Any) -> None:
    """GET the workflow list in a closed loop on each of `conns` kept-alive connections while
    `listing` is set (a connection whose answer comes while it is clear sends again once it is
    set), until `stop`; put (answers while `measuring` was set, non-2xx answers at any time)."""
    parts = urlsplit(base)
    request = f"GET /api/v1/workflows HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    socks = [socket.create_connection((parts.hostname, parts.port)) for _ in range(conns)]
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ, [b""])
    idle = list(socks)  # connections with no request in flight
    answered = failed = 0
    while not stop.is_set():
        if idle and listing.is_set():
            for sock in idle:
                sock.sendall(request)
            idle.clear()
        for key, _ in sel.select(timeout=0.05 if idle else 0.5):
            sock, buffer = key.fileobj, key.data
            buffer[0] += sock.recv(1 << 20)  # type: ignore[union-attr]
            status = _whole_answer(buffer)
            if status is None:
                continue
            answered += measuring.is_set()
            failed += not 200 <= status < 300
            if listing.is_set():
                sock.sendall(request)  # type: ignore[union-attr]
            else:
                idle.append(sock)
    for sock in socks:
        sock.close()
    counts.put((answered, failed))


def _whole_answer(buffer: list[bytes]) -> int | None:
    """The status of the answer at the head of buffer[0] once it is whole (it is then taken
    off the buffer), else None."""
    head, sep, rest = buffer[0].partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines
                  if line.lower().startswith(b"content-length"))
    if len(rest) < length:
        return None
    buffer[0] = rest[length:]
    return int(lines[0].split()[1])


def _enqueue_latencies(base: str, jobs: int) -> list[float]:
    """ms of each of `jobs` single enqueues, one at a time on one kept-alive connection."""
    conn = Connection(base)
    body = json.dumps(STAMP).encode()
    for _ in range(20):  # warm-up
        conn.send("/api/v1/jobs", body)
    times = []
    for _ in range(jobs):
        started = time.perf_counter()
        conn.send("/api/v1/jobs", body)
        times.append((time.perf_counter() - started) * 1000)
    conn.close()
    return times


BLOCKS = 5
LISTING_WARM_S = 1.5
"""Lists before a listing block's enqueues are timed: the lane's pace lets its first second's
worth go at once after a quiet block."""


def enqueue_beside_lists(stack: Stack, jobs: int = 2000) -> dict[str, Any]:
    """Enqueue latency (ms), `jobs` enqueues per block in BLOCKS pairs of blocks, quiet then while
    LISTERS clients list LISTED workflows of LISTED_STEPS steps: each pair's p99 ratio, their
    median (the target's figure), the pooled quantiles, the lists answered per second of the
    listing blocks and how many were not 2xx."""
    stack.reset()
    steps = [{"id": f"s{i}", "job": STAMP} for i in range(LISTED_STEPS)]
    ctx = mp.get_context("fork")
    with stack.api() as base:
        for i in range(LISTED):
            _submit(base, f"big{i}", steps)
        stop, counts, listing, measuring = ctx.Event(), ctx.Queue(), ctx.Event(), ctx.Event()
        listers = [ctx.Process(target=_lister,
                               args=(base, stop, counts, len(range(i, LISTERS, LISTER_PROCS)),
                                     listing, measuring))
                   for i in range(LISTER_PROCS)]
        for proc in listers:
            proc.start()
        quiet: list[list[float]] = []
        loaded: list[list[float]] = []
        seconds = 0.0
        for _ in range(BLOCKS):
            time.sleep(0.5)  # the last lists in flight answered
            quiet.append(_enqueue_latencies(base, jobs))
            listing.set()
            time.sleep(LISTING_WARM_S)
            measuring.set()
            started = time.perf_counter()
            loaded.append(_enqueue_latencies(base, jobs))
            seconds += time.perf_counter() - started
            measuring.clear()
            listing.clear()
        stop.set()
        totals = [counts.get(timeout=120) for _ in listers]
        for proc in listers:
            proc.join()
    ratios = sorted(quantiles(b)["p99"] / quantiles(a)["p99"]
                    for a, b in zip(quiet, loaded, strict=True))
    ratio = ratios[len(ratios) // 2]
    return {"quiet_ms": quantiles([t for b in quiet for t in b]),
            "listing_ms": quantiles([t for b in loaded for t in b]),
            "p99_ratios": ratios, "p99_ratio": ratio, "within_1_2x": ratio <= 1.2,
            "lists_per_s": sum(a for a, _ in totals) / seconds,
            "lists_not_2xx": sum(f for _, f in totals)}
