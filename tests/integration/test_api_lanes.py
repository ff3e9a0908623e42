"""The list lane over real sockets: list reads that cannot finish hold at most
TASKLINE_API_LIST_THREADS request threads per API process, so an enqueue is still answered at
once, and every waiting list is answered (not refused) once the reads can go on.

The reads are held by an ACCESS EXCLUSIVE lock on the workflows table (the workflow list reads
it; a job's insert does not), taken by the test and released after the enqueue.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import requests

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
