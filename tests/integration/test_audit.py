"""The audit trail: cancels and requeues recorded with their actor, GET /api/v1/audit (filters,
cursor pages, bad parameters), append-only records, and retention by maintenance."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy
from flask import Flask
from flask.testing import FlaskClient

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.audit_retention import AuditRetention
from taskline_producer.app import close_app, create_app
from tests.helpers import wait_for
from tests.integration.test_api_jobs import make_dead

OPS = {"Authorization": "Bearer o-secret"}
WRITER = {"Authorization": "Bearer w-secret"}


@pytest.fixture
def audited(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings.replace(api_tokens=(
        "ops:o-secret:jobs:operate+jobs:read", "ingest:w-secret:jobs:write")))
    yield app
    close_app(app)


def post(client: FlaskClient) -> dict:
    r = client.post("/api/v1/jobs", json={"type": "echo"}, headers=WRITER)
    assert r.status_code == 201
    return r.get_json()


def test_cancel_and_retry_are_recorded_with_their_actor(audited: Flask, store: Store,
                                                        dispatcher: Dispatcher) -> None:
    client = audited.test_client()
    cancelled, dead = post(client), post(client)
    assert client.delete(f"/api/v1/jobs/{cancelled['id']}", headers=OPS).status_code == 200
    make_dead(store, dispatcher, dead["id"])
    assert client.post(f"/api/v1/jobs/{dead['id']}/retry", headers=OPS).status_code == 200
    page = client.get("/api/v1/audit", headers=OPS).get_json()
    assert [(r["actor"], r["action"], r["target"]) for r in page["records"]] == [
        ("ops", "job.retry", dead["id"]), ("ops", "job.cancel", cancelled["id"])]
    assert page["records"][0]["detail"] == {"queue": "default", "type": "echo",
                                            "credential": "token"}
    assert page["next_cursor"] is None
    # A refused action records nothing.
    assert client.delete(f"/api/v1/jobs/{dead['id']}", headers=WRITER).status_code == 403
    assert len(client.get("/api/v1/audit", headers=OPS).get_json()["records"]) == 2


def test_job_events_name_who_asked(audited: Flask, store: Store, dispatcher: Dispatcher) -> None:
    client = audited.test_client()
    single, cancelled, dead = post(client), post(client), post(client)
    batch = client.post("/api/v1/jobs/batch", json={"jobs": [{"type": "echo"}] * 2},
                        headers=WRITER)
    assert batch.status_code == 201
    assert client.delete(f"/api/v1/jobs/{cancelled['id']}", headers=OPS).status_code == 200
    make_dead(store, dispatcher, dead["id"])
    assert client.post(f"/api/v1/jobs/{dead['id']}/retry", headers=OPS).status_code == 200

    def actors(job_id: str) -> list[tuple[str, str | None]]:
        events = client.get(f"/api/v1/jobs/{job_id}", headers=OPS).get_json()["events"]
        return [(e["event"], e["actor"]) for e in events]

    assert actors(single["id"]) == [("enqueued", "ingest")]
    for item in batch.get_json()["jobs"]:
        assert actors(item["job"]["id"]) == [("enqueued", "ingest")]
    assert actors(cancelled["id"]) == [("enqueued", "ingest"), ("cancelled", "ops")]
    # The engine's own moves name no actor; the requeue names the operator.
    assert actors(dead["id"]) == [("enqueued", "ingest"), ("claimed", None),
                                  ("dead_lettered", None), ("requeued", "ops")]


def test_the_audit_needs_operate(audited: Flask) -> None:
    r = audited.test_client().get("/api/v1/audit", headers=WRITER)
    assert r.status_code == 403 and r.get_json()["error"]["details"]["scope"] == "jobs:operate"


def test_audit_pages_and_filters(client: FlaskClient, store: Store) -> None:
    for i in range(5):
        store.insert_audit(actor="a" if i % 2 else "b", action=f"test.{i % 2}", target=str(i))
    seen, cursor = [], None
    while True:
        query = "/api/v1/audit?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(query).get_json()
        seen += [r["target"] for r in page["records"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["4", "3", "2", "1", "0"]
    by_actor = client.get("/api/v1/audit?actor=a").get_json()["records"]
    assert [r["target"] for r in by_actor] == ["3", "1"]
    by_action = client.get("/api/v1/audit?action=test.0&actor=b").get_json()["records"]
    assert [r["target"] for r in by_action] == ["4", "2", "0"]


@pytest.mark.parametrize("query", ["cursor=nope", "limit=0", "limit=x", "action=UPPER",
                                   "actor=a%00b", "action=" + "a" * 101])
def test_bad_audit_parameters_are_400(client: FlaskClient, query: str) -> None:
    r = client.get(f"/api/v1/audit?{query}")
    assert r.status_code == 400, r.get_json()
    assert r.get_json()["error"]["code"] == "invalid_parameter"


def test_records_cannot_be_updated(store: Store) -> None:
    store.insert_audit(actor="a", action="test", target=None)
    with pytest.raises(sqlalchemy.exc.DBAPIError, match="append-only"), \
            store.transaction() as conn:
        conn.exec_driver_sql("UPDATE taskline.audit_log SET actor = 'someone else'")


def backdate(store: Store, count: int, age_s: float) -> None:
    with store.transaction() as conn:
        conn.execute(sqlalchemy.text(
            "INSERT INTO taskline.audit_log (at, actor, action) SELECT now() - "
            "make_interval(secs => :age),"
            " 'old', 'test' FROM generate_series(1, :n)"), {"age": age_s, "n": count})


def count_audit(store: Store) -> int:
    with store.transaction() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM taskline.audit_log").scalar_one()


def test_retention_deletes_expired_records_in_batches(store: Store, settings: Settings) -> None:
    backdate(store, 25, age_s=7200)
    backdate(store, 3, age_s=10)
    retention = AuditRetention(store, settings.replace(retain_audit_s=3600), batch=10,
                               max_batches=2)
    assert retention.run_once().deleted == 20  # bounded: the rest goes in the next pass
    assert retention.run_once().deleted == 5
    assert retention.run_once().deleted == 0
    assert count_audit(store) == 3


def test_a_retention_of_zero_keeps_everything(store: Store, settings: Settings) -> None:
    backdate(store, 5, age_s=10 ** 8)
    assert AuditRetention(store, settings.replace(retain_audit_s=0)).run_once().deleted == 0
    assert count_audit(store) == 5


def test_the_active_maintenance_instance_runs_audit_retention(
        store: Store, dispatcher: Dispatcher, settings: Settings) -> None:
    from taskline_maintenance.main import Maintenance

    backdate(store, 4, age_s=7200)
    service = Maintenance(store, dispatcher, settings.replace(retain_audit_s=3600))
    service.start()
    try:
        wait_for(lambda: count_audit(store) == 0)
    finally:
        service.stop()


def test_the_migration_runs_beside_data_written_by_the_previous_version() -> None:
    """0002's writes (events without actor) survive the upgrade; it downgrades cleanly too."""
    import uuid

    from alembic import command
    from psycopg import sql

    from taskline.store.migrate import alembic_config
    from tests.conftest import _admin, db_url

    name = f"taskline_m_{uuid.uuid4().hex[:12]}"
    _admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    engine = sqlalchemy.create_engine(db_url(name).replace("postgresql://",
                                                           "postgresql+psycopg://"))
    try:
        config = alembic_config(db_url(name))
        command.upgrade(config, "0002")
        job_id = uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(
                "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, "
                "max_retries,"
                " timeout_s) VALUES (:id, 'echo', 'default', '{}', 5, 'queued', 3, 30)"),
                {"id": job_id})
            conn.execute(sqlalchemy.text("INSERT INTO taskline.job_events (job_id, attempt, event)"
                                         " VALUES (:id, 0, 'enqueued')"), {"id": job_id})
        command.upgrade(config, "head")
        with engine.begin() as conn:
            assert conn.execute(sqlalchemy.text("SELECT actor FROM taskline.job_events")).all() == [
                (None,)]
            conn.execute(sqlalchemy.text("INSERT INTO taskline.job_events (job_id, attempt, event)"
                                         " VALUES (:id, 0, 'cancelled')"), {"id": job_id})
        command.downgrade(config, "0002")
        with engine.begin() as conn:
            events = sqlalchemy.text("SELECT count(*) FROM taskline.job_events")
            assert conn.execute(events).scalar() == 2
    finally:
        engine.dispose()
        _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
