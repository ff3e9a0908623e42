"""Redis Cluster as such, on a private 3-master, 3-replica cluster (tests.redis_cluster): cluster
mode detected from the URL's node, redirections a plain client meets counted unavailable, waits
over queues of several slots, processing lists found through their registry, and the three
services running jobs on the cluster with dispatch staying in Redis.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from redis.cluster import RedisCluster, key_slot

from taskline.access import Quota
from taskline.dispatch.connection import detect_cluster
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.errors import DispatchUnavailable
from taskline.quota import RETRY_REDIS_S, EnqueueQuotas, quota_key
from tests.faults.cluster import Cluster
from tests.helpers import wait_for
from tests.redis_cluster import RedisClusterServers

pytestmark = pytest.mark.slow


def queue_not_on(servers: RedisClusterServers, port: int) -> str:
    """A queue name whose slot the node at `port` does not serve."""
    for i in range(1000):
        name = f"q{i}"
        if servers.master_of(QueueKeys(name).signal).port != port:
            return name
    raise AssertionError("every queue on one node")


def test_cluster_mode_is_detected_from_any_node(redis_cluster, cluster_redis_url, redis_url,
                                                unused_port):
    assert detect_cluster(redis_url) is False
    assert detect_cluster(f"redis://127.0.0.1:{unused_port}/0") is None
    assert detect_cluster(f"redis+cluster://127.0.0.1:{unused_port}/0") is True
    for node in redis_cluster.nodes:  # masters and replicas alike
        assert detect_cluster(node.url) is True
    clustered, single = Dispatcher(cluster_redis_url), Dispatcher(redis_url)
    try:
        assert clustered.cluster and isinstance(clustered.client, RedisCluster)
        assert not single.cluster and not isinstance(single.client, RedisCluster)
    finally:
        clustered.close()
        single.close()


def test_a_move_met_by_a_plain_client_is_unavailable_then_followed(redis_cluster,
                                                                    cluster_redis_url):
    """As when the node could not be asked at start: the MOVED is no silent reply error."""
    dispatcher = Dispatcher(cluster_redis_url)
    try:
        dispatcher._build(cluster=False)
        queue = queue_not_on(redis_cluster, redis_cluster.nodes[0].port)
        job = str(uuid.uuid4())
        with pytest.raises(DispatchUnavailable, match="MovedError"):
            dispatcher.push([(queue, 5, job)])
        assert dispatcher.cluster
        dispatcher.push([(queue, 5, job)])
        assert dispatcher.fetch(queue, "w1", 5) == [job]
    finally:
        dispatcher.close()


def test_a_worker_waits_on_queues_of_several_slots(cluster_redis_url):
    assert key_slot(QueueKeys("a").signal.encode()) != key_slot(QueueKeys("b").signal.encode())
    dispatcher = Dispatcher(cluster_redis_url, block_timeout_s=30)
    job = str(uuid.uuid4())
    pusher = threading.Timer(0.2, dispatcher.push, [[("b", 5, job)]])
    try:
        dispatcher.wait_and_fetch(["a", "b"], "w1", 5, timeout_s=0.01)  # no signal left over
        pusher.start()
        started = time.monotonic()
        assert dispatcher.wait_and_fetch(["a", "b"], "w1", 5) == []  # woken by b's push
        assert time.monotonic() - started < 15  # far from the 30 s block
        assert dispatcher.fetch("b", "w1", 5) == [job]
    finally:
        pusher.join()
        dispatcher.close()


@pytest.mark.parametrize("target", ["single", "cluster"])
def test_processing_lists_are_found_through_their_registry(request, target):
    url = request.getfixturevalue("redis_url" if target == "single" else "cluster_redis_url")
    dispatcher = Dispatcher(url)
    keys = QueueKeys("default")
    try:
        jobs = [str(uuid.uuid4()) for _ in range(3)]
        dispatcher.push([("default", 5, j) for j in jobs])
        assert dispatcher.fetch("default", "w1", 1) == jobs[:1]
        assert dispatcher.fetch("default", "w2", 2) == jobs[1:]
        assert dispatcher.client.smembers(keys.holders) == {"w1", "w2"}
        assert dispatcher.processing_lists("default") == [keys.processing("w1"),
                                                          keys.processing("w2")]
        dispatcher.ack([("default", jobs[0])], "w1")  # w1's list is gone
        assert dispatcher.forget_holders("default", ["w1", "w2"]) == 1
        assert dispatcher.processing_lists("default") == [keys.processing("w2")]
        assert dispatcher.processing_lists_of(["default", "empty"]) == {
            "default": [keys.processing("w2")], "empty": []}
        assert dispatcher.depths_of(["default"])["default"]["processing"] == 2
        assert dispatcher.fetch("default", "w1", 1) == []  # nothing moved: not registered
        assert dispatcher.client.smembers(keys.holders) == {"w2"}
    finally:
        dispatcher.close()


@pytest.mark.timeout(180)
def test_api_worker_and_maintenance_run_jobs_on_the_cluster(fresh_postgres, redis_cluster,
                                                            cluster_redis_url, tmp_path: Path):
    with Cluster(fresh_postgres, redis_cluster, tmp_path,  # type: ignore[arg-type]
                 workers=2, concurrency=2) as services:
        ids = []
        for i in range(30):
            answer = requests.post(services.api_url + "/api/v1/jobs", timeout=10, json={
                "type": "fault.work", "payload": {"sleep_s": 0.01}, "priority": i % 10})
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        wait_for(lambda: services.query(
            "SELECT count(*) FROM taskline.jobs WHERE status = 'succeeded'")[0][0] == 30,
            timeout=60, message="30 jobs succeeded")
        wait_for(lambda: requests.get(services.api_url + "/api/v1/queues", timeout=10).json()
                 ["dispatch"]["mode"] == "redis", timeout=30, message="dispatch mode redis")
        switched = [r for r in services.log_events(("worker",))
                    if r.get("action") == "dispatch_mode"]
        assert switched == []  # no worker ever claimed from PostgreSQL
        assert services.dispatcher.cluster


def test_a_cluster_url_naming_another_database_is_refused_at_start(cluster_redis_url):
    with pytest.raises(ValueError, match="only database 0"):
        Dispatcher(cluster_redis_url.rsplit("/", 1)[0] + "/3")


def test_a_cluster_scheme_while_no_node_answers_starts_and_counts_unavailable(unused_port):
    dispatcher = Dispatcher(f"redis+cluster://127.0.0.1:{unused_port}/0", timeout_s=0.5)
    try:
        assert not dispatcher.cluster
        with pytest.raises(DispatchUnavailable):
            dispatcher.push([("default", 5, str(uuid.uuid4()))])
    finally:
        dispatcher.close()


def test_quotas_met_by_a_move_turn_to_the_cluster(redis_cluster, cluster_redis_url):
    """As when the node could not be asked at start: unchecked once (fail open), then checked."""
    name = next(f"client{i}" for i in range(1000)
                if redis_cluster.master_of(quota_key(f"client{i}")).port
                != redis_cluster.nodes[0].port)
    now = [0.0]
    quotas = EnqueueQuotas(cluster_redis_url, {name: Quota(5, 60.0)}, clock=lambda: now[0])
    try:
        quotas._connect(cluster=False)
        assert not quotas.take(name, 1).checked
        now[0] += RETRY_REDIS_S + 0.1
        assert quotas.take(name, 5).checked
        assert not quotas.take(name, 1).taken  # the window holds 5
    finally:
        quotas.close()
