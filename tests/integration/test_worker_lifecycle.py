"""The worker's lifecycle against real PostgreSQL and Redis: heartbeats, graceful shutdown of a
`taskline worker` process on SIGTERM (finish within the grace, hand back the rest, a second
signal hands back at once), self-fencing while its test database refuses connections, and a
migration run under it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text

from taskline.dispatch.keys import QueueKeys, worker_key
from taskline.errors import StoreUnavailable
from tests.conftest import ADMIN_URL
from tests.helpers import enqueue, service, service_env, wait_for
from tests.integration import worker_handlers as th
from tests.integration.worker_handlers import running_worker

Q = QueueKeys("default")
REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("clean_handlers")


def status_of(store, job) -> str:
    return store.get_job(job.id).status.value


def wait_status(store, job, status: str, timeout: float = 10.0) -> None:
    wait_for(lambda: status_of(store, job) == status, timeout=timeout, message=f"job {status}")


def worker_row(store, worker_id: str):
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT * FROM taskline.workers WHERE id = :id"),
                            {"id": worker_id}).one_or_none()


def test_heartbeats_reach_the_workers_table_and_redis(settings, store, dispatcher):
    job = enqueue(store, dispatcher, "t.block", {"gate": "g"})
    with running_worker(settings, queues=("default", "mail"), concurrency=3) as worker:
        wid = worker.worker_id
        wait_status(store, job, "running")
        wait_for(lambda: worker_row(store, wid).active_jobs == 1, message="active job beat")
        first = worker_row(store, wid)
        assert (first.queues, first.concurrency, first.stopped_at) == (["default", "mail"], 3,
                                                                       None)
        wait_for(lambda: worker_row(store, wid).last_heartbeat > first.last_heartbeat,
                 message="a later heartbeat")
        ttl_ms = dispatcher.client.pttl(worker_key(wid))
        assert 0 < ttl_ms <= 3 * settings.heartbeat_s * 1000
        th.release("g")
        wait_status(store, job, "succeeded")
    stopped = worker_row(store, wid)
    assert stopped.stopped_at is not None and stopped.active_jobs == 0
    assert not dispatcher.client.exists(worker_key(wid))


def released(store, job) -> bool:
    current = store.get_job(job.id)
    leases = store.get_history(job.id)[1]
    return (current.status.value == "queued" and current.attempts == 0
            and [lease["outcome"] for lease in leases] == ["released"])


def test_sigterm_finishes_jobs_within_the_grace_and_hands_back_the_rest(
        settings, store, dispatcher, tmp_path: Path):
    quick = enqueue(store, dispatcher, "simulate", {"sleep_s": 1.5})
    slow = enqueue(store, dispatcher, "simulate", {"sleep_s": 60})
    env = service_env(settings.replace(shutdown_grace_s=4.0))
    with service(["worker", "--concurrency", "2"], env, tmp_path) as proc:
        wait_for(lambda: status_of(store, quick) == status_of(store, slow) == "running",
                 timeout=20, message="both jobs running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    assert status_of(store, quick) == "succeeded"
    assert released(store, slow)
    assert dispatcher.client.lrange(Q.ready(5), 0, -1) == [str(slow.id)]
    assert [e["event"] for e in store.get_history(slow.id)[0]][-1] == "released"
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.workers WHERE stopped_at IS NULL")
                            ).scalar_one() == 0
    assert dispatcher.client.keys("taskline:worker:*") == []


def test_a_second_signal_hands_running_jobs_back_at_once(settings, store, dispatcher,
                                                        tmp_path: Path):
    slow = enqueue(store, dispatcher, "simulate", {"sleep_s": 60})
    env = service_env(settings.replace(shutdown_grace_s=60.0))
    with service(["worker"], env, tmp_path) as proc:
        wait_status(store, slow, "running", timeout=20)
        proc.send_signal(signal.SIGTERM)
        log_file = next(tmp_path.glob("worker-*.log"))
        wait_for(lambda: "stopping gracefully" in log_file.read_text(), message="first signal")
        assert proc.poll() is None  # still inside its 60 s grace
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    assert released(store, slow)


def test_a_worker_full_of_abandoned_threads_re_executes_itself(settings, store, dispatcher,
                                                              tmp_path: Path):
    for _ in range(2):
        enqueue(store, dispatcher, "t.stubborn", {"gate": "never"}, timeout_s=0.2,
                max_retries=0)
    env = service_env(settings.replace(handlers=(th.MODULE,)), PYTHONPATH=str(REPO))
    with service(["worker", "--concurrency", "1"], env, tmp_path) as proc:
        wait_for(lambda: len(worker_rows(store)) == 2, timeout=20, message="a second start")
        after = enqueue(store, dispatcher, "echo")
        wait_status(store, after, "succeeded")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    first, second = worker_rows(store)
    assert first.pid == second.pid == proc.pid  # the same process, a new image
    assert first.stopped_at is not None and first.stopped_at <= second.started_at


def worker_rows(store) -> list:
    with store.engine.connect() as conn:
        return list(conn.execute(text("SELECT * FROM taskline.workers ORDER BY started_at")))


@contextmanager
def refusing_connections(database_url: str) -> Iterator[None]:
    """Make the test's own database unreachable (new connections refused, open ones cut)."""
    name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
            sql.Identifier(name)))
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        try:
            yield
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                sql.Identifier(name)))


