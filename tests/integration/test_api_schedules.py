"""The schedule routes: create (201) or replace (200), read with next_runs, list by cursor,
remove; bad input is a 422 (404 for a name that cannot exist) with the error shape and
changes nothing; every change is audited."""

from __future__ import annotations

from datetime import datetime

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text

from taskline.store.store import Store

BODY = {"cron": "*/5 * * * *", "timezone": "Europe/Berlin",
        "job": {"type": "report", "payload": {"x": 1}, "queue": "reports", "priority": "high"}}


def count(store: Store, table: str) -> int:
    with store.transaction() as conn:
        return conn.execute(text(f"SELECT count(*) FROM taskline.{table}")).scalar_one()


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "details"} and error["code"] == code
    return error


def test_put_creates_then_replaces_and_get_shows_next_runs(client: FlaskClient, store: Store):
    created = client.put("/api/v1/schedules/nightly.eu", json=BODY)
    assert created.status_code == 201
    assert created.headers["Location"] == "/api/v1/schedules/nightly.eu"
    body = created.get_json()
    assert body["job"] == {"type": "report", "payload": {"x": 1}, "queue": "reports",
                           "priority": 7, "max_retries": 3, "timeout_s": 300.0}
    assert (body["paused"], body["catch_up"], body["last_slot"], body["last_job_id"]) == (
        False, "latest", None, None)
    runs = [datetime.fromisoformat(r) for r in body["next_runs"]]
    assert len(runs) == 5 and runs == sorted(runs) and all(r.minute % 5 == 0 for r in runs)
    assert runs[0] > store.now()
    replaced = client.put("/api/v1/schedules/nightly.eu",
                          json={**BODY, "paused": True, "catch_up": "none"})
    assert replaced.status_code == 200
    assert replaced.get_json()["paused"] is True and replaced.get_json()["next_runs"] == []
    got = client.get("/api/v1/schedules/nightly.eu").get_json()
    assert got["catch_up"] == "none" and got["timezone"] == "Europe/Berlin"
    with store.transaction() as conn:
        actions = conn.execute(text(
            "SELECT action, target FROM taskline.audit_log ORDER BY at")).all()
    assert [tuple(a) for a in actions] == [("schedule.create", "nightly.eu"),
                                           ("schedule.replace", "nightly.eu")]


def test_list_pages_by_name_and_delete_removes(client: FlaskClient, store: Store):
    for name in ("c", "a", "b"):
        assert client.put(f"/api/v1/schedules/{name}", json=BODY).status_code == 201
    first = client.get("/api/v1/schedules?limit=2").get_json()
    assert [s["name"] for s in first["schedules"]] == ["a", "b"]
    second = client.get(f"/api/v1/schedules?limit=2&cursor={first['next_cursor']}").get_json()
    assert [s["name"] for s in second["schedules"]] == ["c"] and second["next_cursor"] is None
    deleted = client.delete("/api/v1/schedules/b")
    assert deleted.status_code == 200 and deleted.get_json() == {"name": "b", "deleted": True}
    assert_error(client.get("/api/v1/schedules/b"), 404, "not_found")
    assert_error(client.delete("/api/v1/schedules/b"), 404, "not_found")
    assert count(store, "schedules") == 2


@pytest.mark.parametrize(("body", "field"), [
    ({**BODY, "cron": "61 * * * *"}, "cron"),
    ({**BODY, "cron": "* * * *"}, "cron"),
    ({**BODY, "cron": 5}, "cron"),
    ({**BODY, "timezone": "Mars/Olympus"}, "timezone"),
    ({**BODY, "timezone": None}, "timezone"),
    ({**BODY, "job": {**BODY["job"], "delay_s": 5}}, "job.delay_s"),
    ({**BODY, "job": {**BODY["job"], "run_at": "2030-01-01T00:00:00Z"}}, "job.run_at"),
    ({**BODY, "job": {**BODY["job"], "idempotency_key": "k"}}, "job.idempotency_key"),
    ({**BODY, "job": {**BODY["job"], "queue": "bad queue"}}, "job.queue"),
    ({**BODY, "job": {"payload": {}}}, "job.type"),
    ({**BODY, "job": []}, "job"),
    ({"cron": "* * * * *"}, "job"),
    ({"job": BODY["job"]}, "cron"),
    ({**BODY, "paused": 1}, "paused"),
    ({**BODY, "catch_up": "all"}, "catch_up"),
    ({**BODY, "extra": 1}, "extra"),
])
def test_bad_bodies_are_refused_and_change_nothing(client: FlaskClient, store: Store, body,
                                                   field):
    error = assert_error(client.put("/api/v1/schedules/s", json=body), 422,
                         "validation_failed")
    assert field in [d["field"] for d in error["details"]]
    assert count(store, "schedules") == 0 and count(store, "audit_log") == 0


def test_names_outside_the_rule_are_refused(client: FlaskClient, store: Store):
    long = "x" * 201
    error = assert_error(client.put(f"/api/v1/schedules/{long}", json=BODY), 422,
                         "validation_failed")
    assert [d["field"] for d in error["details"]] == ["name"]
    assert_error(client.put("/api/v1/schedules/caf%C3%A9", json=BODY), 422,
                 "validation_failed")
    assert_error(client.get("/api/v1/schedules/caf%C3%A9"), 404, "not_found")
    assert_error(client.delete(f"/api/v1/schedules/{long}"), 404, "not_found")
    assert_error(client.get("/api/v1/schedules?cursor=%00"), 400, "invalid_parameter")
    assert count(store, "schedules") == 0


def test_a_slots_job_shows_its_schedule_and_slot(client: FlaskClient, store: Store,
                                                 dispatcher, settings):
    from taskline_maintenance.scheduler import Scheduler

    client.put("/api/v1/schedules/s", json={**BODY, "timezone": "UTC"})
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.schedules SET since = since - interval '1 hour'"))
    Scheduler(store, dispatcher, settings).run_once()
    schedule = client.get("/api/v1/schedules/s").get_json()
    job = client.get(f"/api/v1/jobs/{schedule['last_job_id']}").get_json()
    assert job["schedule"] == "s" and job["scheduled_for"] == schedule["last_slot"]
    assert datetime.fromisoformat(schedule["next_runs"][0]) > datetime.fromisoformat(
        schedule["last_slot"])
