"""The nemesis: injects faults into what the suite itself started, and writes each into the history.

Invariant: it acts only on a `Cluster`'s own services (by the PID the Cluster holds), the private
servers handed to that Cluster, its proxies, and its private Redis's keys; never on a process
found by name or on a shared server. Every fault is recorded when injected (`fault`) and, for
faults that last, when healed (`heal`), with both clocks, so the checker can count faults and
measure the time to recover from the last heal.

Process faults live here; server and network faults are added as further methods.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from tests.faults.cluster import Cluster, Service
from tests.faults.history import History, stamp
from tests.helpers import wait_for


class Nemesis:
    """Faults against one cluster, recorded in one history."""

    def __init__(self, cluster: Cluster, history: History) -> None:
        self.cluster = cluster
        self.history = history
        self.injected = 0
        self._killed: set[int] = set()

    # --- recording -----------------------------------------------------------------------

    def fault(self, op: str, target: str, **detail: Any) -> None:
        """Record one injected fault."""
        self.injected += 1
        self.history.record("fault", op=op, target=target, **detail, **stamp())

    def heal(self, op: str, target: str, **detail: Any) -> None:
        """Record the end of a lasting fault (the clock of 'time to recover' starts here)."""
        self.history.record("heal", op=op, target=target, **detail, **stamp())

    # --- process faults ------------------------------------------------------------------

    def kill(self, service: Service) -> int:
        """SIGKILL a service (its whole process group); returns the PID killed."""
        pid = service.pid
        self._killed.add(pid)
        service.kill()
        self.fault("sigkill", service.name, pid=pid)
        return pid

    def supervised_restart(self, service: Service, died: int) -> None:
        """The cluster's supervisor restarted `service`: a death the nemesis did not cause (a
        poison job, a crash inside a transaction) is a fault too; the restart heals it."""
        if died not in self._killed:
            self.fault("crash", service.name, pid=died)
        self.heal("restart", service.name, pid=service.pid)

    def restart(self, service: Service, wait: bool = True) -> None:
        """Start a killed service again (what a supervisor does)."""
        self.cluster.restart(service, wait=wait)
        self.heal("restart", service.name, pid=service.pid)

    def stop(self, service: Service) -> None:
        """SIGSTOP: the process keeps its sockets and leases but runs nothing."""
        service.freeze()
        self.fault("sigstop", service.name, pid=service.pid)

    def cont(self, service: Service) -> None:
        service.thaw()
        self.heal("sigcont", service.name, pid=service.pid)

    @contextmanager
    def stopped(self, service: Service, seconds: float) -> Iterator[None]:
        """SIGSTOP `service` for `seconds` (measured from the stop), then SIGCONT."""
        self.stop(service)
        until = time.monotonic() + seconds
        try:
            yield
            time.sleep(max(until - time.monotonic(), 0.0))
        finally:
            self.cont(service)

    def kill_busy_worker(self, timeout: float = 20.0) -> tuple[Service, list[str]]:
        """Wait until some worker is running a handler, SIGKILL it; returns it and its jobs."""
        found = wait_for(lambda: self._busy_worker(), timeout=timeout, interval=0.02,
                         message="a worker running a job")
        service, jobs = found
        self.kill(service)
        return service, jobs

    def _busy_worker(self) -> tuple[Service, list[str]] | None:
        running = executing_jobs(self.cluster)
        for service in self.cluster.workers:
            if service.alive and running.get(service.pid):
                return service, running[service.pid]
        return None

    def signal(self, service: Service, sig: signal.Signals) -> None:
        service.signal(sig)
        self.fault(sig.name.lower(), service.name, pid=service.pid)

    # --- state faults (Redis contents) ---------------------------------------------------

    def push_ids(self, key: str, ids: list[str]) -> None:
        """LPUSH ids straight into a Redis list (duplicates, unknown ids, garbage)."""
        if ids:
            self.cluster.dispatcher.client.lpush(key, *ids)
        self.fault("push_ids", key, ids=len(ids))

    # --- server faults (the cluster's private PostgreSQL and Redis) ----------------------

    def kill_redis(self) -> None:
        """SIGKILL the private redis-server: every key is gone, every connection reset."""
        pid = self.cluster.redis.pid
        self.cluster.redis.kill()
        self.fault("sigkill", "redis", pid=pid)

    def start_redis(self) -> None:
        """Start the killed Redis again on the same port: it comes back empty."""
        self.cluster.redis.start()
        self._forget_redis_connections()
        self.heal("start", "redis", pid=self.cluster.redis.pid)

    def flushall(self) -> None:
        """FLUSHALL on the private Redis: the dispatch index vanishes, the server stays up."""
        self.cluster.redis.flushall()
        self.fault("flushall", "redis")

    @contextmanager
    def frozen(self, server: str, seconds: float) -> Iterator[None]:
        """SIGSTOP a private server for `seconds`: it keeps its sockets and answers nothing."""
        target = self._server(server)
        target.freeze()
        self.fault("sigstop", server, pid=target.pid)
        until = time.monotonic() + seconds
        try:
            yield
            time.sleep(max(until - time.monotonic(), 0.0))
        finally:
            target.thaw()
            self.heal("sigcont", server, pid=target.pid)

    def stop_postgres(self) -> None:
        """Fast shutdown of the private PostgreSQL: sessions end, new connections are refused."""
        pid = self.cluster.postgres.pid
        self.cluster.postgres.stop()
        self.fault("stop", "postgres", pid=pid)

    def crash_postgres(self) -> None:
        """SIGKILL the postmaster: no shutdown checkpoint; the restart runs crash recovery."""
        pid = self.cluster.postgres.pid
        self.cluster.postgres.crash()
        self.fault("sigkill", "postgres", pid=pid)

    def start_postgres(self) -> None:
        self.cluster.postgres.start()
        self.cluster.store.engine.dispose()  # the suite's own pool holds dead connections
        self.heal("start", "postgres", pid=self.cluster.postgres.pid)

    def _server(self, server: str) -> Any:
        assert server in ("postgres", "redis"), server
        return self.cluster.postgres if server == "postgres" else self.cluster.redis

    def _forget_redis_connections(self) -> None:
        for client in (self.cluster.dispatcher.client, self.cluster.dispatcher.blocking_client):
            client.connection_pool.disconnect()

    # --- network faults (the proxy between one kind of service and one server) -----------

    def blackhole(self, kind: str, server: str) -> None:
        """Silence the link both ways, old and new connections; nothing is closed."""
        self.cluster.proxy(kind, server).blackhole(True)
        self.fault("blackhole", f"{kind}->{server}")

    def unblackhole(self, kind: str, server: str) -> None:
        self.cluster.proxy(kind, server).blackhole(False)
        self.heal("blackhole", f"{kind}->{server}")

    def reset(self, kind: str, server: str) -> int:
        """RST every open connection of the link; returns how many there were."""
        n = self.cluster.proxy(kind, server).reset_all()
        self.fault("reset", f"{kind}->{server}", connections=n)
        return n

    def refuse(self, kind: str, server: str, on: bool = True) -> None:
        """While on, new connections of the link are reset as soon as they are made."""
        self.cluster.proxy(kind, server).refuse(on)
        (self.fault if on else self.heal)("refuse", f"{kind}->{server}")

    def latency(self, kind: str, server: str, seconds: float) -> None:
        """Delay every chunk on the link by `seconds` each way (0 heals)."""
        self.cluster.proxy(kind, server).set_latency(seconds)
        (self.fault if seconds else self.heal)("latency", f"{kind}->{server}", seconds=seconds)

    def swallow_reply(self, kind: str, server: str, containing: bytes | None = None) -> None:
        """Arm the link to drop one reply (the next one holding `containing`, if given)."""
        self.cluster.proxy(kind, server).swallow_next_reply(containing)
        self.fault("swallow_reply", f"{kind}->{server}")


def executing_jobs(cluster: Cluster) -> dict[int, list[str]]:
    """{worker pid: job ids} of executions started and not ended, from the execution log."""
    with psycopg.connect(cluster.settings.database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid, job_id::text FROM fault_exec_log "
                            "WHERE ended_at IS NULL ORDER BY id").fetchall()
    running: dict[int, list[str]] = {}
    for pid, job_id in rows:
        running.setdefault(pid, []).append(job_id)
    return running