def test_a_lease_that_cannot_be_renewed_self_fences(settings, store, dispatcher,
                                                    database_url):
    fast = settings.replace(lease_s=1.5, heartbeat_s=0.3)
    fenced = enqueue(store, dispatcher, "t.block", {"gate": "never"})
    later = enqueue(store, dispatcher, "echo", push=False)
    with running_worker(fast) as worker:
        wait_status(store, fenced, "running")
        with refusing_connections(database_url):
            wait_for(lambda: worker.fence.tripped, message="self-fenced")
            # The attempt was stopped and let go without any outcome.
            wait_for(lambda: len(worker.attempts) == 0, message="attempt dropped")
        store.engine.dispose()  # the test's pooled connections were cut too
        wait_for(lambda: not worker.fence.tripped, message="fence lifted")
        dispatcher.push([("default", 5, str(later.id))])
        wait_status(store, later, "succeeded")
    # Nothing was recorded for the fenced attempt: the reaper will recover it.
    assert status_of(store, fenced) == "running"
    assert [lease["outcome"] for lease in store.get_history(fenced.id)[1]] == [None]


def test_ids_fetched_while_postgresql_is_down_go_back_and_run(settings, store, dispatcher,
                                                              database_url):
    job = enqueue(store, dispatcher, "echo", {"x": 1}, push=False)
    with running_worker(settings) as worker:
        with refusing_connections(database_url):
            dispatcher.push([("default", 5, str(job.id))])
            wait_for(lambda: worker.fence.tripped, message="claim failure fenced the worker")
            assert dispatcher.client.lrange(Q.processing(worker.worker_id), 0, -1) == [
                str(job.id)]
        store.engine.dispose()
        wait_status(store, job, "succeeded")
        assert store.get_job(job.id).attempts == 1


def test_a_migration_under_a_running_worker_runs_every_job_once(settings, store, dispatcher):
    """A column added to `jobs` while a worker runs (a rolling deploy's migration) outdates its
    prepared statements; the first one refused costs a retry, never a job run twice or lost."""
    before = [enqueue(store, dispatcher, "t.record", {"tag": f"before-{i}"}) for i in range(40)]
    with running_worker(settings, concurrency=4):
        for job in before:
            wait_status(store, job, "succeeded")
        running = enqueue(store, dispatcher, "t.block", {"gate": "migration"})
        wait_status(store, running, "running")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE taskline.jobs ADD COLUMN added_by_a_migration integer")
        th.release("migration")
        with pytest.raises(StoreUnavailable):  # this process's statements are outdated too
            enqueue(store, dispatcher, "t.record", {"tag": "refused"})
        after = [enqueue(store, dispatcher, "t.record", {"tag": f"after-{i}"}) for i in range(40)]
        for job in [running, *after]:
            wait_status(store, job, "succeeded", timeout=20.0)
    assert sorted(th.tags()) == sorted(f"{when}-{i}" for when in ("before", "after")
                                       for i in range(40))
    for job in [*before, running, *after]:
        assert store.get_job(job.id).attempts == 1
