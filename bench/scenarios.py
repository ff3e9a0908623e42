"""taskline's benchmark scenarios, each one measurement on a fresh database and Redis DB.

Invariant: a scenario measures only its steady part. Enqueue clocks start after every client
has connected and sent its warm-up requests; drain rates come from PostgreSQL's own
timestamps, from the lease start of the job after the first 5 % (the warm-up: process start,
first connections, first statements prepared) to the last completion, so the processes'
start-up is never timed. Each function returns a number, or a dict of numbers.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import threading
import time
from typing import Any

import cpu
import finished
import iojobs
import peers
from clients import Connection, enqueue_batches, post_concurrently
from stack import Stack, wait_until

NOOP = {"type": "bench.noop", "payload": {}}
WARMUP_SHARE = 0.05
# Handler threads per worker process for the drains. No-op jobs are bound by how many ids one
# claim takes (its free slots), so the drains use 64, as the Celery peer prefetches 64
# (docs/performance.md shows 16 and 32 too).
DRAIN_CONCURRENCY = int(os.environ.get("BENCH_WORKER_CONCURRENCY", "64"))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def quantiles(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "max": max(values), "n": len(values)}


# --- enqueue ---------------------------------------------------------------------------------

def enqueue_single(stack: Stack, jobs: int, clients: int) -> float:
    """Jobs/s of `clients` client processes POSTing one job per request."""
    stack.reset()
    with stack.api() as base:
        seconds = post_concurrently(base, "/api/v1/jobs", NOOP, jobs, clients, warmup=20,
                                    on_ready=lambda: stack.record_placement(base))
        stack.record_group_size(base)
    return jobs // clients * clients / seconds


def http_floor(stack: Stack, requests: int, clients: int) -> float:
    """Requests/s of the do-nothing Flask app (bench/floor_app.py) under the API's gunicorn
    settings, posting the single-enqueue body: the ceiling of enqueue_single on this machine."""
    with stack.http_floor() as base:
        seconds = post_concurrently(base, "/api/v1/jobs", NOOP, requests, clients, warmup=20,
                                    on_ready=lambda: stack.record_placement(base))
    return requests // clients * clients / seconds


def enqueue_batch(stack: Stack, jobs: int, clients: int = 2) -> float:
    """Jobs/s of `clients` client processes POSTing batches of 1,000."""
    stack.reset()
    with stack.api() as base:
        seconds = enqueue_batches(base, jobs, NOOP, clients=clients, warmup=1,
                                  on_ready=lambda: stack.record_placement(base))
    return jobs // 1000 // clients * clients * 1000 / seconds


# --- drain -----------------------------------------------------------------------------------

def _backlog(stack: Stack, jobs: int, failing_per_1000: int = 0,
             job_type: str = "bench.noop") -> None:
    stack.reset()
    batch = [{"type": job_type, "payload": {}}] * (1000 - failing_per_1000)
    batch += [{"type": "bench.fail", "max_retries": 0}] * failing_per_1000
    batches = jobs // 1000
    with stack.api() as base:  # one client when one batch: two would share it as 0 and 0
        post_concurrently(base, "/api/v1/jobs/batch", {"jobs": batch}, batches,
                          2 if batches % 2 == 0 else 1)


def steady_rate(stack: Stack) -> float:
    """Jobs/s between the lease start of the first job after the warm-up and the last outcome,
    both in PostgreSQL's clock."""
    leases = [r[0] for r in stack.sql(
        "SELECT leased_at FROM taskline.job_leases ORDER BY leased_at")]
    last = stack.sql("SELECT max(updated_at) FROM taskline.jobs")[0][0]
    skip = int(len(leases) * WARMUP_SHARE)
    return (len(leases) - skip) / (last - leases[skip]).total_seconds()


