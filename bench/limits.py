"""The flow-limit scenarios of `make bench` (`--only limits`): what a limit costs the work it does
not limit, whether it holds exactly, what an idle worker waiting on it spends, and how fast
another tenant's jobs start beside one tenant's backlog.

- `beside`: a backlog of `bench.redis` jobs drained by 2 x 8 slots, alone and with the same
  number of `bench.sleep10` jobs of a type limited to concurrency 2 in the same queue
  (interleaved, `pairs` times); the unlimited type's rate is read from its own leases.
- `rate_60s`: a rate limit of 100 per 1 s on `bench.noop`, 4 worker processes, 60 s: starts in
  the 60 s and the busiest sliding 1 s window, from `job_leases`.
- `idle`: one worker whose only work is held behind a full concurrency budget (held by a lease
  written in SQL, so no other process runs): its CPU share and the Redis commands it sends
  (Redis's own count) over 60 s.
- `fairness`: `per_key` concurrency 2, 8 slots; tenant A's 10,000 jobs of 100 ms queued first,
  then tenant B's 10: how long B's first job waits, and its last.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections import Counter
from typing import Any

import requests
from clients import post_concurrently
from scenarios import WARMUP_SHARE
from stack import Stack, wait_until

from tests.faults.checker import busiest_window  # the fault checker's own judge of a window

SLOTS = 8
HZ = os.sysconf("SC_CLK_TCK")


def put_limit(base: str, scope: str, body: dict[str, Any]) -> None:
    answer = requests.put(f"{base}/api/v1/limits/{scope}", json=body, timeout=10)
    answer.raise_for_status()


def _type_rate(stack: Stack, job_type: str) -> float:
    """Jobs/s of one type: its leases after the warm-up, to its last outcome."""
    leases = [r[0] for r in stack.sql(
        "SELECT l.leased_at FROM taskline.job_leases l JOIN taskline.jobs j ON j.id = l.job_id "
        "WHERE j.type = %s ORDER BY l.leased_at", job_type)]
    last = stack.sql("SELECT max(updated_at) FROM taskline.jobs WHERE type = %s AND status = "
                     "'succeeded'",
                     job_type)[0][0]
    skip = int(len(leases) * WARMUP_SHARE)
    return (len(leases) - skip) / (last - leases[skip]).total_seconds()


def _beside_once(stack: Stack, jobs: int, limited: bool) -> float:
    stack.reset()
    with stack.api() as base:
        if limited:
            put_limit(base, "type:bench.sleep10", {"concurrency": 2})
            post_concurrently(base, "/api/v1/jobs/batch",
                              {"jobs": [{"type": "bench.sleep10"}] * 1000}, jobs // 1000, 2)
        post_concurrently(base, "/api/v1/jobs/batch", {"jobs": [{"type": "bench.redis"}] * 1000},
                          jobs // 1000, 2)
    with stack.workers(2, SLOTS):
        wait_until(lambda: stack.sql("SELECT count(*) FROM taskline.jobs WHERE type = "
                                     "'bench.redis' "
                                     "AND status = 'succeeded'")[0][0] >= jobs,
                   timeout=600, interval=0.1)
    return _type_rate(stack, "bench.redis")


def beside(stack: Stack, jobs: int, pairs: int) -> dict[str, Any]:
    ratios, alone, mixed = [], [], []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        rates = {flag: _beside_once(stack, jobs, flag) for flag in order}
        alone.append(rates[False])
        mixed.append(rates[True])
        ratios.append(rates[True] / rates[False])
    return {"unlimited_alone": _stats(alone), "unlimited_beside_limited": _stats(mixed),
            "ratio": _stats(ratios)}


def rate_60s(stack: Stack, seconds: float = 60.0) -> dict[str, Any]:
    stack.reset()
    with stack.api() as base:
        put_limit(base, "type:bench.noop", {"rate": {"limit": 100, "period_s": 1}})
        post_concurrently(base, "/api/v1/jobs/batch", {"jobs": [{"type": "bench.noop"}] * 1000},
                          8, 2)
    with stack.workers(4, SLOTS):
        wait_until(lambda: stack.count("succeeded") > 0, timeout=60, interval=0.02)
        time.sleep(seconds + 1.0)
    starts = [r[0] for r in stack.sql(
        "SELECT leased_at FROM taskline.job_leases ORDER BY leased_at")]
    first = starts[0]
    inside = [t for t in starts if (t - first).total_seconds() < seconds]
    return {"starts_in_60s": len(inside), "busiest_1s_window": busiest_window(inside, 1.0)}


def idle(stack: Stack, seconds: float = 60.0) -> dict[str, Any]:
    stack.reset()
    with stack.api() as base:
        put_limit(base, "type:bench.noop", {"concurrency": 1})
        post_concurrently(base, "/api/v1/jobs/batch", {"jobs": [{"type": "bench.noop"}] * 2},
                          1, 1)
    # The budget is held by a running job no process runs: its lease stays open.
    holder = stack.sql("SELECT id FROM taskline.jobs ORDER BY created_at LIMIT 1")[0][0]
    stack.sql("UPDATE taskline.jobs SET status = 'running', attempts = 1 "
              "WHERE id = %s RETURNING id", holder)
    stack.sql("INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, "
              "leased_until) "
              "VALUES (%s, 1, 'bench-holder', now(), now() + interval '1 hour') RETURNING id",
              holder)
    with stack.workers(1, SLOTS) as (worker,):
        time.sleep(5.0)  # started, fetched and refused the held id, settled into waiting
        cpu0, t0 = _cpu_s(worker.pid), time.monotonic()
        commands = _commands_seen(stack, seconds)
        cpu1, t1 = _cpu_s(worker.pid), time.monotonic()
    elapsed = t1 - t0
    return {"cpu_share_of_a_core": round((cpu1 - cpu0) / elapsed, 4),
            "redis_commands_per_s": round(sum(commands.values()) / seconds, 2),
            "redis_commands": dict(commands)}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def _commands_seen(stack: Stack, seconds: float) -> Counter[str]:
    """The commands clients sent to the benchmark's Redis DB for `seconds`, by name, as MONITOR
    shows them (the server is shared: its global counters would count other DBs' clients too)."""
    db = stack.redis.connection_pool.connection_kwargs.get("db", 0)
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    with stack.redis.monitor() as monitor:
        for item in monitor.listen():
            # Commands a script runs show as sent by "lua": not the client's round trips.
            if int(item.get("db", -1)) == db and item.get("client_type") != "lua":
                seen[str(item["command"]).split(" ", 1)[0].upper()] += 1
            if time.monotonic() >= deadline:
                break
    return seen


def fairness(stack: Stack, duration_s: float = 0.1) -> dict[str, Any]:
    stack.reset()
    with stack.api() as base:
        put_limit(base, "type:bench.sleep", {"concurrency": 2, "per_key": True})
        body = {"type": "bench.sleep", "payload": {"s": duration_s}, "limit_key": "tenant-a"}
        post_concurrently(base, "/api/v1/jobs/batch", {"jobs": [body] * 1000}, 10, 2)
        with stack.workers(1, SLOTS):
            wait_until(lambda: stack.count("succeeded") >= 4, timeout=60, interval=0.02)
            tenant_b = [{**body, "limit_key": "tenant-b", "payload": {"s": duration_s,
                                                                       "n": str(uuid.uuid4())}}]
            post_concurrently(base, "/api/v1/jobs/batch", {"jobs": tenant_b * 10}, 1, 1)
            wait_until(lambda: stack.sql("SELECT count(*) FROM taskline.jobs WHERE limit_key = "
                                         "'tenant-b' AND status = 'succeeded'")[0][0] >= 10,
                       timeout=120, interval=0.02)
    waits = [float(r[0]) for r in stack.sql(
        "SELECT extract(epoch FROM l.leased_at - j.created_at) FROM taskline.jobs j "
        "JOIN taskline.job_leases l ON l.job_id = j.id WHERE j.limit_key = 'tenant-b' ORDER BY 1")]
    return {"job_duration_s": duration_s, "tenant_b_first_start_s": round(waits[0], 4),
            "tenant_b_last_start_s": round(waits[-1], 4)}


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": [round(v, 3) for v in values]}


def run_all(stack: Stack, jobs: int, pairs: int) -> dict[str, Any]:
    scenarios = {"fairness": fairness, "idle": idle, "rate_60s": rate_60s,
                 "beside": lambda s: beside(s, jobs, pairs)}
    results = {}
    for name, scenario in scenarios.items():
        results[name] = scenario(stack)
        print(f"limits {name:10s} {results[name]}", flush=True)
    return results
