"""Redis Cluster faults under load: a master of the queue's slot fails over during a drain,
coordinated (`CLUSTER FAILOVER`) or because it was SIGKILLed, the queue's slot migrates to
another master, or every node goes down and comes back empty, while producers enqueue
through the API and workers drain; judged by the offline checker.

Invariant under test: a failover the cluster client can follow (MOVED after the switch) is
followed; one it cannot (a dead master until its replica is promoted) counts as Redis
unavailable, so dispatch goes on from PostgreSQL and comes back to the cluster once it was
rebuilt. Either way nothing acknowledged is lost and nothing runs twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from tests.faults.cluster import Cluster
from tests.faults.conftest import FaultRun
from tests.faults.history import History
from tests.faults.nemesis import Nemesis
from tests.faults.report import FaultReport
from tests.faults.test_redis_down_faults import load, switch_counts, wait_switched
from tests.faults.test_server_faults import acked, assert_ran_once, wait_acked
from tests.faults.workload import Workload
from tests.helpers import wait_for
from tests.redis_cluster import RedisClusterServers

pytestmark = pytest.mark.faults

QUEUE_KEY = QueueKeys("default").signal
"""A key of the loaded queue: its slot's master is the one failed over."""


@pytest.fixture
def cluster_fault_run(fresh_postgres, fresh_redis_cluster: RedisClusterServers, tmp_path: Path,
                      fault_report: FaultReport) -> Iterator[Callable[..., FaultRun]]:
    """`fault_run` (tests.faults.conftest) with every service's REDIS_URL at one node of a
    fresh 3-master, 3-replica Redis Cluster."""
    made: list[FaultRun] = []

    def make(name: str, **options: Any) -> FaultRun:
        workdir = tmp_path / "scenario"
        cluster = Cluster(fresh_postgres, fresh_redis_cluster, workdir,  # type: ignore[arg-type]
                          **options)
        history = History(workdir / "history.jsonl")
        run = FaultRun(name, cluster, history, Nemesis(cluster, history),
                       Workload("", history), fault_report)
        made.append(run)
        cluster.on_restart = run.nemesis.supervised_restart
        cluster.start()
        run.workload.api_url = cluster.api_url
        return run

    yield make
    for run in made:
        run.cluster.close()
        run.history.close()


def wait_back_on_redis(run: FaultRun) -> None:
    """Until every worker that went to postgres dispatch came back to Redis: a failover the
    dispatcher could not follow must not leave it off the cluster for good."""
    wait_for(lambda: switch_counts(run, "redis") == switch_counts(run, "postgres"),
             timeout=60, interval=0.2, message="every worker back on Redis dispatch")


@pytest.mark.timeout(240)
def test_cluster_failover_of_the_queues_master_during_a_drain(
        cluster_fault_run, fresh_redis_cluster: RedisClusterServers):
    run = cluster_fault_run("Redis Cluster: CLUSTER FAILOVER of the queue's master mid-drain",
                            workers=2, concurrency=4)
    servers = fresh_redis_cluster
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 40)
        old = servers.master_of(QUEUE_KEY)
        new = servers.failover(old)
        run.nemesis.fault("cluster_failover", "redis", old_port=old.port, new_port=new.port)
        assert servers.master_of(QUEUE_KEY) is new
        wait_acked(answers, acked(answers) + 60)
        wait_back_on_redis(run)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)


@pytest.mark.timeout(240)
def test_sigkilled_master_of_the_queue_during_a_drain(
        cluster_fault_run, fresh_redis_cluster: RedisClusterServers):
    run = cluster_fault_run("Redis Cluster: SIGKILL of the queue's master mid-drain",
                            workers=2, concurrency=4)
    servers = fresh_redis_cluster
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 40)
        old = servers.master_of(QUEUE_KEY)
        pid = old.pid
        old.kill()
        run.nemesis.fault("sigkill", "redis", port=old.port, pid=pid)
        servers.wait_healthy()  # a replica took the slots over
        run.nemesis.heal("promoted", "redis", port=servers.master_of(QUEUE_KEY).port)
        wait_acked(answers, acked(answers) + 60)
        wait_back_on_redis(run)
    # The checker's own client may still hold the dead node in its slot map: one at a live
    # master reads the cluster as it is now.
    run.cluster.dispatcher.close()
    run.cluster.dispatcher = Dispatcher(servers.masters()[0].url, block_timeout_s=0.2)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)


