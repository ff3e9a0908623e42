"""A schedule whose job has `unique`: a slot whose key a job still holds in scope fires no job
(the slot is recorded as folded into that job), decided under the key's lock like every unique
enqueue; once the job finished, the next slot fires again. `debounce` is refused in a
schedule's job."""

from __future__ import annotations

import time

from flask.testing import FlaskClient
from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.schedules import schedule_job
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.scheduler import Scheduler


def _sql(store: Store, statement: str, **params: object) -> list:
    with store.transaction() as conn:
        result = conn.execute(text(statement), params)
        return result.all() if result.returns_rows else []


def test_a_slot_whose_key_is_held_fires_no_job(store: Store, dispatcher: Dispatcher,
                                               settings: Settings) -> None:
    job, errors = schedule_job({"type": "echo", "payload": {"n": 1},
                                "unique": {"key": "nightly"}}, settings)
    assert errors == [] and job is not None and job["unique"]["key"] == "nightly"
    store.upsert_schedule(name="tick", cron="* * * * * *", timezone="UTC", job=job,
                          paused=False, catch_up="latest")
    scheduler = Scheduler(store, dispatcher, settings)
    deadline = time.monotonic() + 10
    while len(_sql(store, "SELECT 1 FROM taskline.schedule_slots")) < 3:
        assert time.monotonic() < deadline, "slots did not fire"
        scheduler.run_once()
        time.sleep(0.2)
    jobs = _sql(store, "SELECT id, unique_key FROM taskline.jobs")
    slots = _sql(store, "SELECT slot, job_id FROM taskline.schedule_slots ORDER BY slot")
    assert len(jobs) == 1 and jobs[0].unique_key == "nightly"
    assert {s.job_id for s in slots} == {jobs[0].id}  # every later slot folded into it
    (schedule,) = _sql(store, "SELECT last_slot, last_job_id FROM taskline.schedules")
    assert (schedule.last_slot, schedule.last_job_id) == (slots[-1].slot, jobs[0].id)
    _sql(store, "UPDATE taskline.jobs SET status = 'succeeded', finished_at = now()")
    before = len(slots)
    while len(_sql(store, "SELECT 1 FROM taskline.schedule_slots")) <= before:
        assert time.monotonic() < deadline + 5, "no slot after the job finished"
        scheduler.run_once()
        time.sleep(0.2)
    assert len(_sql(store, "SELECT 1 FROM taskline.jobs")) == 2


def test_put_schedule_keeps_unique_and_refuses_debounce(client: FlaskClient) -> None:
    made = client.put("/api/v1/schedules/nightly", json={
        "cron": "0 3 * * *", "job": {"type": "echo", "unique": {"key": "n", "period_s": 3600}}})
    assert made.status_code == 201, made.json
    assert made.json["job"]["unique"] == {"key": "n", "period_s": 3600.0,
                                          "states": ["scheduled", "queued", "running",
                                                     "retrying", "waiting"],
                                          "on_conflict": "return"}
    refused = client.put("/api/v1/schedules/other", json={
        "cron": "0 3 * * *", "job": {"type": "echo", "debounce": {"key": "d", "delay_s": 5}}})
    assert refused.status_code == 422
    assert [d["field"] for d in refused.json["error"]["details"]] == ["job.debounce"]


def test_a_schedule_takes_no_replace(client: FlaskClient) -> None:
    refused = client.put("/api/v1/schedules/r", json={
        "cron": "0 3 * * *", "job": {"type": "echo", "unique": {"on_conflict": "replace"}}})
    assert refused.status_code == 422
    assert [d["field"] for d in refused.json["error"]["details"]] == ["job.unique.on_conflict"]
