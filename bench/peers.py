"""Celery, Dramatiq and pgqueuer draining the same backlog as taskline, measured like taskline.

Invariant: each peer's backlog is enqueued before its workers start, and its rate is taken
between the moment 5 % of the backlog is done (start-up and warm-up excluded, as for taskline)
and the moment nothing is left unacknowledged: for Celery and Dramatiq as their Redis keys show
it, polled every 5 ms; for pgqueuer by the timestamps of its log (picks and acknowledgements),
as taskline's are read from its leases and outcomes, its end polled ten times a second by
reads that do not load its tables (bench/finished.py), as taskline's. Every peer runs the same
job bodies (bench/iojobs.py): `noop`, `redis` (one Redis round trip; the counter it increments
must reach the backlog's size) and `sleep10`.

Worker setups: the no-op drain keeps each peer's documented short-task setup (peer_celery.py,
peer_dramatiq.py; pgqueuer's defaults, one consumer per core). The I/O drains give every
system the same processes x slots: Dramatiq `--processes P --threads S`; Celery P `celery
worker` processes with `-P threads -c S` (its concurrency guide points I/O-bound work away
from prefork, to green threads; threads run the same blocking job body without
monkey-patching, as taskline's and Dramatiq's threads do); pgqueuer P consumer processes with
`max_concurrent_tasks` S (an entrypoint's `concurrency_limit` is global across all consumers,
pgqueuer's concurrency guide) and the largest `batch_size` it accepts with that cap, S / 2
(peer_pgqueuer.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from urllib.parse import urlsplit, urlunsplit

import cpu
import finished
import psycopg
from iojobs import COUNTER
from stack import BENCH_DIR, Stack, stop

CORES = str(os.cpu_count() or 2)
PGQ_DB = "pgqueuer_bench"


def _env(stack: Stack, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["BENCH_REDIS_URL"] = stack.redis_url
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", ""))
                                        if p)
    env.update(extra)
    return env


def _timed(remaining: Callable[[], int], jobs: int, timeout: float = 1200,
           span: list[float] | None = None, poll_s: float = 0.005) -> float:
    """Jobs/s from 5 % done to all done, `remaining` polled every `poll_s`; `span` receives the
    wall times of the first pickup and the last acknowledgement (as the polls saw them)."""
    deadline = time.monotonic() + timeout
    started = first = None
    while (left := remaining()) > 0:
        if first is None and left < jobs:
            first = time.time()
        if started is None and left <= jobs * 0.95:
            started = time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError("peer drain did not finish")
        time.sleep(poll_s)
    ended = time.perf_counter()
    if span is not None:
        last = time.time()
        span[:] = [first or last, last]
    return jobs * 0.95 / (ended - (started or ended))


Timing = Callable[[], tuple[float, list[float]]]
"""A drain's jobs/s and window (first pickup, last acknowledgement; epoch seconds), read from
the peer's own records once it has ended."""