def drain(stack: Stack, jobs: int, workers: int, failing_per_1000: int = 0,
          job_type: str = "bench.noop", concurrency: int = 0) -> float:
    """Jobs/s of `workers` worker processes (`concurrency` handler threads each, else
    DRAIN_CONCURRENCY) draining a backlog of `jobs` jobs of `job_type`; its CPU per job by
    component is left in `stack.last_cpu`."""
    _backlog(stack, jobs, failing_per_1000, job_type)
    with stack.workers(workers, concurrency or DRAIN_CONCURRENCY) as procs, \
            cpu.sampled(cpu.probes([p.pid for p in procs], stack.postmaster_pid(),
                                   stack.redis_pid())) as sampler:
        wait_drained(stack, jobs)
    stack.last_cpu = drain_cpu(stack, sampler, jobs)
    if failing_per_1000:
        dead = stack.count("dead")
        if dead != jobs // 1000 * failing_per_1000:
            raise RuntimeError(f"mixed run: {dead} dead jobs, expected 1 %")
    if job_type.startswith("bench.redis") and int(stack.redis.get(iojobs.COUNTER) or 0) < jobs:
        raise RuntimeError(f"{stack.redis.get(iojobs.COUNTER)} of {jobs} jobs made their call")
    return steady_rate(stack)


def wait_drained(stack: Stack, jobs: int, timeout: float = 1200) -> None:
    """Until `jobs` jobs have succeeded or gone dead, polled ten times a second by reads that
    do not load the drain they wait for (bench/finished.py)."""
    with finished.taskline(stack, jobs) as done:
        wait_until(lambda: done() >= jobs, timeout=timeout, interval=0.1)


def drain_cpu(stack: Stack, sampler: cpu.CpuSampler, jobs: int) -> dict[str, float]:
    """CPU ms per job by component, from the drain's first claim to its last outcome's
    commit (bench/cpu.py)."""
    first, last = stack.sql("SELECT extract(epoch FROM min(leased_at)), "
                            "extract(epoch FROM (SELECT max(updated_at) FROM taskline.jobs)) "
                            "FROM taskline.job_leases")[0]
    return sampler.per_job_ms(float(first), float(last), jobs)


def default_concurrency() -> int:
    """`taskline worker`'s --concurrency when none is given, read from the CLI itself."""
    from taskline_cli.main import build_parser
    return build_parser().parse_args(["worker"]).concurrency


# --- latency ---------------------------------------------------------------------------------

def idle_workers(stack: Stack, count: int) -> None:
    live = "SELECT count(*) FROM taskline.workers WHERE stopped_at IS NULL"
    wait_until(lambda: stack.sql(live)[0][0] >= count, timeout=60, interval=0.05)
    time.sleep(1.0)  # past their first fetch: blocked in Redis, waiting for work


def pickup(stack: Stack, jobs: int = 300, spacing_s: float = 0.02) -> dict[str, Any]:
    """An idle worker's pickup latency, ms, three ways (see docs/performance.md)."""
    stack.reset()
    sent, answered = {}, {}
    with stack.api() as base, stack.workers(1, 4):
        idle_workers(stack, 1)
        conn = Connection(base)
        body = b'{"type": "bench.stamp", "payload": {}}'
        for _ in range(jobs):
            t0 = time.time()
            job = conn.post("/api/v1/jobs", body)
            answered[job["id"]], sent[job["id"]] = time.time(), t0
            time.sleep(spacing_s)
        conn.close()
        wait_until(lambda: stack.count("succeeded") >= jobs, timeout=60)
    rows = stack.sql("SELECT j.id::text, (j.result->>'started')::float8, "
                     "extract(epoch FROM l.leased_at - j.created_at) * 1000 "
                     "FROM taskline.jobs j JOIN taskline.job_leases l ON l.job_id = j.id")
    return {"from_201_ms": quantiles([(r[1] - answered[r[0]]) * 1000 for r in rows]),
            "from_request_ms": quantiles([(r[1] - sent[r[0]]) * 1000 for r in rows]),
            # The part from_201 leaves out: a sooner 201 lengthens from_201 alone.
            "request_to_201_ms": quantiles([(answered[r[0]] - sent[r[0]]) * 1000
                                            for r in rows]),
            "pg_created_to_lease_ms": quantiles([float(r[2]) for r in rows])}


