"""taskline through a real PgBouncer in transaction pooling mode (tests/pgbouncer.py: Debian's
package, two server connections per database, so clients really share them between
transactions): with TASKLINE_DATABASE_POOLING=transaction the API's single and batch enqueues,
a worker's drain and maintenance's passes all work, nothing is prepared on a pooled connection,
`taskline migrate` runs on the direct URL only, and without a direct URL the LISTEN-based
wake-ups poll instead (within 1 s).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from sqlalchemy import text

import taskline
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.settings import Settings
from taskline.store.bulk import COPY_MIN_JOBS
from taskline.store.store import Store
from taskline_maintenance.outbox import OutboxRelay
from taskline_producer.app import close_app, create_app
from taskline_worker.degraded import BACKSTOP_S, DispatchMode
from tests.helpers import enqueue, service, service_env, wait_for

pytestmark = pytest.mark.slow

KEYS = QueueKeys("default")


@pytest.fixture
def pooled(settings: Settings, pgbouncer, private_redis) -> Settings:
    """The test's settings with DATABASE_URL through PgBouncer, and the direct URL beside (and
    a Redis of the module's own: these tests run services for many seconds)."""
    return settings.replace(database_url=pgbouncer.url(settings.database_url),
                            database_pooling="transaction",
                            database_direct_url=settings.database_url,
                            redis_url=private_redis.url)


@pytest.fixture
def dispatcher(pooled: Settings) -> Iterator[Dispatcher]:
    d = Dispatcher(pooled.redis_url, block_timeout_s=0.2)
    yield d
    d.close()


@pytest.fixture
def pooled_store(pooled: Settings) -> Iterator[Store]:
    store = Store.connect(pooled.database_url, pool_size=4, transaction_pooled=True)
    yield store
    store.dispose()


def statuses(store: Store) -> dict[str, int]:
    with store.transaction() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM taskline.jobs GROUP BY 1"))
        return {status: n for status, n in rows}


def prepared_on_every_server_connection(pooled: Settings, pool_size: int) -> list[int]:
    """How many statements each of the pooler's server connections has prepared: `pool_size`
    clients each hold one open transaction at once, so each holds a server connection of its
    own."""
    conns = [psycopg.connect(pooled.database_url, prepare_threshold=None)
             for _ in range(pool_size)]
    try:
        return [c.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
                for c in conns]
    finally:
        for conn in conns:
            conn.close()


def test_without_the_setting_the_pooler_breaks_prepared_statements(settings: Settings,
                                                                   pgbouncer) -> None:
    """The control: through this PgBouncer, the direct setup's prepared statements collide
    (the issue's DuplicatePreparedStatement), so the tests below do share server
    connections."""
    store = Store.connect(pgbouncer.url(settings.database_url), pool_size=4)
    errors: list[BaseException] = []

    def insert(n: int) -> None:
        try:
            store.insert_jobs_with_events([_job(n)])
        except psycopg.Error as err:
            errors.append(err)

    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(insert, range(40)))
    finally:
        store.dispose()
    collisions = (psycopg.errors.DuplicatePreparedStatement,
                  psycopg.errors.InvalidSqlStatementName)
    assert any(isinstance(e, collisions) for e in errors), errors


def _job(n: int) -> dict:
    return {"id": str(uuid.uuid4()), "type": "echo", "queue": "default", "payload": {"n": n},
            "priority": 5, "status": "queued", "max_retries": 3, "timeout_s": 30.0,
            "idempotency_key": None, "request_hash": None, "run_at": None, "delay_s": 0.0,
            "trace_context": None, "limit_key": None, "actor": None}


def test_single_and_batch_enqueues_through_pgbouncer(pooled: Settings, pooled_store: Store,
                                                      settings: Settings) -> None:
    app = create_app(pooled)
    try:
        def post_one(n: int) -> int:
            client = app.test_client()
            return client.post("/api/v1/jobs", json={"type": "echo", "payload": {"n": n}}
                               ).status_code

        with ThreadPoolExecutor(8) as pool:
            singles = list(pool.map(post_one, range(60)))
        client = app.test_client()
        keyed = client.post("/api/v1/jobs", json={"type": "echo"},
                            headers={"Idempotency-Key": "k1"})
        again = client.post("/api/v1/jobs", json={"type": "echo"},
                            headers={"Idempotency-Key": "k1"})
        small = client.post("/api/v1/jobs/batch",
                            json={"jobs": [{"type": "echo"} for _ in range(10)]})
        copied = client.post("/api/v1/jobs/batch",
                             json={"jobs": [{"type": "echo"} for _ in range(COPY_MIN_JOBS)]})
        read = client.get(f"/api/v1/jobs/{keyed.get_json()['id']}")
        listed = client.get("/api/v1/jobs?limit=5")
    finally:
        close_app(app)
    assert singles == [201] * 60
    assert (keyed.status_code, again.status_code) == (201, 200)
    assert again.get_json()["id"] == keyed.get_json()["id"]
    assert small.status_code == 201 and copied.status_code == 201, copied.get_data(as_text=True)
    assert read.status_code == 200 and listed.status_code == 200
    assert statuses(pooled_store) == {"queued": 60 + 1 + 10 + COPY_MIN_JOBS}


