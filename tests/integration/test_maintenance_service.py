"""The maintenance service as a whole: `taskline maintenance` runs as a subprocess, acts, and
exits 0 on SIGTERM having released leadership; the depth gauges mirror Redis and PostgreSQL
and vanish when the instance stops leading."""

from __future__ import annotations

import signal
import uuid

from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.dispatch.keys import QueueKeys
from taskline.store.store import Store
from taskline_maintenance.depths import DepthGauges
from tests.helpers import enqueue, service, service_env, wait_for


def leader_rows(store: Store) -> list[str]:
    with store.transaction() as conn:
        return list(conn.execute(text("SELECT holder FROM taskline.leader_leases")).scalars())


def test_the_command_acts_and_exits_0_on_sigterm(store, dispatcher, settings, tmp_path):
    with store.transaction() as conn:  # delayed job due now, never scheduled in Redis
        job = store.insert_job(conn, id=uuid.uuid4(), type="echo", queue="default", payload={},
                               priority=6, status="scheduled", max_retries=3, timeout_s=30.0,
                               idempotency_key=None, request_hash=None, delay_s=0)
    ready = QueueKeys("default").ready(6)

    with service(["maintenance"], service_env(settings), tmp_path) as proc:
        wait_for(lambda: dispatcher.list_range(ready, 0, -1) == [str(job.id)], timeout=20,
                 message="the promoter to push the due job")
        assert len(leader_rows(store)) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0

    assert store.get_job(job.id).status == "queued"
    assert leader_rows(store) == []


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_depth_gauges_mirror_the_queues_and_clear(store, dispatcher, settings):
    for priority in (5, 5, 9):
        enqueue(store, dispatcher, queue="depths", priority=priority)
    assert len(dispatcher.fetch("depths", "w1", 1)) == 1  # takes the priority-9 job
    dispatcher.schedule("depths", str(uuid.uuid4()), 10**13, retry=True)
    dispatcher.restore_dead("depths", [str(uuid.uuid4())])
    store.upsert_worker("w1", "host", 1, ["depths"], 1)
    gauges = DepthGauges(store, dispatcher, settings)

    result = gauges.run_once()

    assert result.ready == 2 and result.processing == 1 and result.live_workers == 1
    assert gauge("job_queue_depth", queue="depths", priority="5") == 2
    assert gauge("job_queue_depth", queue="depths", priority="9") == 0
    assert gauge("job_processing_queue_depth", queue="depths") == 1
    assert gauge("job_retry_queue_depth", queue="depths") == 1
    assert gauge("job_scheduled_queue_depth", queue="depths") == 0
    assert gauge("job_dlq_depth", queue="depths") == 1
    assert gauge("job_oldest_ready_age_seconds", queue="depths") >= 0
    assert gauge("taskline_live_workers") == 1

    gauges.clear()
    assert gauge("job_queue_depth", queue="depths", priority="5") is None
    assert gauge("job_dlq_depth", queue="depths") is None