def _paced_producer(base: str, rate: float, seconds: float, out: dict[str, float],
                    deadline: bool = False, tick: float = 0.01) -> None:
    """Open loop: a batch every `tick` s on an absolute schedule, `rate` jobs/s in all. With
    `deadline`, it stops after `seconds` even when it fell behind the schedule (the achieved
    rate then says by how much)."""
    per_tick = max(1, round(rate * tick))
    body = ('{"jobs": [' + ",".join(['{"type": "bench.noop", "payload": {}}'] * per_tick)
            + "]}").encode()
    conn = Connection(base)
    start = time.perf_counter()
    ticks = int(seconds / tick)
    sent = 0
    for i in range(ticks):
        delay = start + i * tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        elif deadline and time.perf_counter() - start >= seconds:
            break
        conn.post("/api/v1/jobs/batch", body)
        sent += 1
    out["achieved_jobs_per_s"] = sent * per_tick / (time.perf_counter() - start)
    conn.close()


def steady_latency(stack: Stack, peak: float, seconds: float = 10.0) -> dict[str, Any]:
    """End-to-end latency (PostgreSQL clock: row created to outcome written) at half of `peak`,
    with 2 worker processes."""
    stack.reset()
    out: dict[str, Any] = {"target_jobs_per_s": peak / 2}
    with stack.api() as base, stack.workers(2, DRAIN_CONCURRENCY):
        idle_workers(stack, 2)
        producer = threading.Thread(target=_paced_producer, args=(base, peak / 2, seconds, out))
        producer.start()
        producer.join()
        total = stack.count("queued", "running", "succeeded")
        wait_until(lambda: stack.count("succeeded") >= total, timeout=120)
    ms = [float(r[0]) for r in stack.sql(
        "SELECT extract(epoch FROM updated_at - created_at) * 1000 FROM taskline.jobs")]
    skip = int(len(ms) * WARMUP_SHARE)
    out["e2e_ms"] = quantiles(ms[skip:])
    return out


# --- pgqueuer's enqueue, beside enqueue_single_1_client, enqueue_batch, pickup_idle_worker --

def pgqueuer_enqueue(stack: Stack, jobs: int) -> dict[str, Any]:
    """pgqueuer's single enqueue (one producer, autocommit, one job per call, up to 1,000
    jobs), bulk enqueue (2 producers, calls of 1,000: enqueue_batch's clients) in jobs/s, and
    the enqueue call to handler start of one idle consumer, ms (pickup_idle_worker's 300 jobs
    20 ms apart; `from_call_ms` is the counterpart of taskline's from_request_ms)."""
    single = peers.pgqueuer_enqueue(stack, min(jobs, 1000), 1, 1)
    bulk = peers.pgqueuer_enqueue(stack, max(jobs, 2000), 1000, 2)
    times = peers.pgqueuer_pickup(stack)
    return {"single_1_producer_jobs_per_s": single, "bulk_2_producers_jobs_per_s": bulk,
            "pickup_from_call_ms": quantiles([(s - t0) * 1000 for t0, _, s in times]),
            "pickup_from_return_ms": quantiles([(s - t1) * 1000 for _, t1, s in times])}


# --- recovery --------------------------------------------------------------------------------

def killed_worker(stack: Stack) -> float:
    """Seconds from SIGKILL of the worker running a job to that job's next lease, with default
    settings (lease 15 s, reaper every 5 s), one other worker and maintenance running."""
    stack.reset()
    with stack.api() as base, stack.process("maintenance"), stack.workers(2, 4) as procs:
        idle_workers(stack, 2)
        conn = Connection(base)
        job = conn.post("/api/v1/jobs", b'{"type": "simulate", "payload": {"sleep_s": 60}}')
        conn.close()
        wait_until(lambda: stack.count("running") == 1, timeout=30)
        pid = stack.sql("SELECT w.pid FROM taskline.job_leases l JOIN taskline.workers w ON "
                        "w.id = l.worker_id "
                        "WHERE l.job_id = %s", job["id"])[0][0]
        victim = next(p for p in procs if p.pid == pid)
        killed_at = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        wait_until(lambda: _attempts(stack, job["id"]) >= 2, timeout=120, interval=0.05)
        second = stack.sql("SELECT extract(epoch FROM max(leased_at)) FROM taskline.job_leases "
                           "WHERE job_id = %s", job["id"])[0][0]
    return float(second) - killed_at


def _attempts(stack: Stack, job_id: str) -> int:
    return stack.sql("SELECT count(*) FROM taskline.job_leases WHERE job_id = %s", job_id)[0][0]


# --- memory ----------------------------------------------------------------------------------