def test_nothing_is_prepared_on_pooled_connections(pooled: Settings, pooled_store: Store,
                                                   dispatcher: Dispatcher, pgbouncer) -> None:
    for n in range(12):  # past psycopg's own threshold (5) on each pooled connection
        job = enqueue(pooled_store, dispatcher, payload={"n": n})
        pooled_store.insert_jobs_with_events([_job(n)])
        assert [c.job.id for c in pooled_store.claim_jobs([job.id], "w1", 5.0)] == [job.id]
        pooled_store.get_job(job.id)
    assert prepared_on_every_server_connection(pooled, pgbouncer.pool_size) == \
        [0] * pgbouncer.pool_size


def test_a_worker_drains_through_pgbouncer(pooled: Settings, pooled_store: Store,
                                           dispatcher: Dispatcher, tmp_path) -> None:
    jobs = [enqueue(pooled_store, dispatcher, "simulate", {"sleep_s": 0.01}).id
            for _ in range(200)]
    env = service_env(pooled)
    with service(["worker", "--concurrency", "8"], env, tmp_path) as proc:
        wait_for(lambda: statuses(pooled_store) == {"succeeded": len(jobs)}, timeout=60,
                 interval=0.2, message="every job to succeed")
        assert proc.poll() is None
    log = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "PreparedStatement" not in log and "self-fenc" not in log, log[-3000:]


def test_maintenance_passes_run_through_pgbouncer(pooled: Settings, pooled_store: Store,
                                                  dispatcher: Dispatcher, tmp_path) -> None:
    with pooled_store.transaction() as conn:  # a delayed job due now, unknown to Redis
        due = pooled_store.insert_job(conn, id=uuid.uuid4(), type="echo", queue="default",
                                      payload={}, priority=6, status="scheduled",
                                      max_retries=3, timeout_s=30.0, idempotency_key=None,
                                      request_hash=None, delay_s=0)
    lost = enqueue(pooled_store, dispatcher, push=False)  # Redis lost it: reconciliation
    with service(["maintenance"], service_env(pooled), tmp_path) as proc:
        wait_for(lambda: str(due.id) in dispatcher.list_range(KEYS.ready(6), 0, -1),
                 timeout=20, message="the promoter to push the due job")
        wait_for(lambda: str(lost.id) in dispatcher.list_range(KEYS.ready(5), 0, -1),
                 timeout=20, message="reconciliation to restore the lost job")
        with psycopg.connect(pooled.database_url, prepare_threshold=None) as app_conn:
            job_id = str(taskline.enqueue(app_conn, "echo"))
        wait_for(lambda: job_id in dispatcher.list_range(KEYS.ready(5), 0, -1), timeout=5,
                 message="the outbox relay to push the in-transaction enqueue")
        assert proc.poll() is None
    log = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert '"level": "error"' not in log and "Error" not in log, log[-3000:]


def test_migrate_runs_on_the_direct_url_only(pooled: Settings, tmp_path) -> None:
    from tests.helpers import service as run_service

    without = service_env(pooled.replace(database_direct_url=""))
    with run_service(["migrate"], without, tmp_path) as proc:
        assert proc.wait(30) == 2
    with run_service(["migrate"], service_env(pooled), tmp_path) as proc:
        assert proc.wait(60) == 0
    log = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "TASKLINE_DATABASE_DIRECT_URL" in log


def test_without_a_direct_url_the_outbox_relay_polls(pooled: Settings, pooled_store: Store,
                                                     dispatcher: Dispatcher) -> None:
    relay = OutboxRelay(pooled_store, dispatcher, None)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in range(3):
            with psycopg.connect(pooled.database_url, prepare_threshold=None) as app_conn:
                job_id = str(taskline.enqueue(app_conn, "echo"))
            wait_for(lambda j=job_id: j in dispatcher.list_range(KEYS.ready(5), 0, -1),
                     timeout=1.0, interval=0.01, message="the poll to push the job within 1 s")
    finally:
        stop.set()
        thread.join(10)
    assert relay.listens == 0


def test_without_a_direct_url_a_degraded_worker_polls(pooled_store: Store,
                                                      dispatcher: Dispatcher) -> None:
    stop = threading.Event()
    mode = DispatchMode(store=pooled_store, dispatcher=dispatcher, database_url=None,
                        worker_id="w1", queues=["default"], on_return=lambda: None, stop=stop)
    try:
        mode.lost("test")
        assert mode.degraded and mode._listener is None
        seen = mode.waker.generation
        waited = _timed(lambda: mode.wait(seen))
        assert BACKSTOP_S * 0.9 <= waited <= 1.0
    finally:
        stop.set()
        mode.close()


def _timed(call) -> float:
    import time

    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_the_doctor_reads_postgresql_through_pgbouncer(pooled: Settings) -> None:
    from taskline import doctor

    checks = {c.name: c for c in doctor.run_checks(pooled, doctor.Plan())}
    assert checks["postgres"].status is doctor.Status.OK, checks["postgres"]
    assert checks["schema"].status is doctor.Status.OK, checks["schema"]
    assert checks["session"].status is doctor.Status.OK, checks["session"]
    assert "sessions" in checks["connections"].detail
