"""Waiting clients: 1,000 requests held by `wait_s` on one API (2 processes), beside the API's
other work, and the wake-up delay from a job's finishing commit to its waiter's answer.

Invariant: the waiters are raw sockets driven by selector loops in WAITER_PROCS processes (a
thread each would measure the client's scheduler), each sending one
`GET /api/v1/jobs/{id}?wait_s=30` for a job of its own and stamping (host clock) the instant its
answer is whole. `beside_waiters` runs one client's single enqueues one at a time (its rate)
and one client's job reads one at a time (`other requests`: their p99), first with nothing else
connected, then while every waiter is held (the API's waiting-requests gauge counts them all);
then starts a worker, which finishes the waited jobs (`bench.noop`), and reads each job's
`finished_at` (PostgreSQL's clock on the same host: the finishing transaction's start, so the
delay is counted from a little before its commit, never after). The targets: the enqueue rate
and the other requests' p99 within 10 % of the quiet run's, every waiter answered
`succeeded`. Each phase's API CPU per request is reported (its worker processes' user + system
time over the phase's requests); with BENCH_PROFILE_DIR set, py-spy records the API through
both phases (bench/pyspy.py, GIL holders only).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import selectors
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from clients import Connection
from cpu import children, process_cpu_s
from scenarios import quantiles
from stack import Stack, wait_until

NOOP = {"type": "bench.noop", "payload": {}}
WAITER_PROCS = 4
WAIT_S = 30
ENQUEUES = 1000
READS = 1000
REQUESTS = ENQUEUES + READS + 40  # of a phase, the warm-ups included


def _enqueue(base: str, count: int) -> list[str]:
    conn = Connection(base)
    body = json.dumps(NOOP).encode()
    ids = [json.loads(conn.send("/api/v1/jobs", body))["id"] for _ in range(count)]
    conn.close()
    return ids


def _enqueue_rate(base: str, jobs: int) -> float:
    """Jobs/s of one client's single enqueues, one at a time."""
    conn = Connection(base)
    body = json.dumps(NOOP).encode()
    for _ in range(20):  # warm-up
        conn.send("/api/v1/jobs", body)
    started = time.perf_counter()
    for _ in range(jobs):
        conn.send("/api/v1/jobs", body)
    rate = jobs / (time.perf_counter() - started)
    conn.close()
    return rate


def _read_latencies(base: str, job_id: str, reads: int) -> list[float]:
    """ms of each of `reads` GET /api/v1/jobs/{id} (no wait_s), one at a time."""
    parts = urlsplit(base)
    conn = socket.create_connection((parts.hostname, parts.port))
    request = f"GET /api/v1/jobs/{job_id} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    times = []
    for n in range(reads + 20):
        started = time.perf_counter()
        conn.sendall(request)
        _read_answer(conn)
        if n >= 20:  # after the warm-up
            times.append((time.perf_counter() - started) * 1000)
    conn.close()
    return times


