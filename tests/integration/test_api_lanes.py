"""The list lane over real sockets: list reads that cannot finish hold at most
TASKLINE_API_LIST_THREADS threads of their own per API process, so an enqueue is still answered
at once, and every waiting list is answered (not refused) once the reads can go on; those
threads run TASKLINE_API_LIST_NICE steps below the request threads' OS priority.

The reads are held by an ACCESS EXCLUSIVE lock on the workflows table (the workflow list reads
it; a job's insert does not), taken by the test and released after the enqueue.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psycopg
import pytest
import requests

from tests.helpers import wait_for
from tests.integration.gunicorn_api import running_api

LISTS = 40  # more than both processes' 16 request threads together


def test_waiting_list_reads_leave_threads_for_enqueues(template_db: str, tmp_path: Path):
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_THREADS="1") as api:
        answers: list[int] = []
        with psycopg.connect(api.database_url) as lock:
            lock.execute("LOCK TABLE taskline.workflows IN ACCESS EXCLUSIVE MODE")
            listers = [threading.Thread(target=_list, args=(api.url("/api/v1/workflows"),
                                                             answers)) for _ in range(LISTS)]
            for t in listers:
                t.start()
            time.sleep(1.0)  # every list read has arrived and waits (for the lock or a slot)
            started = time.monotonic()
            enqueued = requests.post(api.url("/api/v1/jobs"), json={"type": "lane.check"},
                                     timeout=10)
            took = time.monotonic() - started
            assert enqueued.status_code == 201, enqueued.text
            assert took < 5.0, f"the enqueue waited {took:.1f} s for a thread"
            assert answers == []  # the lists are still held by the lock
            lock.rollback()
        for t in listers:
            t.join(timeout=60)
        assert sorted(answers) == [200] * LISTS


def _list(url: str, answers: list[int]) -> None:
    answers.append(requests.get(url, timeout=60).status_code)


def test_list_threads_run_at_the_lowered_priority(template_db: str, tmp_path: Path):
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_NICE="7") as api:
        _renice(_workers(api.port), 0)  # tests run niced: the threads made next start from 0
        for _ in range(20):  # both processes serve some (connections are balanced)
            assert requests.get(api.url("/api/v1/workflows"), timeout=10).status_code == 200
            assert requests.post(api.url("/api/v1/jobs"), json={"type": "lane.nice"},
                                 timeout=10).status_code == 201
        nices = _thread_nices(api.port)
        assert 7 in nices, nices  # a list thread
        assert nices.count(0) >= 2, nices  # the event loops and request threads are not lowered
        assert set(nices) <= {0, 7}, nices


def _workers(port: int) -> list[int]:
    """The pids of the API's gunicorn workers: the children of the process whose command line
    names `port`."""
    masters = [p for p in Path("/proc").iterdir() if p.name.isdigit()
               and f"127.0.0.1:{port}".encode() in _read(p / "cmdline")]
    children: list[int] = []

    def found() -> bool:
        children[:] = [int(c) for m in masters
                       for c in _read(m / "task" / m.name / "children").split()]
        return len(children) == 2

    wait_for(found, timeout=5, message="two API processes")
    return children


def _renice(pids: list[int], nice: int) -> None:
    """Every thread of `pids` to `nice` (raising a priority needs root: skipped without)."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except PermissionError:
                pytest.skip("raising a thread's priority needs root")


def _thread_nices(port: int) -> list[int]:
    """The nice value of every thread of the API's workers."""
    return [int(_read(t / "stat").rsplit(b")", 1)[1].split()[16])
            for c in _workers(port) for t in Path(f"/proc/{c}/task").iterdir()]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_paced_lists_are_all_answered_at_the_pace(template_db: str, tmp_path: Path):
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_RATE="5") as api:
        answers: list[int] = []
        listers = [threading.Thread(target=_list, args=(api.url("/api/v1/workflows"), answers))
                   for _ in range(30)]
        started = time.monotonic()
        for t in listers:
            t.start()
        enqueued = requests.post(api.url("/api/v1/jobs"), json={"type": "lane.paced"},
                                 timeout=10)
        assert enqueued.status_code == 201 and time.monotonic() - started < 1.5
        for t in listers:
            t.join(timeout=60)
        took = time.monotonic() - started
    assert sorted(answers) == [200] * 30  # held, never refused
    # Two processes, 5 a second each after one second's worth: 20 more take about 2 s.
    assert took > 1.5, f"30 lists took {took:.1f} s at 5 a second per process"
