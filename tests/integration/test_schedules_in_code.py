"""A `@periodic` removed from the code: maintenance's first pass marks which schedules the code
declares (`declared_in_code`, shown by GET /api/v1/schedules), logs each one it no longer does,
and with TASKLINE_PRUNE_SCHEDULES=true deletes those; schedules made through the API are never
the code's."""

from __future__ import annotations

import logging
from typing import Any

from taskline.settings import Settings
from taskline_maintenance.scheduler import Scheduler
from taskline_producer.app import close_app, create_app

JOB = {"type": "echo"}


def spec(cron: str = "0 3 * * *") -> dict[str, Any]:
    return {"cron": cron, "job": dict(JOB), "timezone": "UTC", "catch_up": "latest",
            "paused": False}


def start(store, dispatcher, settings: Settings, *names: str) -> None:
    """One maintenance start whose code declares `names`."""
    Scheduler(store, dispatcher, settings, declarations=[(n, spec()) for n in names]).run_once()


def listed(settings: Settings) -> dict[str, Any]:
    app = create_app(settings)
    try:
        answer = app.test_client().get("/api/v1/schedules")
        return {s["name"]: s["declared_in_code"] for s in answer.json["schedules"]}
    finally:
        close_app(app)


def test_a_declaration_removed_from_the_code_is_reported_and_kept(store, dispatcher, settings,
                                                                  caplog):
    store.upsert_schedule(name="by-api", cron="0 4 * * *", timezone="UTC", job=dict(JOB),
                          paused=False, catch_up="latest")
    start(store, dispatcher, settings, "nightly", "weekly")
    assert listed(settings) == {"by-api": None, "nightly": True, "weekly": True}
    with caplog.at_level(logging.WARNING, logger="taskline_maintenance.scheduler"):
        start(store, dispatcher, settings, "nightly")
    assert listed(settings) == {"by-api": None, "nightly": True, "weekly": False}
    undeclared = [r for r in caplog.records if getattr(r, "action", "") == "schedule_undeclared"]
    assert [r.schedule for r in undeclared] == ["weekly"]
    start(store, dispatcher, settings, "nightly", "weekly")  # declared again
    assert listed(settings)["weekly"] is True


def test_prune_deletes_only_what_the_code_declared_and_no_longer_does(store, dispatcher,
                                                                      settings):
    store.upsert_schedule(name="by-api", cron="0 4 * * *", timezone="UTC", job=dict(JOB),
                          paused=False, catch_up="latest")
    start(store, dispatcher, settings, "nightly", "weekly")
    # Replaced through the API: no longer the code's, so never pruned.
    store.upsert_schedule(name="nightly", cron="0 5 * * *", timezone="UTC", job=dict(JOB),
                          paused=False, catch_up="latest")
    start(store, dispatcher, settings.replace(prune_schedules=True))
    assert listed(settings) == {"by-api": None, "nightly": None}


def test_the_prune_setting_is_read_from_the_environment():
    assert Settings.from_env(env={"TASKLINE_PRUNE_SCHEDULES": "true"}).prune_schedules
    assert not Settings.from_env(env={}).prune_schedules
