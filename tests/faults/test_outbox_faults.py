"""Enqueue from the application under process faults: an application enqueues inside its own
PostgreSQL transactions (`taskline.enqueue`, committed or rolled back) while the maintenance
leader, whose outbox relay pushes committed jobs to Redis, is SIGKILLed again and again.

Invariants under test: every job whose transaction committed runs exactly once (the checker
judges them like acknowledged API enqueues: none lost, none duplicated); no job whose
transaction rolled back exists or runs; and the relay leaves no outbox row behind.
"""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

import taskline
from tests.faults.test_process_faults import leader_pid
from tests.helpers import wait_for

pytestmark = pytest.mark.faults

WORK = "fault.work"
ROLLBACK_EVERY = 5
"""One application transaction in this many rolls back."""


class Application:
    """Enqueues 1-3 jobs per transaction from its own thread until stopped, recording each
    committed transaction's jobs as acknowledged (its commit returned) and the rolled-back
    ones apart."""

    def __init__(self, run, seed: int = 7) -> None:
        self.run = run
        self.url = run.cluster.settings.database_url
        self.rolled_back: list[str] = []
        self.committed = 0
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Application:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                self._transaction(n)
            except psycopg.OperationalError:
                time.sleep(0.05)  # the application's own retry; nothing was acknowledged
            time.sleep(0.01)

    def _transaction(self, n: int) -> None:
        sent = time.time()
        with psycopg.connect(self.url) as conn:
            ids = [str(taskline.enqueue(conn, WORK, {"sleep_s": 0.01}))
                   for _ in range(self._random.randint(1, 3))]
            if n % ROLLBACK_EVERY == 0:
                conn.rollback()
                self.rolled_back += ids
                return
            conn.commit()
        self.committed += 1
        self.run.history.record(
            "request", op="enqueue", op_id=f"app-{n}", request_id=f"app-{n}", key=None,
            method="COMMIT", path="taskline.enqueue", try_no=1, status=200, error=None,
            json=True, retry_after=None, job_ids=ids, error_code=None,
            send_wall=sent, recv_wall=time.time())


@pytest.mark.timeout(240)
def test_committed_in_transaction_enqueues_run_once_across_relay_kills(fault_run):
    run = fault_run("in-transaction enqueues, maintenance leader SIGKILLed 3 times", workers=1,
                    concurrency=4, maintenance=2, supervise=True)
    pids = {s.pid for s in run.cluster.maintenances}
    wait_for(lambda: leader_pid(run) in pids, timeout=15, message="a maintenance leader")
    with Application(run) as app:
        for _ in range(3):
            wait_for(lambda n=app.committed: app.committed >= n + 20, timeout=30,
                     message="the application to commit more")
            leader = next(s for s in run.cluster.maintenances if s.pid == leader_pid(run))
            run.nemesis.kill(leader)
            wait_for(lambda old=leader.pid: leader_pid(run) not in (None, old), timeout=30,
                     message="another instance to lead")
            run.nemesis.restart(leader)
        wait_for(lambda n=app.committed: app.committed >= n + 20, timeout=30,
                 message="commits after the last kill")
    run.cluster.wait_idle(timeout=60)
    result = run.check()
    run.assert_clean(result)
    assert app.rolled_back, "the workload must roll some transactions back"
    ghosts = run.cluster.query("SELECT count(*) FROM taskline.jobs WHERE id = ANY(%s::uuid[])",
                               (app.rolled_back,))
    assert ghosts == [(0,)], "a rolled-back enqueue left a job"
    assert run.cluster.query("SELECT count(*) FROM taskline.enqueue_outbox") == [(0,)]
