"""Dead jobs grouped by cause, against real PostgreSQL and Redis: the fingerprint is written when
a job is dead-lettered (by a worker's failure and by the reaper's last recovery), GET
/api/v1/dlq/groups counts the groups, retry and purge act on one group by its fingerprint, the
client (sync and async) and `taskline dlq groups` show them, and migration 0015 fingerprints
the dead jobs already there."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from pathlib import Path

import pytest
from alembic import command
from psycopg import sql as pgsql
from sqlalchemy import text

from taskline import transitions
from taskline.client import AsyncClient, Client
from taskline.fingerprint import fingerprint
from taskline.store.migrate import alembic_config, upgrade
from taskline.store.rows import Settlement
from taskline.store.store import Store
from tests.conftest import _admin, db_url
from tests.helpers import enqueue, fail
from tests.integration.test_cli_client import taskline
from tests.integration.test_client_api import start_api

WORKER = "w-1"


def dead(store, dispatcher, error: str, *, job_type: str = "mail", queue: str = "q1") -> str:
    """A job dead after its only attempt failed with `error`, recorded as a worker records it."""
    job = enqueue(store, dispatcher, job_type, queue=queue, max_retries=0, push=False)
    (claimed,) = store.claim_jobs([job.id], WORKER, 30.0)
    assert fail(store, claimed.lease_id, WORKER, error) is not None
    return str(job.id)


def stored(store, job_id: str) -> str | None:
    with store.transaction() as conn:
        return conn.execute(text("SELECT fingerprint FROM taskline.dead_letter_jobs "
                                 "WHERE job_id = :id"), {"id": job_id}).scalar_one()


def statuses(store) -> Counter:
    with store.transaction() as conn:
        return Counter(r.status for r in conn.execute(text("SELECT status FROM taskline.jobs")))


def plant(store, dispatcher) -> dict[str, list[str]]:
    """Five dead jobs of two causes: a ValueError differing only in masked values, and a
    KeyError."""
    return {"value": [dead(store, dispatcher, f"ValueError: order {n} of 'user-{n}' failed",
                           job_type=t, queue=q)
                      for n, (t, q) in enumerate([("mail", "q1"), ("mail", "q2"),
                                                  ("sms", "q1")])],
            "key": [dead(store, dispatcher, f"KeyError: '{k}'") for k in ("a", "b")]}


def test_a_worker_failure_and_the_reapers_last_recovery_store_the_fingerprint(
        store, dispatcher):
    job_id = dead(store, dispatcher, "ValueError: order 42 failed")
    assert stored(store, job_id) == fingerprint("ValueError: order 7 failed")
    job = enqueue(store, dispatcher, "mail", max_retries=0, push=False)
    (claimed,) = store.claim_jobs([job.id], WORKER, 30.0)
    lost = transitions.recovered(WORKER, last=True)
    assert store.settle([Settlement(claimed.lease_id, WORKER, lost)])
    assert stored(store, str(job.id)) == fingerprint(lost.error)


def test_groups_count_dead_jobs_by_cause(client, store, dispatcher):
    ids = plant(store, dispatcher)
    answer = client.get("/api/v1/dlq/groups")
    assert answer.status_code == 200
    groups = answer.get_json()["groups"]
    assert [(g["count"], g["types"], g["queues"]) for g in groups] == [
        (3, ["mail", "sms"], ["q1", "q2"]), (2, ["mail"], ["q1"])]
    value, key = groups
    assert value["fingerprint"] == fingerprint("ValueError: order 1 of 'x' failed")
    assert value["sample_error"] == "ValueError: order 2 of 'user-2' failed"
    assert value["first_seen"] <= value["last_seen"]
    assert key["fingerprint"] == stored(store, ids["key"][0]) != value["fingerprint"]
    only_q2 = client.get("/api/v1/dlq/groups?queue=q2").get_json()["groups"]
    assert [(g["fingerprint"], g["count"]) for g in only_q2] == [(value["fingerprint"], 1)]
    assert len(client.get("/api/v1/dlq/groups?limit=1").get_json()["groups"]) == 1
    listed = client.get("/api/v1/dlq").get_json()["jobs"]
    assert {j["fingerprint"] for j in listed} == {value["fingerprint"], key["fingerprint"]}


def test_retry_and_purge_act_on_one_group(client, store, dispatcher):
    ids = plant(store, dispatcher)
    key = stored(store, ids["key"][0])
    answer = client.post("/api/v1/dlq/retry", json={"fingerprint": key})
    assert answer.get_json() == {"requeued": 2, "remaining": 0}
    assert statuses(store) == Counter({"dead": 3, "queued": 2})
    value = stored(store, ids["value"][0])
    answer = client.post("/api/v1/dlq/purge", json={"fingerprint": value, "queue": "q1"})
    assert answer.get_json() == {"purged": 2, "remaining": 0}
    assert statuses(store) == Counter({"dead": 1, "queued": 2})
    assert [g["count"] for g in client.get("/api/v1/dlq/groups").get_json()["groups"]] == [1]


@pytest.mark.parametrize("body", [{"fingerprint": None}, {"fingerprint": "xyz"},
                                  {"fingerprint": "ABCDEF0123456789"}, {"fingerprint": 5}])
@pytest.mark.parametrize("route", ["retry", "purge"])
def test_a_bad_fingerprint_is_422_and_changes_nothing(client, store, dispatcher, body, route):
    plant(store, dispatcher)
    answer = client.post(f"/api/v1/dlq/{route}", json=body)
    assert answer.status_code == 422
    assert answer.get_json()["error"]["details"][0]["field"] == "fingerprint"
    assert statuses(store) == Counter({"dead": 5})


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "queue=bad%20queue"])
def test_bad_group_parameters_are_400(client, query):
    assert client.get(f"/api/v1/dlq/groups?{query}").status_code == 400


def test_client_sync_async_and_cli(settings, store, dispatcher, tmp_path: Path):
    ids = plant(store, dispatcher)
    api = start_api(settings, tmp_path / "logs")
    url = next(api)
    try:
        with Client(url) as sync:
            groups = sync.dlq_groups()["groups"]
            assert [g["count"] for g in groups] == [3, 2]

        async def requeue() -> dict:
            async with AsyncClient(url) as client:
                assert (await client.dlq_groups(limit=1))["groups"] == groups[:1]
                return await client.retry_dead(fingerprint=groups[1]["fingerprint"])

        assert asyncio.run(requeue()) == {"requeued": 2, "remaining": 0}
        shown = taskline("dlq", "groups", url=url)
        assert shown.returncode == 0, shown.stderr
        assert groups[0]["fingerprint"] in shown.stdout and "ValueError" in shown.stdout
        purged = taskline("dlq", "purge", "--fingerprint", groups[0]["fingerprint"], "--json",
                          url=url)
        assert json.loads(purged.stdout) == {"purged": 3, "remaining": 0}
        assert statuses(store) == Counter({"queued": len(ids["key"])})
    finally:
        next(api, None)


def test_migration_fingerprints_the_dead_jobs_already_there():
    name = f"taskline_m_{uuid.uuid4().hex[:12]}"
    url = db_url(name)
    try:
        _admin(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        command.upgrade(alembic_config(url), "0014")
        errors = [f"ValueError: order {n} failed" for n in range(2500)] + [None, "KeyError: 'x'"]
        store = Store.connect(url, pool_size=1)
        with store.transaction() as conn:
            conn.execute(text(
                "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, "
                "max_retries, timeout_s) SELECT gen_random_uuid(), 'mail', 'q', '{}', 5, 'dead', "
                "0, 30 FROM generate_series(1, :n)"), {"n": len(errors)})
            conn.execute(text(
                "INSERT INTO taskline.dead_letter_jobs (job_id, final_error, attempts) "
                "SELECT id, (CAST(:errors AS text[]))[row_number() OVER (ORDER BY id)], 1 "
                "FROM taskline.jobs"), {"errors": errors})
        upgrade(url)
        with store.transaction() as conn:
            rows = conn.execute(text("SELECT final_error, fingerprint "
                                     "FROM taskline.dead_letter_jobs")).all()
        store.dispose()
        assert len(rows) == len(errors)
        assert all(row.fingerprint == fingerprint(row.final_error) for row in rows)
        assert len({row.fingerprint for row in rows}) == 3
    finally:
        _admin(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            pgsql.Identifier(name)))
