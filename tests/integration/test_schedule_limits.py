"""Bounds on schedules: TASKLINE_MAX_SCHEDULES refuses one schedule more (a replacement at the
limit is accepted), TASKLINE_MIN_SCHEDULE_PERIOD_S refuses an expression firing more often
(through the API and `@periodic`), and the jobs of a schedule written through the API count
against the enqueue quota of the principal that wrote it, while a `@periodic` one's do not."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text

from taskline.schedules import InvalidSchedule, declared
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.scheduler import Scheduler
from taskline_producer.app import close_app, create_app

JOB = {"type": "echo", "queue": "sched"}
AUTH = {"Authorization": "Bearer o-secret"}


@pytest.fixture
def make_client(settings: Settings) -> Iterator:
    apps = []

    def make(**changes: object) -> FlaskClient:
        apps.append(create_app(settings.replace(**changes)))
        return apps[-1].test_client()
    yield make
    for app in apps:
        close_app(app)


def put(client: FlaskClient, name: str, cron: str = "*/5 * * * *", **headers: str):
    return client.put(f"/api/v1/schedules/{name}", json={"cron": cron, "job": JOB},
                      headers=headers)


def test_one_schedule_more_than_the_limit_is_a_422_and_a_replacement_is_not(make_client):
    client = make_client(max_schedules=2)
    assert put(client, "a").status_code == 201 and put(client, "b").status_code == 201
    refused = put(client, "c")
    assert refused.status_code == 422
    assert refused.get_json()["error"] == {
        "code": "schedule_limit", "details": {"limit": 2},
        "message": refused.get_json()["error"]["message"]}
    assert client.get("/api/v1/schedules/c").status_code == 404
    assert put(client, "a", "*/10 * * * *").status_code == 200


def test_a_cron_firing_more_often_than_the_minimum_period_is_refused(make_client, settings):
    client = make_client(min_schedule_period_s=60)
    refused = put(client, "fast", "* * * * * */30")  # every 30 seconds
    assert refused.status_code == 422
    (error,) = refused.get_json()["error"]["details"]
    assert error["field"] == "cron" and "30 s apart" in error["message"]
    assert put(client, "minutely", "* * * * *").status_code == 201
    strict = settings.replace(min_schedule_period_s=60)
    spec = {"cron": "* * * * * *", "timezone": "UTC", "catch_up": "latest", "paused": False,
            "job": {"type": "echo"}}
    with pytest.raises(InvalidSchedule, match="1 s apart"):
        declared("tick", spec, strict)


def test_a_schedule_s_jobs_count_against_its_writer_s_quota(make_client, store: Store,
                                                          dispatcher, settings):
    limited = settings.replace(api_tokens=("ops:o-secret",), enqueue_quotas=("ops=3/h",))
    client = make_client(api_tokens=limited.api_tokens, enqueue_quotas=limited.enqueue_quotas)
    assert put(client, "owned", "* * * * * *", **AUTH).status_code == 201
    shown = client.get("/api/v1/schedules/owned", headers=AUTH).get_json()
    assert set(shown["job"]) == {"type", "queue", "payload", "priority", "max_retries",
                                 "timeout_s"}  # who wrote it is never shown
    periodic = {"cron": "* * * * * *", "timezone": "UTC", "catch_up": "latest",
                "paused": False, "job": {"type": "echo", "queue": "sched"}}
    store.upsert_schedule(name="declared", **declared("declared", periodic, limited))
    with store.transaction() as conn:  # both have owed slots for the last minute
        conn.execute(text("UPDATE taskline.schedules SET since = now() - interval '1 minute'"))
    scheduler = Scheduler(store, dispatcher, limited)
    scheduler.run_once()  # leads from now: the slots of the last minute were missed
    time.sleep(5.5)
    scheduler.run_once()
    with store.transaction() as conn:
        made = dict(conn.execute(text(
            "SELECT schedule, count(*) FROM taskline.jobs GROUP BY schedule")).all())
    assert made["owned"] == 3  # the quota: 3 an hour, then every slot is passed over
    assert made["declared"] >= 5  # no quota: every slot fired
