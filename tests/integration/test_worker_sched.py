"""A worker process's scheduling policy (TASKLINE_WORKER_SCHED, `taskline worker --sched`).

By default every thread of a worker runs under SCHED_BATCH (a thread it wakes does not
preempt the thread that woke it: taskline.sched_policy), jobs run, and the start is logged;
`--sched normal` leaves every thread under SCHED_OTHER. The kernel's account of each thread
(sched_getscheduler on its id) is what is checked, not the worker's own word.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from tests.helpers import enqueue, logged, service, service_env, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's policies")]


def thread_policies(pid: int) -> list[int]:
    """The kernel's scheduling policy of each thread of `pid`."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.append(os.sched_getscheduler(int(task.name)))
        except ProcessLookupError:
            continue  # the thread ended since the list was read
    return found


def test_a_worker_runs_its_jobs_under_batch_by_default(settings: Settings, store: Store,
                                                       dispatcher: Dispatcher,
                                                       tmp_path: Path) -> None:
    with service(["worker", "--concurrency", "4"], service_env(settings), tmp_path) as proc:
        wait_for(lambda: store.list_workers(30), timeout=60, message="the worker registered")
        jobs = [enqueue(store, dispatcher) for _ in range(10)]
        wait_for(lambda: all(store.get_job(j.id).status == "succeeded" for j in jobs),
                 timeout=30, message="the jobs run")
        policies = thread_policies(proc.pid)
        assert len(policies) > 4  # the handler threads among them
        assert set(policies) == {os.SCHED_BATCH}
    assert [r["sched"] for r in logged(tmp_path, "worker scheduling policy set")] == ["batch"]


def test_normal_leaves_every_thread_under_the_default_policy(settings: Settings, store: Store,
                                                             tmp_path: Path) -> None:
    env = service_env(settings, TASKLINE_WORKER_SCHED="batch")  # the option wins
    with service(["worker", "--concurrency", "4", "--sched", "normal"], env, tmp_path) as proc:
        # The handler threads among them, started once the worker has registered.
        policies = wait_for(lambda: len(found := thread_policies(proc.pid)) > 4 and found,
                            timeout=60, message="the worker's threads started")
        assert set(policies) == {os.SCHED_OTHER}
    assert [r["sched"] for r in logged(tmp_path, "worker scheduling policy set")] == ["normal"]