def _run_workers(stack: Stack, argvs: list[list[str]], remaining: Callable[[], int], jobs: int,
                 handler: str, env: dict[str, str], timing: Timing | None = None) -> float:
    """Start every worker process, time the drain, stop them (each by its own PID), and check
    that a `redis` backlog really ran (after the stop: Celery acknowledges before it runs).
    With `timing`, the rate and the window are the peer's own timestamps, as taskline's are,
    and the end is polled ten times a second instead of every 5 ms."""
    if remaining() != jobs:
        raise RuntimeError(f"peer backlog holds {remaining()} of {jobs} messages")
    span: list[float] = []
    with ExitStack() as procs:
        pids = []
        for argv in argvs:
            proc = subprocess.Popen(argv, env=env, cwd=BENCH_DIR, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            procs.callback(stop, proc)
            pids.append(proc.pid)
        sampler = procs.enter_context(cpu.sampled(cpu.probes(
            pids, stack.postmaster_pid(), stack.redis_pid())))
        rate = _timed(remaining, jobs, span=span, poll_s=0.005 if timing is None else 0.1)
        if timing is not None:
            rate, span = timing()
    # The same components and window as taskline's drains (bench/cpu.py).
    stack.last_cpu = sampler.per_job_ms(span[0], span[1], jobs)
    if handler == "redis" and int(stack.redis.get(COUNTER) or 0) < jobs:
        raise RuntimeError(f"{argvs[0][2]}: {stack.redis.get(COUNTER)} of {jobs} jobs ran")
    return rate


def _drain(stack: Stack, argvs: list[list[str]], enqueue: str, remaining: Callable[[], int],
           jobs: int, handler: str) -> float:
    stack.redis.flushdb()
    subprocess.run([sys.executable, "-c", enqueue], env=_env(stack), check=True, cwd=BENCH_DIR)
    return _run_workers(stack, argvs, remaining, jobs, handler, _env(stack))


def celery_drain(stack: Stack, jobs: int, handler: str = "noop", processes: int = 0,
                 slots: int = 0) -> float:
    """The no-op setup (one prefork worker, a child per core) unless `processes` x `slots`
    are given: then that many threads-pool workers."""
    from peer_celery import QUEUE
    r = stack.redis
    enqueue = (f"from peer_celery import app\ntask = app.tasks[{handler!r}]\n"
               f"for _ in range({jobs}): task.delay()")
    base = [sys.executable, "-m", "celery", "-A", "peer_celery", "worker", "-Q", QUEUE,
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"]
    if processes:
        argvs = [[*base, "-P", "threads", "-c", str(slots), "-n", f"bench{i}@%h"]
                 for i in range(processes)]
    else:
        argvs = [[*base, "-P", "prefork", "-c", CORES]]
    return _drain(stack, argvs, enqueue, lambda: r.llen(QUEUE) + r.hlen("unacked"), jobs,
                  handler)


def dramatiq_drain(stack: Stack, jobs: int, handler: str = "noop", processes: int = 0,
                   slots: int = 8) -> float:
    from peer_dramatiq import QUEUE
    r = stack.redis
    enqueue = (f"from peer_dramatiq import broker\nactor = broker.get_actor({handler!r})\n"
               f"for _ in range({jobs}): actor.send()")
    argv = [sys.executable, "-m", "dramatiq", "peer_dramatiq", "--processes",
            str(processes) if processes else CORES, "--threads", str(slots)]
    return _drain(stack, [argv], enqueue, lambda: r.hlen(f"dramatiq:{QUEUE}.msgs"), jobs,
                  handler)


# --- pgqueuer --------------------------------------------------------------------------------

def pgqueuer_reset(stack: Stack) -> str:
    """A fresh pgqueuer database on the benchmark's server, its schema from `pgq install`, and
    an empty Redis DB; its URL."""
    url = urlunsplit(urlsplit(stack.admin_url)._replace(path="/" + PGQ_DB))
    with psycopg.connect(stack.admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PGQ_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PGQ_DB}")
    subprocess.run([sys.executable, "-m", "pgqueuer", "--pg-dsn", url, "install"],
                   env=_env(stack), check=True, capture_output=True)  # kept for a failure
    stack.redis.flushdb()
    return url


def pgqueuer_consumer(slots: int) -> list[str]:
    return [sys.executable, str(BENCH_DIR / "peer_pgqueuer.py"), str(slots)]


def pgqueuer_drain(stack: Stack, jobs: int, handler: str = "noop", processes: int = 0,
                   slots: int = 0) -> float:
    """`processes` consumers (one per core if 0) of `slots` each (pgqueuer's defaults if 0)
    draining `jobs` jobs enqueued in bulk."""
    import peer_pgqueuer

    dsn = pgqueuer_reset(stack)
    peer_pgqueuer.produce(dsn, jobs, batch=min(jobs, 1000), entrypoint=handler)
    with psycopg.connect(dsn, autocommit=True) as conn, finished.by_index(dsn) as polls:
        done = finished.Finished(finished.reads_since(
            polls, "SELECT count(*) FILTER (WHERE status = ANY('{successful,exception,canceled,"
            "deleted}')), max(id) FROM pgqueuer_log WHERE id > %s"),
            lambda: jobs - conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0], jobs)
        return _run_workers(stack, [pgqueuer_consumer(slots)] * (processes or int(CORES)),
                            lambda: jobs - done(), jobs, handler,
                            _env(stack, BENCH_PGQ_DSN=dsn), lambda: _pgqueuer_timing(conn))


def _pgqueuer_timing(conn: psycopg.Connection) -> tuple[float, list[float]]:
    """Jobs/s from the pick after the first 5 % to the last acknowledgement, and the window from
    the first pick, by pgqueuer's log (each row stamped by its statement's transaction, as
    taskline's leases and outcomes are; scenarios.steady_rate)."""
    picks = [float(r[0]) for r in conn.execute(
        "SELECT extract(epoch FROM created) FROM pgqueuer_log WHERE status = 'picked' "
        "ORDER BY created").fetchall()]
    last = float(conn.execute("SELECT extract(epoch FROM max(created)) FROM pgqueuer_log "
                              "WHERE status = 'successful'").fetchone()[0])
    skip = int(len(picks) * 0.05)
    return (len(picks) - skip) / (last - picks[skip]), [picks[0], last]


def pgqueuer_enqueue(stack: Stack, jobs: int, batch: int, producers: int) -> float:
    """Jobs/s of `producers` processes enqueuing no-op jobs in calls of `batch` (1: single)."""
    import peer_pgqueuer

    dsn = pgqueuer_reset(stack)
    seconds = peer_pgqueuer.produce(dsn, jobs, batch, producers, warmup=20 if batch == 1 else 1)
    return jobs // batch // producers * producers * batch / seconds


def pgqueuer_pickup(stack: Stack, jobs: int = 300, spacing_s: float = 0.02,
                    slots: int = 4) -> list[tuple[float, float, float]]:
    """One idle consumer; single `stamp` enqueues `spacing_s` apart. Per job: (enqueue call
    made, call returned, handler started), epoch s on the host clock."""
    import peer_pgqueuer

    dsn = pgqueuer_reset(stack)
    env = _env(stack, BENCH_PGQ_DSN=dsn)
    proc = subprocess.Popen(pgqueuer_consumer(slots), env=env, cwd=BENCH_DIR,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _consumer_idle(stack, dsn)
        sent = peer_pgqueuer.paced(dsn, jobs, spacing_s)
        _wait_stamps(stack, jobs)
    finally:
        stop(proc)
    stamps = dict(s.decode().split() for s in stack.redis.lrange(peer_pgqueuer.STAMPS, 0, -1))
    return [(t0, t1, float(stamps[seq])) for seq, (t0, t1) in sent.items()]


def _consumer_idle(stack: Stack, dsn: str) -> None:
    """Until the consumer has run a warm-up job, then 1 s more (back waiting for a NOTIFY)."""
    import peer_pgqueuer

    peer_pgqueuer.produce(dsn, 1, entrypoint="stamp")
    _wait_stamps(stack, 1)
    stack.redis.delete(peer_pgqueuer.STAMPS)
    time.sleep(1.0)


def _wait_stamps(stack: Stack, count: int, timeout: float = 60) -> None:
    from peer_pgqueuer import STAMPS
    deadline = time.monotonic() + timeout
    while stack.redis.llen(STAMPS) < count:
        if time.monotonic() > deadline:
            raise TimeoutError("pgqueuer stamps did not arrive")
        time.sleep(0.02)
