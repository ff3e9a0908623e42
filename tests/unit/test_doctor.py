"""The doctor's verdicts, without servers: each check of taskline.doctor on the facts that make
it pass, warn, fail or skip; the migration head read from the files' text; the connection
counts kept equal to what the services open."""

from __future__ import annotations

import dataclasses

import pytest

from taskline import doctor
from taskline.doctor import Check, Plan, PostgresFacts, RedisFacts, Status
from taskline.settings import Settings

PG = PostgresFacts(version_num=150020, version="15.20", autovacuum="on", track_counts="on",
                   max_connections=100, reserved=3, others=2, skew_s=0.01, skew_error_s=0.001,
                   revision="0013")
REDIS = RedisFacts(version="7.0.15", maxmemory_policy="noeviction", maxmemory=0,
                   cluster_enabled=False, cluster_state="?", cluster_size=0, db=0)


def pg(**changes) -> PostgresFacts:
    return dataclasses.replace(PG, **changes)


def rd(**changes) -> RedisFacts:
    return dataclasses.replace(REDIS, **changes)


@pytest.mark.parametrize(("facts", "expected"), [
    (PG, Status.OK), (pg(version_num=130000, version="13.0"), Status.OK),
    (pg(version_num=120015, version="12.15"), Status.FAIL), ("connection refused", Status.FAIL),
])
def test_postgres_reachable_and_recent_enough(facts, expected):
    assert doctor.check_postgres(facts).status is expected


@pytest.mark.parametrize(("version", "expected"), [
    ("7.2.4", Status.OK), ("6.2.0", Status.OK), ("6.0.16", Status.FAIL), ("5.0.7", Status.FAIL),
])
def test_redis_recent_enough_for_lmove(version, expected):
    assert doctor.check_redis(rd(version=version)).status is expected
    assert doctor.check_redis("timeout").status is Status.FAIL


@pytest.mark.parametrize(("revision", "expected"), [
    ("0013", Status.OK), ("0012", Status.FAIL), (None, Status.FAIL), ("0099", Status.WARN),
])
def test_schema_at_the_newest_revision(revision, expected):
    known = [f"{n:04d}" for n in range(1, 14)]
    assert doctor.check_schema(pg(revision=revision), "taskline", "0013", known).status \
        is expected


@pytest.mark.parametrize(("autovacuum", "track_counts", "expected"), [
    ("on", "on", Status.OK), ("off", "on", Status.FAIL), ("on", "off", Status.FAIL),
])
def test_autovacuum_on(autovacuum, track_counts, expected):
    facts = pg(autovacuum=autovacuum, track_counts=track_counts)
    assert doctor.check_autovacuum(facts).status is expected


@pytest.mark.parametrize(("policy", "expected"), [
    ("noeviction", Status.OK), ("allkeys-lru", Status.FAIL), ("volatile-lru", Status.FAIL),
    ("volatile-ttl", Status.FAIL),
])
def test_only_noeviction_passes(policy, expected):
    assert doctor.check_eviction(rd(maxmemory_policy=policy)).status is expected


@pytest.mark.parametrize(("facts", "expected"), [
    (REDIS, Status.OK),
    (rd(cluster_enabled=True, cluster_state="ok", cluster_size=3), Status.OK),
    (rd(cluster_enabled=True, cluster_state="fail"), Status.FAIL),
    (rd(cluster_enabled=True, cluster_state="ok", db=15), Status.FAIL),
])
def test_cluster_healthy_and_on_database_0(facts, expected):
    assert doctor.check_cluster(facts).status is expected


CLUSTER = {"cluster_enabled": True, "cluster_state": "ok", "cluster_size": 3}


@pytest.mark.parametrize(("facts", "partitions", "expected"), [
    (REDIS, 1, Status.OK), (rd(**CLUSTER, partitions_found=3), 3, Status.OK),
    (rd(**CLUSTER), 3, Status.OK),  # nothing pushed yet, or a grown setting
    (rd(**CLUSTER, partitions_found=3), 1, Status.WARN),  # a service with a larger N
    (REDIS, 4, Status.WARN),  # partitions on one server gain nothing
    ("connection refused", 3, Status.SKIP),
])
def test_partitions_agree_with_redis_and_have_a_use(facts, partitions, expected):
    check = doctor.check_queue_partitions(facts, partitions)
    assert check.status is expected
    assert bool(check.fix) == (expected is Status.WARN)


@pytest.mark.parametrize(("skew_s", "error_s", "expected"), [
    (0.2, 0.001, Status.OK), (-0.9, 0.001, Status.OK), (1.5, 0.001, Status.FAIL),
    (-30.0, 0.002, Status.FAIL), (1.2, 0.5, Status.OK),  # within the reading's uncertainty
])
def test_clock_within_a_second_of_postgresql(skew_s, error_s, expected):
    check = doctor.check_clock(pg(skew_s=skew_s, skew_error_s=error_s))
    assert check.status is expected
    assert ("ahead of" in check.detail) == (skew_s < 0)


