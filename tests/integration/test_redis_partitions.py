"""TASKLINE_QUEUE_PARTITIONS against a private Redis Cluster (tests.redis_cluster) and the single
Redis: one queue's ids spread over partitions in several slots, every Redis path of a
partitioned queue (push, wait, fetch, ack, retry, promote, DLQ, requeue, pause, depths), the
reconciler restoring a partitioned queue and moving ids out of partitions a larger setting left
(a rolling change of N loses nothing), and the three services running jobs on 3 partitions.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from redis.cluster import key_slot
from sqlalchemy import text

from taskline import doctor
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QUEUES_SET, QueueKeys, partition_of
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.reconciler import Reconciler
from taskline_producer.app import close_app, create_app
from tests.faults.checker import redis_drift
from tests.faults.cluster import Cluster
from tests.helpers import enqueue, fail, wait_for

pytestmark = pytest.mark.slow

Q = "default"


@pytest.fixture(params=["single", "cluster"])
def any_url(request) -> str:
    return request.getfixturevalue("redis_url" if request.param == "single"
                                   else "cluster_redis_url")


@pytest.fixture
def three(any_url: str) -> Iterator[Dispatcher]:
    d = Dispatcher(any_url, block_timeout_s=0.2, partitions=3)
    yield d
    d.close()


def ready_ids(d: Dispatcher, partition: int) -> list[str]:
    keys = QueueKeys(Q, partition)
    return [i for key in keys.ready_by_urgency for i in d.list_range(key, 0, -1)]


def homed(n: int, partition: int, count: int) -> list[str]:
    """`count` job ids whose home among `n` partitions is `partition`."""
    ids: list[str] = []
    while len(ids) < count:
        job_id = str(uuid.uuid4())
        if partition_of(job_id, n) == partition:
            ids.append(job_id)
    return ids


def test_a_queue_spreads_over_partitions_in_several_slots(three: Dispatcher):
    jobs = [str(uuid.uuid4()) for _ in range(60)]
    three.push([(Q, i % 10, j) for i, j in enumerate(jobs)])
    per_partition = [ready_ids(three, p) for p in range(3)]
    assert all(per_partition)
    assert sorted(i for ids in per_partition for i in ids) == sorted(jobs)
    assert len({key_slot(QueueKeys(Q, p).signal.encode()) for p in range(3)}) == 3
    assert three.client.smembers(QUEUES_SET) == {Q, f"{Q}#1", f"{Q}#2"}
    assert three.known_queues() == {Q}
    assert three.depths(Q)["ready"] == {p: 6 for p in range(9, -1, -1)}

    fetched = three.fetch(Q, "w1", 100)
    assert sorted(fetched) == sorted(jobs)  # every partition served, no CROSSSLOT
    assert three.depths_of([Q])[Q]["processing"] == 60
    three.ack([(Q, j) for j in fetched], "w1")
    assert three.depths(Q)["processing"] == 0
    assert three.processing_lists(Q) == [] or three.cluster  # holders pruned by reconciliation


def test_one_partition_keeps_the_keys_of_a_queue_without_partitions(redis_url):
    one = Dispatcher(redis_url, partitions=1)
    try:
        one.push([(Q, 5, str(uuid.uuid4()))])
        one.schedule(Q, str(uuid.uuid4()), 1)
        assert one.client.smembers(QUEUES_SET) == {Q}
        assert {k.split("}")[0] for k in one.client.scan_iter("taskline:{*")} == {
            "taskline:{default"}
    finally:
        one.close()


def test_every_redis_path_of_a_partitioned_queue(three: Dispatcher):
    far = homed(3, 2, 1)[0]
    pusher = threading.Timer(0.2, three.push, [[(Q, 5, far)]])
    three.wait_and_fetch([Q], "w1", 5, timeout_s=0.01)  # no signal left over
    pusher.start()
    try:
        got = three.wait_and_fetch([Q], "w1", 5, timeout_s=10)
        got += [] if got else three.fetch(Q, "w1", 5)
    finally:
        pusher.join()
    assert got == [far]
    assert three.list_range(QueueKeys(Q, 2).processing("w1"), 0, -1) == [far]

    three.retry_later(Q, "w1", far, 1)  # into its partition's retry set
    assert three.depths(Q)["retry"] == 1 and three.depths(Q)["processing"] == 0
    assert three.promote(Q, 7, [far]) == 1
    assert ready_ids(three, 2) == [far]

    assert three.fetch(Q, "w1", 5) == [far]
    three.dead_letter(Q, "w1", far)
    assert three.depths(Q)["dlq"] == 1
    assert three.drop_dead(Q, [far]) == 1

    held = homed(3, 1, 2)
    three.push([(Q, 5, j) for j in held])
    three.mark_paused(Q, True)
    assert three.paused_markers([Q, "other"]) == {Q}
    assert three.fetch(Q, "w1", 5) == []
    three.client.delete(QueueKeys(Q, 1).paused)  # one partition lost its marker
    assert three.paused_markers([Q]) == set()
    three.mark_paused(Q, False)
    fetched = three.fetch(Q, "w1", 5)
    assert sorted(fetched) == sorted(held)
    assert three.requeue(Q, 3, fetched[0], "w1", always=False)
    assert ready_ids(three, 1) == [fetched[0]]


@pytest.fixture
def cluster_settings(settings: Settings, cluster_redis_url: str) -> Settings:
    return settings.replace(redis_url=cluster_redis_url, queue_partitions=3)


def backdate(store: Store) -> None:
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET updated_at = updated_at - interval '1 minute'"))


def test_a_partitioned_queue_lost_by_redis_is_rebuilt_in_its_homes(store, cluster_settings):
    three = Dispatcher(cluster_settings.redis_url, partitions=3)
    try:
        jobs = [str(enqueue(store, three, push=False).id) for _ in range(30)]
        backdate(store)
        result = Reconciler(store, three, cluster_settings, strand_pause_s=0.1).run_once()
        assert result.missing == {"queued": 30}
        for p in range(3):
            assert sorted(ready_ids(three, p)) == sorted(j for j in jobs
                                                         if partition_of(j, 3) == p)
        again = Reconciler(store, three, cluster_settings, strand_pause_s=0.1).run_once()
        assert not again.changed
    finally:
        three.close()


def test_a_rolling_change_of_partitions_loses_nothing(store, cluster_settings):
    """3 -> 1: reconciliation moves every id home; 1 -> 3: nothing moves, workers of 3
    partitions serve partition 0 too."""
    three = Dispatcher(cluster_settings.redis_url, partitions=3)
    one = Dispatcher(cluster_settings.redis_url, partitions=1)
    try:
        queued = [str(enqueue(store, three, priority=i % 10).id) for i in range(40)]
        retry = enqueue(store, three, push=False, priority=6)
        (claimed,) = store.claim_jobs([retry.id], "w1", 15)
        due_ms = fail(store, claimed.lease_id, "w1", delay_s=600).due_ms
        three.push([(Q, 6, str(retry.id))])
        assert three.fetch(Q, "w1", 100)  # takes every id, then puts them back but one
        for j in queued:
            three.requeue(Q, 5, j, "w1", always=False)
        three.retry_later(Q, "w1", str(retry.id), due_ms)
        away = [j for j in queued if partition_of(j, 3)]
        assert away and three.depths(Q)["processing"] == 0
        backdate(store)

        shrunk = Reconciler(store, one, cluster_settings.replace(queue_partitions=1),
                            strand_pause_s=0.1).run_once()
        assert shrunk.missing == {} and shrunk.corrupted == {}
        assert shrunk.moved == len(away) + (1 if partition_of(str(retry.id), 3) else 0)
        assert sorted(ready_ids(one, 0)) == sorted(queued)  # each once, all home
        assert one.client.zrange(QueueKeys(Q).retry, 0, -1) == [str(retry.id)]
        assert one.client.smembers(QUEUES_SET) == {Q}  # the emptied partitions left
        assert not Reconciler(store, one, cluster_settings.replace(queue_partitions=1),
                              strand_pause_s=0.1).run_once().changed

        grown = Reconciler(store, three, cluster_settings, strand_pause_s=0.1).run_once()
        assert not grown.changed
        assert sorted(three.fetch(Q, "w2", 100)) == sorted(queued)
    finally:
        three.close()
        one.close()


@pytest.mark.timeout(180)
def test_api_worker_and_maintenance_run_jobs_on_three_partitions(fresh_postgres, redis_cluster,
                                                                 cluster_redis_url,
                                                                 tmp_path: Path):
    with Cluster(fresh_postgres, redis_cluster, tmp_path,  # type: ignore[arg-type]
                 workers=2, concurrency=2, settings={"queue_partitions": 3}) as services:
        ids = []
        for i in range(30):
            answer = requests.post(services.api_url + "/api/v1/jobs", timeout=10, json={
                "type": "fault.work", "payload": {"sleep_s": 0.01}, "priority": i % 10})
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        wait_for(lambda: services.query(
            "SELECT count(*) FROM taskline.jobs WHERE status = 'succeeded'")[0][0] == 30,
            timeout=60, message="30 jobs succeeded")
        assert {partition_of(j, 3) for j in ids} == {0, 1, 2}
        assert services.dispatcher.client.smembers(QUEUES_SET) >= {Q, f"{Q}#1", f"{Q}#2"}
        # Maintenance vouches for Redis once it leads and has rebuilt it (a second or more after
        # start): on a loaded machine the 30 jobs may finish before that.
        wait_for(lambda: requests.get(services.api_url + "/api/v1/queues", timeout=10).json()
                 ["dispatch"]["mode"] == "redis", timeout=30,
                 message="the API reads the dispatch mode as redis")
        switched = [r for r in services.log_events(("worker",))
                    if r.get("action") == "dispatch_mode"]
        assert switched == []  # no worker ever claimed from PostgreSQL
        jobs = {str(r[0]): {"queue": r[1], "status": r[2]} for r in services.query(
            "SELECT id, queue, status FROM taskline.jobs")}
        # The last acks may follow the last success by a moment.
        wait_for(lambda: redis_drift(services, jobs) == [], timeout=30,
                 message="Redis agrees with PostgreSQL on every partition")


def test_the_api_sums_partitions_and_pauses_them_all(settings: Settings):
    app = create_app(settings.replace(queue_partitions=3))
    three = Dispatcher(settings.redis_url, partitions=3)
    try:
        client = app.test_client()
        for i in range(30):
            answer = client.post("/api/v1/jobs", json={"type": "echo", "priority": i % 3})
            assert answer.status_code == 201, answer.get_json()
        assert all(ready_ids(three, p) for p in range(3))
        (queue,) = client.get("/api/v1/queues").get_json()["queues"]  # no `default#1` row
        assert queue["name"] == Q
        assert queue["redis"]["ready_total"] == 30
        ready = {p: n for p, n in queue["redis"]["ready"].items() if n}
        assert ready == {"0": 10, "1": 10, "2": 10}

        assert client.post(f"/api/v1/queues/{Q}/pause").status_code == 200
        assert three.paused_markers([Q]) == {Q}
        assert three.fetch(Q, "w1", 30) == []
        assert client.post(f"/api/v1/queues/{Q}/resume").status_code == 200
        assert len(three.fetch(Q, "w1", 30)) == 30
    finally:
        three.close()
        close_app(app)


def test_the_doctor_warns_of_partitions_above_the_setting(cluster_redis_url):
    three = Dispatcher(cluster_redis_url, partitions=3)
    try:
        three.push([(Q, 5, j) for p in range(3) for j in homed(3, p, 1)])
    finally:
        three.close()
    facts = doctor.read_redis(cluster_redis_url)
    assert not isinstance(facts, str) and facts.partitions_found == 3
    assert doctor.check_queue_partitions(facts, 3).status is doctor.Status.OK
    assert doctor.check_queue_partitions(facts, 1).status is doctor.Status.WARN
