"""Worker processes pinned to CPUs (TASKLINE_WORKER_CPUS, `taskline worker --cpus`).

Two workers started as they are by default (`auto`) on one host each run every thread on one
CPU, different CPUs where the machine has two, and run jobs; one whose handler keeps its CPU
busy is unpinned (taskline.placement), every thread, and its row says so; `none` leaves a worker
unpinned; a worker given a list runs on exactly those CPUs, as
its `taskline_worker_cpus` gauge says, and every worker's row in `workers` lists its CPUs
(what the API, the CLI and the dashboard show); one given CPUs it may not use stops at start
with status 2 and says why. The kernel's account of each thread
(/proc/<pid>/task/<tid>/status) is what is checked, not the worker's own word.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from taskline import affinity
from taskline.dispatch.dispatcher import Dispatcher
from taskline.localservers import free_port
from taskline.settings import Settings
from taskline.store.store import Store
from tests.helpers import enqueue, logged, service, service_env, wait_for

pytestmark = pytest.mark.slow


def thread_cpus(pid: int) -> list[set[int]]:
    """The CPUs each thread of `pid` may run on, as the kernel holds them."""
    found = []
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.append(affinity.parse(line.split(":", 1)[1].strip()))
    return found


def scrape(port: int) -> str:
    try:
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except requests.RequestException:
        return ""


def test_by_default_each_worker_has_a_cpu_of_its_own(settings: Settings, store: Store,
                                                     dispatcher: Dispatcher,
                                                     tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    # TMPDIR: the slot files of this test's workers only, not the host's other workers'.
    env = service_env(settings, TMPDIR=str(tmp_path))
    assert "TASKLINE_WORKER_CPUS" not in env
    with service(["worker", "--concurrency", "4"], env, logs) as one, \
            service(["worker", "--concurrency", "4"], env, logs) as two:
        wait_for(lambda: len(store.list_workers(30)) == 2, timeout=60,
                 message="both workers registered")
        jobs = [enqueue(store, dispatcher) for _ in range(20)]
        wait_for(lambda: all(store.get_job(j.id).status == "succeeded" for j in jobs),
                 timeout=30, message="the jobs run by pinned workers")
        pinned = [thread_cpus(proc.pid) for proc in (one, two)]
        assert all(len(threads) > 4 for threads in pinned)  # the handler threads among them
        cpus = [threads[0] for threads in pinned]
        assert all(len(c) == 1 for c in cpus)
        assert all(t == cpus[i] for i, threads in enumerate(pinned) for t in threads)
        if len(os.sched_getaffinity(0)) >= 2:
            assert cpus[0] != cpus[1]
        assert sorted(r["cpus"] for r in logged(logs, "worker pinned")) == sorted(
            sorted(c) for c in cpus)
        # What GET /api/v1/workers, `taskline workers` and the dashboard show (migration 0026).
        assert sorted(w["cpus"] for w in store.list_workers(30)) == sorted(
            sorted(c) for c in cpus)


def test_a_list_pins_to_those_cpus_and_the_gauge_says_so(settings: Settings, store: Store,
                                                         tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    spec = f"{allowed[0]}-{allowed[1]}" if len(allowed) > 1 else str(allowed[0])
    port = free_port()
    env = service_env(settings, TASKLINE_METRICS_PORT=str(port))
    with service(["worker", "--cpus", spec], env, tmp_path) as proc:
        (worker,) = wait_for(lambda: store.list_workers(30), timeout=60,
                             message="the worker registered")
        assert all(cpus == affinity.parse(spec) for cpus in thread_cpus(proc.pid))
        assert worker["cpus"] == sorted(affinity.parse(spec))
        gauge = f'taskline_worker_cpus{{worker="{worker["id"]}"}} {len(affinity.parse(spec))}.0'
        wait_for(lambda: gauge in scrape(port), timeout=30, message=gauge)


def test_cpus_it_may_not_use_stop_the_worker_at_start(settings: Settings, store: Store,
                                                       tmp_path: Path) -> None:
    outside = str(max(os.sched_getaffinity(0)) + 1)
    env = service_env(settings, TASKLINE_WORKER_CPUS=outside)
    with service(["worker"], env, tmp_path) as proc:
        assert proc.wait(timeout=30) == 2
    (record,) = logged(tmp_path, "cannot pin the worker to CPUs")
    assert f"CPUs {outside} are not among" in record["error"]
    assert store.list_workers(30) == []


def test_none_leaves_the_worker_to_the_kernel(settings: Settings, store: Store,
                                              tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    env = service_env(settings, TASKLINE_WORKER_CPUS="none", TMPDIR=str(tmp_path))
    with service(["worker", "--concurrency", "4"], env, tmp_path) as proc:
        (worker,) = wait_for(lambda: store.list_workers(30), timeout=60,
                             message="the worker registered")
        assert worker["cpus"] is None
        assert all(cpus == allowed for cpus in thread_cpus(proc.pid))
    assert logged(tmp_path, "worker pinned") == []


def test_a_worker_that_keeps_its_cpu_busy_is_unpinned(settings: Settings, store: Store,
                                                      dispatcher: Dispatcher,
                                                      tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("pinning to one CPU of one changes nothing")
    port = free_port()
    env = service_env(settings, TMPDIR=str(tmp_path), TASKLINE_METRICS_PORT=str(port))
    with service(["worker", "--concurrency", "2"], env, tmp_path) as proc:
        (worker,) = wait_for(lambda: store.list_workers(30), timeout=60,
                             message="the worker registered")
        assert worker["cpus"] is not None and len(worker["cpus"]) == 1
        # Pure Python holding the GIL: one CPU's worth of the process's own work.
        job = enqueue(store, dispatcher, "simulate", {"cpu_ms": 30_000}, timeout_s=60)
        wait_for(lambda: logged(tmp_path, "worker unpinned: its threads keep a whole CPU busy"),
                 timeout=40, message="the worker unpinned")
        assert all(cpus == allowed for cpus in thread_cpus(proc.pid))
        wait_for(lambda: store.list_workers(30)[0]["cpus"] is None, timeout=10,
                 message="its row shows it unpinned")
        counted = 'taskline_worker_placement_changes_total{change="unpinned"} 1.0'
        wait_for(lambda: counted in scrape(port), timeout=10, message=counted)
        assert store.get_job(job.id).status == "running"  # moved under a running handler
