"""Test helpers: polling with a deadline, enqueuing without the API, dead jobs with their history,
service subprocesses."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import requests
from sqlalchemy import text

from taskline import transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.jobs import Job
from taskline.settings import Settings
from taskline.store.rows import Settled, Settlement
from taskline.store.store import Store
from taskline_cli.localservers import free_port

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05,
             message: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def enqueue(store: Store, dispatcher: Dispatcher, job_type: str = "echo", payload: Any = None,
            *, queue: str = "default", priority: int = 5, max_retries: int = 3,
            timeout_s: float = 30.0, push: bool = True, limit_key: str | None = None,
            ordering_key: str | None = None) -> Job:
    """Insert a queued job and (unless push=False) make it dispatchable, as the producer does."""
    with store.transaction() as conn:
        job = store.insert_job(conn, id=uuid.uuid4(), type=job_type, queue=queue,
                               payload={} if payload is None else payload, priority=priority,
                               status="queued", max_retries=max_retries, timeout_s=timeout_s,
                               idempotency_key=None, request_hash=None, limit_key=limit_key,
                               ordering_key=ordering_key)
        store.insert_event(conn, job.id, 0, "enqueued")
    if push:
        dispatcher.push([(queue, priority, str(job.id))])
    return job


def make_dead(store: Store, dispatcher: Dispatcher, n: int, *, queue: str = "q1",
              job_type: str = "mail") -> list[str]:
    """`n` dead jobs with a history, a closed lease, a DLQ row and a DLQ list entry."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    with store.transaction() as conn:
        conn.execute(text(
            "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, attempts, "
            "max_retries, timeout_s, finished_at) SELECT i, :t, :q, '{}', 5, 'dead', 1, 0, 30, "
            "now() FROM unnest(CAST(:ids AS uuid[])) AS i"), {"ids": ids, "t": job_type,
                                                                "q": queue})
        conn.execute(text(
            "INSERT INTO taskline.job_events (job_id, attempt, event) SELECT i, a, e FROM "
            "unnest(CAST(:ids AS uuid[])) AS i, (VALUES (0, 'enqueued'), (1, 'claimed'), "
            "(1, 'dead_lettered')) AS v(a, e)"), {"ids": ids})
        conn.execute(text(
            "INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, leased_until, "
            "released_at, outcome) SELECT i, 1, 'w', now(), now(), now(), 'failed' "
            "FROM unnest(CAST(:ids AS uuid[])) AS i"), {"ids": ids})
        conn.execute(text("INSERT INTO taskline.dead_letter_jobs (job_id, final_error, attempts) "
                          "SELECT i, 'boom', 1 FROM unnest(CAST(:ids AS uuid[])) AS i"),
                     {"ids": ids})
    dispatcher.client.rpush(QueueKeys(queue).dlq, *ids)
    return ids


def succeed(store: Store, lease_id: int, worker_id: str, result: Any = None) -> list[Settled]:
    """Record a success as a worker does; [] when the lease was not live."""
    return store.settle([Settlement(lease_id, worker_id, transitions.succeeded(result))])


def fail(store: Store, lease_id: int, worker_id: str, error: str = "boom", *,
         delay_s: float | None = None) -> Settled | None:
    """Record a failed attempt as a worker does: a retry after `delay_s`, or dead without one;
    None when the lease was not live."""
    transition = (transitions.dead(error, reason="test") if delay_s is None
                  else transitions.retry(error, delay_s, reason="test"))
    rows = store.settle([Settlement(lease_id, worker_id, transition)])
    return rows[0] if rows else None


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a service subprocess needs to run with `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLINE_")}
    env.update({
        "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url,
        "TASKLINE_LEASE_S": str(settings.lease_s),
        "TASKLINE_HEARTBEAT_S": str(settings.heartbeat_s),
        "TASKLINE_REAPER_INTERVAL_S": str(settings.reaper_interval_s),
        "TASKLINE_RECONCILE_INTERVAL_S": str(settings.reconcile_interval_s),
        "TASKLINE_BACKOFF_BASE_S": str(settings.backoff_base_s),
        "TASKLINE_BACKOFF_FACTOR": str(settings.backoff_factor),
        "TASKLINE_BACKOFF_MAX_S": str(settings.backoff_max_s),
        "TASKLINE_SHUTDOWN_GRACE_S": str(settings.shutdown_grace_s),
        "TASKLINE_METRICS_PORT": "0",
        "TASKLINE_LOG_FORMAT": "json",
        "TASKLINE_HANDLERS": ",".join(settings.handlers),
        "TASKLINE_SCHEMA": settings.schema,
        "TASKLINE_DATABASE_POOLING": settings.database_pooling,
        "TASKLINE_DATABASE_DIRECT_URL": settings.database_direct_url,
        "TASKLINE_QUEUE_PARTITIONS": str(settings.queue_partitions),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


@contextmanager
def service(args: list[str], env: dict[str, str], log_dir: Path) -> Iterator[subprocess.Popen]:
    """Run `taskline <args>` as a subprocess; on exit, stop it (SIGTERM, then SIGKILL) by PID."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{args[0]}-{uuid.uuid4().hex[:6]}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "taskline_cli.main", *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            stop_process(proc)


def logged(log_dir: Path, message: str, service_name: str = "worker") -> list[dict[str, Any]]:
    """The JSON records with this `msg` that `service` processes of `service_name` wrote to
    `log_dir` (other lines, such as a traceback's, are skipped)."""
    return [record for path in log_dir.glob(f"{service_name}-*.log")
            for line in path.read_text().splitlines()
            if (record := json.loads(line) if line.startswith("{") else {}).get("msg") == message]


def start_api(settings: Settings, log_dir: Path, **env: str) -> Iterator[str]:
    """Run `taskline api` on a free loopback port until the caller is done; yield its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
                 service_env(settings, **env), log_dir) as proc:

        def answering() -> bool:
            assert proc.poll() is None, f"taskline api exited; see {log_dir}"
            try:
                return requests.get(url + "/healthz", timeout=1).ok
            except requests.RequestException:  # refused, or still booting under load
                return False

        wait_for(answering, timeout=30, interval=0.1, message="taskline api to answer")
        yield url


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except ProcessLookupError:
        pass


def connections_per_process(parent_pid: int, port: int) -> dict[int, int]:
    """How many established connections to local `port` each child of `parent_pid` (a gunicorn
    master's workers) holds, by child PID; read from /proc."""
    established = _established_inodes(port)
    children = subprocess.run(["pgrep", "-P", str(parent_pid)], capture_output=True,
                              text=True).stdout.split()
    return {int(pid): len(_socket_inodes(int(pid)) & established) for pid in children}


def every_process_serving(parent_pid: int, port: int, processes: int) -> bool:
    """Whether each of the `processes` children of a gunicorn master serves: as many
    connections held at once land one on each (taskline_producer.http.balancer). A process still
    loading its app is not yet counted by its siblings, so all would land on the others. Any
    answer to the request will do (a 404 too): it only proves the connection was accepted."""
    held = [http.client.HTTPConnection("127.0.0.1", port, timeout=5) for _ in range(processes)]
    try:
        for conn in held:
            conn.request("GET", "/healthz")
            conn.getresponse().read()
        return sorted(connections_per_process(parent_pid, port).values()) == [1] * processes
    except OSError:
        return False
    finally:
        for conn in held:
            conn.close()


def _established_inodes(port: int) -> set[str]:
    """Socket inodes of the established IPv4 TCP connections whose local port is `port`."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets process `pid` holds open."""
    found = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:  # the process exited since it was listed (a replaced worker)
        return found
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:  # closed since listed
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found