def test_connections_count_every_pool_at_its_peak():
    plan = Plan(workers=2, concurrency=10, api_processes=4, maintenance=2)
    assert plan.pooled() == 2 * 2 * (10 + doctor.WORKER_EXTRA_CONNECTIONS) \
        + 4 * doctor.API_POOL_SIZE + 2 * 2 * doctor.MAINTENANCE_POOL_SIZE
    assert plan.sessions() == 4


@pytest.mark.parametrize(("plan", "pooled", "expected"), [
    (Plan(), False, Status.OK),                                   # 72 of 95
    (Plan(workers=2), False, Status.FAIL),                        # 115 of 95
    (Plan(concurrency=24), False, Status.WARN),                   # 88 of 95
    (Plan(workers=10, concurrency=32), True, Status.OK),          # 11 sessions
    (Plan(workers=100), True, Status.FAIL),                       # 101 sessions
])
def test_connections_against_max_connections(plan, pooled, expected):
    assert doctor.check_connections(PG, plan, pooled).status is expected


def test_checks_that_need_an_unreachable_server_skip():
    for check in (doctor.check_schema("down", "taskline", "0013"),
                  doctor.check_autovacuum("down"), doctor.check_clock("down"),
                  doctor.check_connections("down", Plan()), doctor.check_eviction("down"),
                  doctor.check_cluster("down")):
        assert check.status is Status.SKIP


def test_the_session_check_follows_the_pooling_setting():
    session = Settings()
    pooled = Settings(database_pooling="transaction")
    direct = Settings(database_pooling="transaction", database_direct_url="postgresql://db/x")
    assert doctor.check_session(session, None).status is Status.OK
    assert doctor.check_session(pooled, None).status is Status.WARN
    assert doctor.check_session(direct, None).status is Status.OK
    assert doctor.check_session(direct, "connection refused").status is Status.FAIL


def test_a_line_names_status_check_and_fix():
    assert Check("eviction", Status.FAIL, "allkeys-lru", "set noeviction").line() == \
        "fail  eviction    allkeys-lru; fix: set noeviction"
    assert Check("eviction", Status.OK, "noeviction").line(18) == \
        "ok    eviction           noeviction", "padded to the table's widest name"
    assert Check("clock", Status.OK, "in step").as_dict() == \
        {"name": "clock", "status": "ok", "detail": "in step", "fix": ""}
    assert doctor.failed([Check("a", Status.WARN, "")]) is False
    assert doctor.failed([Check("a", Status.OK, ""), Check("b", Status.FAIL, "")]) is True


def test_the_head_is_the_revision_nobody_names_as_its_parent():
    texts = ["revision = '0002'\ndown_revision = '0001'\n",
             'revision = "0001"\ndown_revision = None\n',
             "revision = '0003'\ndown_revision = '0002'\n"]
    assert doctor.revisions(texts) == ("0003", ["0002", "0001", "0003"])
    forked = [*texts, "revision = '0004'\ndown_revision = '0002'\n"]
    assert doctor.revisions(forked)[0] is None


def test_this_releases_head_is_alembics():
    from alembic.script import ScriptDirectory

    from taskline.store.migrate import alembic_config

    head, known = doctor.migration_revisions()
    script = ScriptDirectory.from_config(alembic_config("postgresql://localhost/x"))
    assert head == script.get_current_head()
    assert sorted(known) == sorted(r.revision for r in script.walk_revisions())


def test_the_connection_counts_are_the_services_own():
    from taskline_producer.operations.backends import POOL_SIZE
    from taskline_worker.worker import EXTRA_CONNECTIONS

    assert doctor.WORKER_EXTRA_CONNECTIONS == EXTRA_CONNECTIONS
    assert doctor.API_POOL_SIZE == POOL_SIZE


@pytest.mark.parametrize(("partitions", "expected"), [
    ({"job_events": (7, False), "job_leases": (7, False)}, Status.OK),
    ({"job_events": (7, False), "job_leases": (3, False)}, Status.WARN),
    ({"job_events": (0, False), "job_leases": (7, False)}, Status.FAIL),
    ({"job_events": (7, True), "job_leases": (7, False)}, Status.FAIL),
    (None, Status.SKIP),
])
def test_history_partitions_exist_ahead(partitions, expected):
    assert doctor.check_history_partitions(pg(partitions=partitions), 7).status is expected
    assert doctor.check_history_partitions("connection refused", 7).status is Status.SKIP