def _read_answer(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    return body


def _waiters(base: str, ids: list[str], ready: Any, out: Any) -> None:
    """Hold one waiting request per id; put {id: (answered at, status)} once all answered."""
    parts = urlsplit(base)
    sel = selectors.DefaultSelector()
    buffers: dict[str, bytes] = {}
    for job_id in ids:
        sock = socket.create_connection((parts.hostname, parts.port))
        sock.sendall(f"GET /api/v1/jobs/{job_id}?wait_s={WAIT_S} HTTP/1.1\r\n"
                     f"Host: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, job_id)
        buffers[job_id] = b""
    ready.put(len(ids))
    answered: dict[str, tuple[float, str]] = {}
    while len(answered) < len(ids):
        for key, _ in sel.select(timeout=WAIT_S + 10):
            chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
            job_id = key.data
            buffers[job_id] += chunk
            if chunk:
                continue
            sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
            head, _, body = buffers[job_id].partition(b"\r\n\r\n")
            try:
                status = json.loads(body).get("status", "?")
            except ValueError:
                status = "?"
            if status != "succeeded":  # what it was told instead, for the report
                line = head.split(b"\r\n")[0].decode()
                status = f"{status}: {line} {body[:200]!r}"
            answered[job_id] = (time.time(), status)
    out.put(answered)


def _parked(base: str) -> float:
    """The requests the API holds waiting (its taskline_api_waiting_requests gauge)."""
    text = requests.get(base + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("taskline_api_waiting_requests"))


def _api_cpu_s(stack: Stack) -> float:
    """User + system CPU seconds the API's worker processes have used so far."""
    return sum(process_cpu_s(pid) for pid in children(stack.api_pid))


def _profiled(stack: Stack, phase: str) -> contextlib.AbstractContextManager[None]:
    """With BENCH_PROFILE_DIR set, py-spy records the API's processes through `phase` into
    <dir>/waiters_<phase>.txt (raw collapsed stacks), else nothing."""
    folder = os.environ.get("BENCH_PROFILE_DIR")
    if not folder:
        return contextlib.nullcontext()
    from pyspy import recording

    Path(folder).mkdir(parents=True, exist_ok=True)
    return recording(stack.api_pid, Path(folder) / f"waiters_{phase}.txt", gil=True)


def beside_waiters(stack: Stack, waiters: int = 1000) -> dict[str, Any]:
    """Enqueue rate and other requests' p99 quiet and beside `waiters` waiting requests; the
    wake-up delay (ms) from the finishing commit to the answer."""
    stack.reset()
    ctx = mp.get_context("fork")
    with stack.api(workers=2) as base:
        target = _enqueue(base, 1)[0]
        with _profiled(stack, "quiet"):
            cpu = _api_cpu_s(stack)
            quiet_rate = _enqueue_rate(base, ENQUEUES)
            quiet_reads = quantiles(_read_latencies(base, target, READS))
            quiet_cpu = _api_cpu_s(stack) - cpu
        ids = _enqueue(base, waiters)
        ready, out = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=_waiters, args=(base, ids[i::WAITER_PROCS], ready, out))
                 for i in range(WAITER_PROCS)]
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=60)
        # Sent is not parked: reading and parking 1,000 requests takes the API seconds of CPU
        # on a busy machine, which the beside phase would otherwise count as the waiters' cost.
        wait_until(lambda: _parked(base) >= waiters, timeout=60, interval=0.1)
        time.sleep(0.5)
        with _profiled(stack, "beside"):
            cpu = _api_cpu_s(stack)
            held_rate = _enqueue_rate(base, ENQUEUES)
            held_reads = quantiles(_read_latencies(base, target, READS))
            held_cpu = _api_cpu_s(stack) - cpu
        with stack.workers(1, 16):
            answered: dict[str, tuple[float, str]] = {}
            for _ in procs:
                answered.update(out.get(timeout=WAIT_S + 30))
            wait_until(lambda: stack.count("queued", "running") == 0, timeout=60)
        for proc in procs:
            proc.join()
    finished = dict(stack.sql("SELECT id::text, extract(epoch FROM finished_at) "
                              "FROM taskline.jobs WHERE id = ANY(%s::uuid[])", ids))
    delays = [(at - float(finished[i])) * 1000 for i, (at, status) in answered.items()
              if status == "succeeded"]
    others = [status for _, status in answered.values() if status != "succeeded"]
    return {"waiters": waiters, "answered_succeeded": len(delays), "other_answers": others[:5],
            "enqueue_per_s": {"quiet": quiet_rate, "beside_waiters": held_rate,
                              "ratio": held_rate / quiet_rate},
            "other_requests_ms": {"quiet": quiet_reads, "beside_waiters": held_reads,
                                  "p99_ratio": held_reads["p99"] / quiet_reads["p99"]},
            "api_cpu_ms_per_request": {"quiet": quiet_cpu * 1000 / REQUESTS,
                                       "beside_waiters": held_cpu * 1000 / REQUESTS},
            "wake_up_ms": quantiles(delays) if delays else None,
            "within_10pct": (held_rate >= 0.9 * quiet_rate
                             and held_reads["p99"] <= 1.1 * quiet_reads["p99"])}
