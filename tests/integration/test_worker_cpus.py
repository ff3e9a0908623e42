"""Worker processes pinned to CPUs (TASKLINE_WORKER_CPUS, `taskline worker --cpus`).

Two workers started as they are by default (`auto`) on one host are each given a CPU, different
CPUs where the machine has two, run free while idle and every thread on their CPU while busy
(taskline.placement); one started when every CPU is given is not pinned, busy or not; one whose
handler keeps a whole CPU busy runs free, every thread, and its row says so; `none`
leaves a worker unpinned; a worker given a list runs on exactly those CPUs, as its
`taskline_worker_cpus` gauge says, and every worker's row in `workers` lists its CPUs (what the
API, the CLI and the dashboard show); one given CPUs it may not use stops at start with status 2
and says why. The kernel's account of each thread (/proc/<pid>/task/<tid>/status) is what is
checked, not the worker's own word.
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

GIVEN = "worker given a CPU of its own, pinned to it while busy"
BEYOND = "every CPU has a worker process of its own: not pinned"


def thread_cpus(pid: int) -> list[set[int]]:
    """The CPUs each thread of `pid` may run on, as the kernel holds them."""
    found = []
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.append(affinity.parse(line.split(":", 1)[1].strip()))
    return found


def cpu_seconds(pid: int) -> float:
    """The user + system CPU time of `pid`, as the kernel accounts it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> str:
    try:
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except requests.RequestException:
        return ""


def test_by_default_each_worker_has_a_cpu_of_its_own_while_busy(
        settings: Settings, store: Store, dispatcher: Dispatcher, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    allowed = os.sched_getaffinity(0)
    # TMPDIR: the slot files of this test's workers only, not the host's other workers'.
    env = service_env(settings, TMPDIR=str(tmp_path))
    assert "TASKLINE_WORKER_CPUS" not in env
    with service(["worker", "--concurrency", "1"], env, logs) as one, \
            service(["worker", "--concurrency", "1"], env, logs) as two:
        wait_for(lambda: len(store.list_workers(30)) == 2, timeout=60,
                 message="both workers registered")
        given = sorted(r["cpus"] for r in logged(logs, GIVEN))
        assert len(given) == 2 and all(len(c) == 1 for c in given)
        if len(allowed) >= 2:
            assert given[0] != given[1]
        # Idle, each is free: every thread may run on every CPU, and its row says so.
        wait_for(lambda: all(all(c == allowed for c in thread_cpus(p.pid)) for p in (one, two))
                 and all(w["cpus"] is None for w in store.list_workers(30)), timeout=20,
                 message="idle workers free")
        # Busy (about half a CPU each: 40 ms of computing, then 40 ms asleep, a job), each is
        # pinned to its own CPU again, every thread, the handler's included.
        jobs = [enqueue(store, dispatcher, "simulate", {"cpu_ms": 40, "sleep_s": 0.04})
                for _ in range(200)]

        def pinned() -> list[list[int]] | None:
            cpus = [thread_cpus(p.pid) for p in (one, two)]
            if not all(len(c) > 3 and all(t == c[0] for t in c) and len(c[0]) == 1
                       for c in cpus):
                return None
            return sorted(sorted(c[0]) for c in cpus)

        assert wait_for(pinned, timeout=20, message="busy workers pinned") == given
        wait_for(lambda: sorted(w["cpus"] or [] for w in store.list_workers(30)) == given,
                 timeout=10, message="their rows show their CPUs")
        wait_for(lambda: all(store.get_job(j.id).status == "succeeded" for j in jobs),
                 timeout=60, message="the jobs run")


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
    assert logged(tmp_path, GIVEN) == [] and logged(tmp_path, "worker pinned") == []


def test_a_worker_that_keeps_a_whole_cpu_busy_runs_free(settings: Settings, store: Store,
                                                        dispatcher: Dispatcher,
                                                        tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("pinning to one CPU of one changes nothing")
    env = service_env(settings, TMPDIR=str(tmp_path))
    with service(["worker", "--concurrency", "2"], env, tmp_path) as proc:
        wait_for(lambda: store.list_workers(30), timeout=60, message="the worker registered")
        assert [len(r["cpus"]) for r in logged(tmp_path, GIVEN)] == [1]
        # Pure Python holding the GIL: a whole CPU's worth of the process's own work, which
        # pinning could not speed up and handlers releasing the GIL could exceed.
        job = enqueue(store, dispatcher, "simulate", {"cpu_ms": 30_000}, timeout_s=60)
        wait_for(lambda: store.get_job(job.id).status == "running", timeout=20,
                 message="the job running")
        # Free at its start too: what is checked is the state after the placement has watched
        # it compute for a while (two seconds of its own CPU, eight looks or more).
        computed = cpu_seconds(proc.pid) + 2.0
        wait_for(lambda: cpu_seconds(proc.pid) >= computed, timeout=20,
                 message="the worker computing")
        wait_for(lambda: all(cpus == allowed for cpus in thread_cpus(proc.pid))
                 and store.list_workers(30)[0]["cpus"] is None, timeout=15,
                 message="the saturated worker free, and its row saying so")
        assert store.get_job(job.id).status == "running"


def test_a_worker_beyond_the_cpus_is_not_pinned(settings: Settings, store: Store,
                                                dispatcher: Dispatcher, tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    slots_dir = tmp_path / f"taskline-cpus-{os.getuid()}"
    held = [affinity.claim_slot(sorted(allowed), slots_dir) for _ in allowed]  # every CPU's
    try:
        assert all(held)
        env = service_env(settings, TMPDIR=str(tmp_path))
        with service(["worker", "--concurrency", "1"], env, tmp_path) as proc:
            wait_for(lambda: store.list_workers(30), timeout=60, message="the worker registered")
            assert logged(tmp_path, GIVEN) == []
            assert len(logged(tmp_path, BEYOND)) == 1
            jobs = [enqueue(store, dispatcher, "simulate", {"cpu_ms": 40, "sleep_s": 0.04})
                    for _ in range(40)]
            wait_for(lambda: all(store.get_job(j.id).status == "succeeded" for j in jobs),
                     timeout=60, message="the jobs run")
            assert all(cpus == allowed for cpus in thread_cpus(proc.pid))  # busy, still free
            assert store.list_workers(30)[0]["cpus"] is None
    finally:
        for slot in held:
            if slot:
                os.close(slot[1])