@pytest.mark.timeout(240)
def test_slot_migration_of_the_queue_during_a_drain(
        cluster_fault_run, fresh_redis_cluster: RedisClusterServers):
    """The queue's slot moves to another master key by key while workers fetch and ack: a
    client meets ASK (key moved) and TRYAGAIN (a script's keys on both sides)."""
    run = cluster_fault_run("Redis Cluster: the queue's slot migrated mid-drain", workers=2,
                            concurrency=4)
    servers = fresh_redis_cluster
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 40)
        old = servers.master_of(QUEUE_KEY)
        to = next(m for m in servers.masters() if m is not old)
        servers.migrate_slot(QUEUE_KEY, to)
        run.nemesis.fault("migrate_slot", "redis", from_port=old.port, to_port=to.port)
        assert servers.master_of(QUEUE_KEY) is to
        wait_acked(answers, acked(answers) + 60)
        wait_back_on_redis(run)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)


@pytest.mark.timeout(300)
def test_whole_cluster_down_then_back_during_a_drain(
        cluster_fault_run, fresh_redis_cluster: RedisClusterServers):
    """Every node SIGKILLed: workers claim from PostgreSQL; the nodes come back empty (with
    their cluster config) and are rebuilt, and workers return to the cluster."""
    run = cluster_fault_run("Redis Cluster: every node down, then back empty, mid-drain",
                            workers=2, concurrency=4)
    servers = fresh_redis_cluster
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 40)
        for node in servers.nodes:
            node.kill()
        run.nemesis.fault("sigkill", "redis", nodes=len(servers.nodes))
        down_from = acked(answers)
        wait_switched(run, "postgres")
        wait_acked(answers, down_from + 40)  # accepted and run while the cluster is down
        for node in servers.nodes:
            node.start()
        servers.wait_healthy()
        run.nemesis.heal("start", "redis", nodes=len(servers.nodes))
        wait_back_on_redis(run)
        wait_acked(answers, acked(answers) + 40)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)


@pytest.mark.timeout(300)
def test_queue_partitions_shrunk_by_a_rolling_change_during_a_drain(cluster_fault_run):
    """TASKLINE_QUEUE_PARTITIONS 3 -> 1 while producers enqueue: each worker, then maintenance,
    is replaced by one with N = 1 while the API goes on pushing to 3 partitions (a rolling
    change half done, old and new side by side). The new workers serve partition 0 only;
    reconciliation moves what partitions 1 and 2 hold there."""
    run = cluster_fault_run("Redis Cluster: queue partitions 3 -> 1, rolled mid-drain",
                            workers=2, concurrency=4, settings={"queue_partitions": 3})
    one = {"TASKLINE_QUEUE_PARTITIONS": "1"}
    with load(run, sleep_s=0.05) as answers:
        wait_acked(answers, 40)
        for old in [*run.cluster.workers, *run.cluster.maintenances]:
            if old.kind == "worker":
                run.cluster.add_worker(env=one)
            else:
                run.cluster.add_maintenance(env=one)
            old.stop()
            run.nemesis.fault("rolled", old.kind, pid=old.pid, partitions=1)
            wait_acked(answers, acked(answers) + 20)
        # The new maintenance moves what the API still pushes to partitions 1 and 2.
        wait_for(lambda: any(r.get("moved") for r in run.cluster.log_events(("maintenance",))),
                 timeout=60, interval=0.5, message="ids moved out of partitions 1 and 2")
        wait_acked(answers, acked(answers) + 40)
    result = run.check(wait_s=90)
    assert_ran_once(run, result)