def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def memory(stack: Stack, jobs: int) -> dict[str, Any]:
    """RSS of one worker process (DRAIN_CONCURRENCY threads) sampled every 2 s while it drains
    `jobs` jobs, enqueued by a batch client alongside."""
    stack.reset()
    samples: list[tuple[int, int]] = []
    with stack.api() as base, stack.workers(1, DRAIN_CONCURRENCY) as procs:
        filler = threading.Thread(target=enqueue_batches, args=(base, jobs, NOOP),
                                  kwargs={"clients": 1})
        filler.start()
        while (done := stack.count("succeeded")) < jobs:
            samples.append((done, rss_kib(procs[0].pid)))
            time.sleep(2)
        filler.join()
        samples.append((jobs, rss_kib(procs[0].pid)))
    later = [kib for done, kib in samples if done >= jobs // 10]
    return {"jobs": jobs, "samples_done_rss_kib": samples,
            "rss_mib_after_10pct": {"min": min(later) / 1024, "max": max(later) / 1024,
                                    "median": statistics.median(later) / 1024}}


# --- reconciliation --------------------------------------------------------------------------

def reconcile(stack: Stack, jobs: int) -> dict[str, float]:
    """Seconds of one reconciliation pass over `jobs` queued jobs: with Redis empty (every id
    restored), then again with Redis in step (nothing to repair)."""
    from taskline.dispatch.dispatcher import Dispatcher
    from taskline.settings import Settings
    from taskline.store.store import Store
    from taskline_maintenance.reconciler import Reconciler

    stack.reset()
    stack.sql("INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, max_retries, "
              "timeout_s, next_run_at, created_at, updated_at) "
              "SELECT gen_random_uuid(), 'bench.noop', 'default', '{}', 5, 'queued', 3, 300, "
              "now() - interval '1 minute', now() - interval '1 minute', "
              "now() - interval '1 minute' FROM generate_series(1, %s) RETURNING 1", jobs)
    settings = Settings.from_env(stack.env())
    store = Store.connect(settings.database_url, schema=settings.schema)
    dispatcher = Dispatcher(settings.redis_url, partitions=settings.queue_partitions)
    try:
        passes = {}
        for name in ("redis_empty_s", "in_step_s"):
            started = time.perf_counter()
            Reconciler(store, dispatcher, settings, strand_pause_s=0).run_once()
            passes[name] = time.perf_counter() - started
        ready = sum(stack.redis.llen(k) for k in stack.redis.keys("taskline:{default}:ready:*"))
        if ready != jobs:
            raise RuntimeError(f"reconciliation restored {ready} of {jobs} ids")
        return passes
    finally:
        store.dispose()


# --- slow clients ----------------------------------------------------------------------------

SLOW_KINDS = (b"", b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Slow: 1\r\n",
              b"POST /api/v1/jobs HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{\"type\"")


def slow_clients(stack: Stack, held: int, seconds: float = 3.0) -> dict[str, float]:
    """Latency (ms) of normal requests, one at a time, while `held` connections stay open
    silent, with half a head, or with half a body (a third each): the API reads requests on
    its event loop, so the held ones take no thread. `held_closed` counts the held connections
    the API had closed once the header and body deadlines (10 s and 30 s) passed."""
    stack.reset()
    with stack.api() as base:
        host, port = base.rsplit("/", 1)[-1].split(":")
        sockets = [_slow_connection(host, int(port), SLOW_KINDS[i % 3]) for i in range(held)]
        try:
            latencies = _time_requests(base, seconds)
            closed = _closed_within(sockets, 40.0)
        finally:
            for sock in sockets:
                sock.close()
    return {**{k: v * 1000 if k != "n" else v for k, v in quantiles(latencies).items()},
            "held": held, "held_closed": closed}


def _slow_connection(host: str, port: int, sent: bytes) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    if sent:
        sock.sendall(sent)
    return sock


def _time_requests(base: str, seconds: float) -> list[float]:
    import requests  # only this scenario sends single requests with a client library

    latencies: list[float] = []
    end = time.monotonic() + seconds
    with requests.Session() as session:
        while time.monotonic() < end:
            started = time.perf_counter()
            session.get(f"{base}/healthz", timeout=10).raise_for_status()
            session.post(f"{base}/api/v1/jobs", json=NOOP, timeout=10).raise_for_status()
            latencies.append((time.perf_counter() - started) / 2)
    return latencies


def _closed_within(sockets: list[socket.socket], seconds: float) -> int:
    """How many of `sockets` the server closes within `seconds` (what it sends is dropped)."""
    import selectors

    watch = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        watch.register(sock, selectors.EVENT_READ)
    closed, end = 0, time.monotonic() + seconds
    while closed < len(sockets) and (left := end - time.monotonic()) > 0:
        for key, _ in watch.select(left):
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data:
                watch.unregister(key.fileobj)
                closed += 1
    watch.close()
    return closed
# --- retention -------------------------------------------------------------------------------

HISTORY_TABLES = ("jobs", "job_events", "job_leases", "dead_letter_jobs")
SOAK_RETAIN_S = 60
SOAK_PRODUCERS = 4
SOAK_TICK_S = 0.1
"""The soak's offered load comes from SOAK_PRODUCERS paced clients, each a batch every
SOAK_TICK_S: one client waiting out each request's latency fell short of the rate by 20 - 35 %,
and by more or less as the machine's load moved, so the kept set, and the tables with it,
followed the client rather than retention. Batches of a tenth of a second's share keep the
API's per-request cost (which the drain rate the load is half of never paid) small."""
STEADY_VARIATION = 0.10
DEAD_PEAK_RATIO = 1.25


def table_sizes(stack: Stack) -> dict[str, dict[str, int]]:
    """Each history table's total size with its indexes (bytes), dead and live tuples, how
    many times autovacuum has vacuumed it and rows deleted since the server started; a
    partitioned table's partitions added up (migration 0021: its vacuums are those of its
    partitions)."""
    rows = stack.sql("SELECT COALESCE(r.relname, s.relname) AS name, "
                     "sum(pg_total_relation_size(s.relid)), sum(s.n_dead_tup), "
                     "sum(s.n_live_tup), sum(s.autovacuum_count), sum(s.n_tup_del) "
                     "FROM pg_stat_user_tables s "
                     "LEFT JOIN pg_class r ON r.oid = pg_partition_root(s.relid) "
                     "AND r.oid <> s.relid GROUP BY 1 HAVING COALESCE(r.relname, s.relname) "
                     "= ANY(%s)", list(HISTORY_TABLES))
    return {r[0]: {"bytes": int(r[1]), "dead": int(r[2]), "live": int(r[3]),
                   "vacuums": int(r[4]), "deleted": int(r[5])} for r in rows}


def kept_census(stack: Stack) -> dict[str, Any]:
    """What the kept set is made of: jobs per status, how far past its retention the oldest
    succeeded job is (retention's lag, s), and jobs created in the last 30 s (the producer's
    achieved rate then): the causes a table's size follows."""
    by_status = {r[0]: int(r[1]) for r in stack.sql(
        "SELECT status, count(*) FROM taskline.jobs GROUP BY status")}
    lag, recent = stack.sql(
        "SELECT extract(epoch FROM now() - min(finished_at) FILTER (WHERE status = 'succeeded'))"
        " - %s, count(*) FILTER (WHERE created_at > now() - interval '30 s') FROM taskline.jobs",
        SOAK_RETAIN_S)[0]
    return {"by_status": by_status, "lag_s": round(float(lag or 0), 1),
            "created_per_s": round(int(recent) / 30)}


def variation(values: list[int]) -> float:
    """(max - min) / max: 0 for a flat series."""
    top = max(values)
    return (top - min(values)) / top if top else 0.0


def _judge(samples: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """Over the last `window_s`: each table's size (with indexes) varies by less than 10 %.
    Dead tuples are a saw-tooth (each retention pass makes a batch of them, autovacuum cuts
    them to 0), so their variation is near 100 % by nature and is only reported; they count as
    bounded when the second half's peak is at most 1.25 x the first half's (a peak sampled
    every 30 s moves with the phase of the sampling by 10 - 20 %). Growth that autovacuum
    did not keep up with would show in the sizes: space it frees is reused."""
    last = [s for s in samples if s["t"] >= samples[-1]["t"] - window_s]
    half = len(last) // 2
    verdict: dict[str, Any] = {}
    for table in HISTORY_TABLES:
        sizes = [s["tables"][table]["bytes"] for s in last]
        dead = [s["tables"][table]["dead"] for s in last]
        early, late = max(dead[:half] or [0]), max(dead[half:] or [0])
        verdict[table] = {"size_variation": round(variation(sizes), 4),
                          "dead_variation": round(variation(dead), 4),
                          "dead_peak_ratio": round(late / early, 3) if early else None,
                          "size_steady": variation(sizes) < STEADY_VARIATION,
                          "dead_bounded": late <= max(early * DEAD_PEAK_RATIO, 1000)}
    verdict["steady"] = all(v["size_steady"] and v["dead_bounded"]
                            for k, v in verdict.items() if k in HISTORY_TABLES)
    return verdict


def _print_sample(sample: dict[str, Any]) -> None:
    cells = "  ".join(f"{t} {v['bytes'] / 2**20:7.1f} MiB dead {v['dead']:7d} live {v['live']:8d}"
                      f" vac {v['vacuums']}" for t, v in sample["tables"].items())
    kept = sample["kept"]
    print(f"  retention soak t={sample['t']:6.0f}s  {cells}", flush=True)
    print(f"  {'':19s}kept {kept['by_status']}  retention lag {kept['lag_s']} s  "
          f"created {kept['created_per_s']} jobs/s", flush=True)


def retention_soak(stack: Stack, rate: float, seconds: float, window_s: float,
                   sample_s: float) -> dict[str, Any]:
    """Offered load of `rate` jobs/s for `seconds` with TASKLINE_RETAIN_SUCCEEDED_S=60 (api,
    2 workers, maintenance): every `sample_s` each history table's size and dead tuples, then
    the judgement over the last `window_s`."""
    stack.reset()
    stack.extra_env["TASKLINE_RETAIN_SUCCEEDED_S"] = str(SOAK_RETAIN_S)
    samples: list[dict[str, Any]] = []
    out: dict[str, Any] = {"offered_jobs_per_s": rate, "seconds": seconds,
                           "retain_succeeded_s": SOAK_RETAIN_S}
    try:
        with (stack.api() as base, stack.process("maintenance"),
              stack.workers(2, DRAIN_CONCURRENCY)):
            idle_workers(stack, 2)
            shares: list[dict[str, float]] = [{} for _ in range(SOAK_PRODUCERS)]
            producers = [threading.Thread(target=_paced_producer, args=(
                base, rate / SOAK_PRODUCERS, seconds, share, True, SOAK_TICK_S))
                for share in shares]
            started = time.monotonic()
            for producer in producers:
                producer.start()
            while running := [p for p in producers if p.is_alive()]:
                samples.append({"t": time.monotonic() - started, "tables": table_sizes(stack),
                                "kept": kept_census(stack)})
                _print_sample(samples[-1])
                running[0].join(sample_s)
            out["achieved_jobs_per_s"] = sum(s.get("achieved_jobs_per_s", 0) for s in shares)
    finally:
        del stack.extra_env["TASKLINE_RETAIN_SUCCEEDED_S"]
    out["jobs_offered"] = round(out.get("achieved_jobs_per_s", 0) * seconds)
    out["jobs_kept_at_end"] = stack.sql("SELECT count(*) FROM taskline.jobs")[0][0]
    out["samples"] = samples
    out["verdict"] = _judge(samples, window_s)
    return out


def _history(stack: Stack, jobs: int) -> None:
    """`jobs` succeeded jobs that finished an hour ago, with 3 events and a lease each: work
    for retention while a drain runs."""
    # WITH ... SELECT count(*): stack.sql fetches rows, and the inserts return none.
    stack.sql("WITH ins AS (INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, "
              "attempts, max_retries, timeout_s, created_at, updated_at, finished_at) "
              "SELECT gen_random_uuid(), 'bench.history', 'default', '{}', 5, 'succeeded', 1, "
              "3, 300, now() - interval '1 hour', now() - interval '1 hour', "
              "now() - interval '1 hour' FROM generate_series(1, %s) RETURNING 1) "
              "SELECT count(*) FROM ins", jobs)
    stack.sql("WITH ins AS (INSERT INTO taskline.job_events (job_id, attempt, event) "
              "SELECT id, e, 'x' FROM taskline.jobs, generate_series(1, 3) AS e "
              "WHERE type = 'bench.history' RETURNING 1) SELECT count(*) FROM ins")
    stack.sql("WITH ins AS (INSERT INTO taskline.job_leases (job_id, attempt, worker_id, "
              "leased_at, "
              "leased_until, released_at, outcome) SELECT id, 1, 'w', "
              "now() - interval '1 hour', now(), now() - interval '1 hour', 'succeeded' "
              "FROM taskline.jobs WHERE type = 'bench.history' RETURNING 1) SELECT count(*) "
              "FROM ins")


def _noop_rate(stack: Stack) -> float:
    """steady_rate over the drained no-op jobs only (history rows are not the drain's)."""
    leases = [r[0] for r in stack.sql(
        "SELECT l.leased_at FROM taskline.job_leases l JOIN taskline.jobs j ON j.id = l.job_id "
        "WHERE j.type = 'bench.noop' ORDER BY l.leased_at")]
    last = stack.sql("SELECT max(updated_at) FROM taskline.jobs WHERE type = 'bench.noop'")[0][0]
    skip = int(len(leases) * WARMUP_SHARE)
    return (len(leases) - skip) / (last - leases[skip]).total_seconds()


HISTORY_PER_JOB = 1
"""Expired history jobs beside each drained job in the retention pairs: in a steady state
retention deletes one finished job for every job that finishes (docs/performance.md)."""


def drain_beside_retention(stack: Stack, jobs: int, retain_s: int) -> dict[str, float]:
    """Jobs/s of 2 workers draining `jobs` no-op jobs while maintenance runs with
    TASKLINE_RETAIN_SUCCEEDED_S=`retain_s` (0: off) over HISTORY_PER_JOB x `jobs` expired
    history jobs."""
    _backlog(stack, jobs)
    _history(stack, jobs * HISTORY_PER_JOB)
    stack.extra_env["TASKLINE_RETAIN_SUCCEEDED_S"] = str(retain_s)
    try:
        with stack.process("maintenance"):
            # Workers start once maintenance leads: its first retention pass, at once, then
            # deletes the history while they drain (both arms wait alike).
            wait_until(lambda: stack.sql("SELECT count(*) FROM taskline.leader_leases")[0][0] > 0,
                       timeout=60, interval=0.05)
            return _drain_noop(stack, jobs)
    finally:
        del stack.extra_env["TASKLINE_RETAIN_SUCCEEDED_S"]


def _drain_noop(stack: Stack, jobs: int) -> dict[str, float]:
    with stack.workers(2, DRAIN_CONCURRENCY):
        wait_until(lambda: stack.sql("SELECT count(*) FROM taskline.jobs WHERE type = 'bench.noop' "
                                     "AND status = 'succeeded'")[0][0] >= jobs,
                   timeout=1200, interval=0.1)
        left = stack.sql("SELECT count(*) FROM taskline.jobs WHERE type = 'bench.history'")[0][0]
    return {"jobs_per_s": _noop_rate(stack), "history_deleted": jobs * HISTORY_PER_JOB - left}


def retention_pairs(stack: Stack, jobs: int, pairs: int) -> dict[str, Any]:
    """Drain with retention on (60 s, deleting the history meanwhile) and off, in interleaved
    pairs (the order alternating); the ratio on/off per pair."""
    ratios, runs = [], []
    for i in range(pairs):
        order = (SOAK_RETAIN_S, 0) if i % 2 == 0 else (0, SOAK_RETAIN_S)
        result = {retain: drain_beside_retention(stack, jobs, retain) for retain in order}
        runs.append({"on": result[SOAK_RETAIN_S], "off": result[0]})
        ratios.append(result[SOAK_RETAIN_S]["jobs_per_s"] / result[0]["jobs_per_s"])
        print(f"  retention pair {i + 1}: on {result[SOAK_RETAIN_S]['jobs_per_s']:.0f} jobs/s "
              f"(history deleted meanwhile: {result[SOAK_RETAIN_S]['history_deleted']}), "
              f"off {result[0]['jobs_per_s']:.0f} jobs/s, ratio {ratios[-1]:.3f}", flush=True)
    return {"pairs": runs, "ratio_on_over_off": {
        "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
        "runs": ratios}, "within_10pct": abs(statistics.median(ratios) - 1) <= STEADY_VARIATION}
