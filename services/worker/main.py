"""Entry point of `taskline worker`: builds the worker, serves metrics and readiness, waits
for PostgreSQL, maps signals to a graceful stop and re-executes the process when the worker
asks to be recycled.

Invariant: the first SIGTERM/SIGINT stops fetching and lets running jobs finish within the
grace period; a second one hands the rest back at once. A worker started while PostgreSQL is
unreachable waits for it (taskline.startup), answering 503 on `/readyz` of its metrics port,
and a signal then ends it at once with status 0. A recycle is a graceful stop followed by
`os.execv` of the same command, so stuck handler threads die with the old process image.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from taskline import affinity, doctor, heap, metrics, sched_policy, startup, tracing
from taskline.errors import ConfigError
from taskline.placement import Placement
from taskline.settings import Settings
from taskline.startup import Readiness
from taskline_worker.worker import Exit, Worker

log = logging.getLogger(__name__)

JOIN_POLL_S = 0.5


def run(settings: Settings, queues: Sequence[str], concurrency: int, metrics_port: int, *,
        fallback: bool = False) -> int:
    """Run a worker until it is signalled to stop; returns the process exit code.
    `fallback`: `metrics_port` is the default one, not given, so a taken one moves on to the
    next free port (taskline.metrics.serve); the port bound is recorded in `workers`."""
    unpinned = affinity.allowed_cpus()
    ok, cpus = pinned(settings.worker_cpus)
    if not ok:
        return 2
    given = assigned(settings.worker_cpus)
    scheduled(settings.worker_sched)
    try:
        worker = Worker(settings, queues, concurrency)
    except (ConfigError, ImportError) as err:
        log.error("cannot start the worker", extra={"action": "start", "error": str(err)})
        return 2
    worker.cpus = None if cpus is None else sorted(cpus)
    if given is not None:
        worker.placement = Placement(given, unpinned, worker.placed)
    readiness = worker_readiness(worker)
    try:
        worker.metrics_port = metrics.serve(metrics_port, ready=readiness.answer,
                                            fallback=fallback)
    except OSError as err:
        log.error("cannot serve /metrics", extra={"action": "start", "port": metrics_port,
                                                  "error": str(err)})
        return 2
    tracing.setup("worker", settings)
    install_signal_handlers(worker, readiness)
    if not registered(worker, readiness):
        return 0 if worker.stopping.is_set() else 1
    heap.settle_after_start()
    # What an operator got wrong (autovacuum off, an evicting Redis ...), logged beside the work.
    doctor.warn_at_start(settings, doctor.Plan(workers=1, concurrency=concurrency,
                                               api_processes=0, maintenance=0))
    outcome = run_in_thread(worker)
    if outcome is None:
        return 1
    if outcome is Exit.RECYCLE:
        reexec(queues, concurrency, None if fallback else metrics_port, settings.handlers,
               settings.worker_cpus, settings.worker_sched)
    return 0


def pinned(spec: str) -> tuple[bool, set[int] | None]:
    """Pin this process to a TASKLINE_WORKER_CPUS list before any of the worker's threads
    starts (they inherit it): (True, the CPUs, or None when not pinned); (False, None) when it
    cannot be done (logged)."""
    try:
        cpus = affinity.pin(spec)
    except (ConfigError, OSError) as err:
        log.error("cannot pin the worker to CPUs", extra={"action": "start", "cpus": spec,
                                                          "error": str(err)})
        return False, None
    if cpus is not None:
        log.info("worker pinned", extra={"action": "start", "cpus": sorted(cpus)})
    return True, cpus


def assigned(spec: str) -> int | None:
    """`auto`'s CPU for this process, which taskline.placement pins it to while it is busy;
    None when `spec` is not `auto` or every CPU has a worker process of its own (logged)."""
    if spec != affinity.AUTO:
        return None
    cpu = affinity.assign()
    if cpu is not None:
        log.info("worker given a CPU of its own, pinned to it while busy",
                 extra={"action": "start", "cpus": [cpu]})
    elif affinity.supported():
        log.info("every CPU has a worker process of its own: not pinned",
                 extra={"action": "start", "cpus": spec})
    return cpu


def scheduled(policy: str) -> None:
    """Put this process under TASKLINE_WORKER_SCHED before any of the worker's threads starts
    (they inherit it); where it cannot be, the worker runs as started (logged)."""
    if sched_policy.apply(policy):
        log.info("worker scheduling policy set", extra={"action": "start", "sched": policy})
    else:
        log.warning("the scheduling policy could not be set: running as started",
                    extra={"action": "start", "sched": policy,
                           "running": sched_policy.current()})


def worker_readiness(worker: Worker) -> Readiness:
    """/readyz: 503 until registered and while self-fenced (PostgreSQL lost), 200 otherwise,
    "degraded" while jobs are claimed from PostgreSQL because Redis is unreachable."""
    return Readiness(
        degraded=lambda: "Redis unreachable: claiming from PostgreSQL"
        if worker.mode.degraded else None,
        unavailable=lambda: "PostgreSQL unreachable: self-fenced, taking no work"
        if worker.fence.tripped else None)


def registered(worker: Worker, readiness: Readiness) -> bool:
    """Register the worker, waiting for PostgreSQL as long as it takes; False when a signal
    ended the wait or registering failed for another reason (logged)."""
    try:
        done = startup.wait_for("PostgreSQL", worker.register, worker.stopping, readiness)
    except Exception:
        log.exception("cannot register the worker", extra={"action": "start"})
        return False
    if not done:
        log.warning("stopped while waiting for PostgreSQL", extra={"action": "stop"})
        return False
    readiness.working()
    return True


def run_in_thread(worker: Worker) -> Exit | None:
    """Run the worker on its own thread while the main thread only waits.

    Signal handlers run on the main thread; keeping it out of the worker's locks means a
    handler can never wait for a lock its own thread holds.
    """
    result: list[Exit] = []

    def body() -> None:
        try:
            result.append(worker.run())
        except Exception:
            log.exception("the worker failed", extra={"action": "run"})

    thread = threading.Thread(target=body, name="taskline-worker")
    thread.start()
    while thread.is_alive():
        thread.join(JOIN_POLL_S)
    return result[0] if result else None


def install_signal_handlers(worker: Worker, readiness: Readiness) -> None:
    def handle(signum: int, _frame: object) -> None:
        force = worker.stopping.is_set()
        readiness.stopping()
        log.warning("signal received: " + ("handing running jobs back now" if force
                                           else "stopping gracefully"),
                    extra={"action": "signal", "signal": signal.Signals(signum).name})
        worker.stop(force=force)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def reexec(queues: Sequence[str], concurrency: int, metrics_port: int | None,
           handlers: Sequence[str] = (), cpus: str = "",
           sched: str = sched_policy.BATCH) -> None:
    """Replace this process with a fresh `taskline worker` with the same options.

    The environment (and so the settings, TASKLINE_HANDLERS with them) is inherited unchanged;
    the options are rebuilt from what `run` received, which is what the original command line
    said: a metrics port only when one was given (None: the default, free to move again), and
    the handler modules, which `--handlers` may have named instead of the environment, and
    the CPUs and the scheduling policy, which `--cpus` and `--sched` may have (the new image
    claims its `auto` CPU afresh: the old image's lock was closed on exec).
    """
    args = ["worker", "--queues", ",".join(queues), "--concurrency", str(concurrency)]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    if handlers:
        args += ["--handlers", ",".join(handlers)]
    if cpus:
        args += ["--cpus", cpus]
    args += ["--sched", sched]
    log.warning("re-executing the worker", extra={"action": "recycle", "argv": args})
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "taskline_cli.main", *args])
