"""The scheduler against real PostgreSQL and Redis: one job per slot whoever fires it, through
the normal enqueue path (committed, then pushed), catch_up latest and none, paused and replaced
schedules, and `@periodic` declarations upserted on the first pass."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.handlers import registry
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.scheduler import Scheduler
from tests.helpers import wait_for

KEYS = QueueKeys("sched")
# Daily, so no new slot falls due while a test runs (a five-minute cron made one in about one run
# in a hundred); only a run across midnight UTC can see a slot appear mid-test.
DAILY = "0 0 * * *"
JOB = {"type": "echo", "payload": {"n": 1}, "queue": "sched", "priority": 6,
       "max_retries": 2, "timeout_s": 30.0}


def define(store: Store, name: str = "s1", cron: str = DAILY, *,
           catch_up: str = "latest", paused: bool = False, backdate: str | None = None) -> None:
    store.upsert_schedule(name=name, cron=cron, timezone="UTC", job=JOB, paused=paused,
                          catch_up=catch_up)
    if backdate:
        sql(store, f"UPDATE taskline.schedules SET since = since - interval '{backdate}' "
                   "WHERE name = :n", n=name)


def sql(store: Store, statement: str, **params: object) -> list:
    with store.transaction() as conn:
        result = conn.execute(text(statement), params)
        return result.all() if result.returns_rows else []


def slot_jobs(store: Store, name: str = "s1") -> list:
    return sql(store, "SELECT id, schedule, scheduled_for, status, type, queue, priority, "
                      "payload, max_retries FROM taskline.jobs WHERE schedule = :n ORDER BY "
                      "scheduled_for",
               n=name)


def ready_ids(dispatcher: Dispatcher) -> list[str]:
    return [i for key in KEYS.ready_by_urgency for i in dispatcher.list_range(key, 0, -1)]


def test_a_missed_slot_fires_once_with_its_record_and_is_pushed_after_the_commit(
        store, dispatcher, settings):
    define(store, backdate="12 days")
    scheduler = Scheduler(store, dispatcher, settings)
    first = scheduler.run_once()
    assert (first.fired, first.conflicts) == (1, 0) and first.skipped >= 11
    (job,) = slot_jobs(store)
    now = store.now()
    newest = now.replace(hour=0, minute=0, second=0, microsecond=0)
    assert job.scheduled_for == newest and job.status == "queued"
    assert (job.type, job.queue, job.priority, job.payload, job.max_retries) == (
        "echo", "sched", 6, {"n": 1}, 2)
    assert ready_ids(dispatcher) == [str(job.id)]
    (slot,) = sql(store, "SELECT schedule, slot, job_id FROM taskline.schedule_slots")
    assert (slot.schedule, slot.slot, slot.job_id) == ("s1", newest, job.id)
    (row,) = sql(store, "SELECT last_slot, last_job_id FROM taskline.schedules")
    assert (row.last_slot, row.last_job_id) == (newest, job.id)
    events = sql(store, "SELECT event, detail FROM taskline.job_events WHERE job_id = :j", j=job.id)
    assert [e.event for e in events] == ["enqueued"]
    assert events[0].detail["schedule"] == "s1"
    assert scheduler.run_once().fired == 0


def test_a_second_instance_or_a_restart_never_fires_a_slot_again(store, dispatcher, settings):
    define(store, backdate="12 days")
    assert Scheduler(store, dispatcher, settings).run_once().fired == 1
    # Another replica (or this one restarted) knows nothing of the first one's pass but what
    # PostgreSQL holds: the schedule's last slot.
    other = Scheduler(store, dispatcher, settings).run_once()
    assert (other.fired, other.conflicts) == (0, 0)
    # Even with the job deleted (retention) and the schedule's last slot lost, the slot's
    # record alone keeps it from firing again.
    sql(store, "DELETE FROM taskline.jobs")
    sql(store, "UPDATE taskline.schedules SET last_slot = NULL, last_job_id = NULL")
    again = Scheduler(store, dispatcher, settings).run_once()
    assert (again.fired, again.conflicts) == (0, 1)
    assert slot_jobs(store) == [] and len(sql(store, "SELECT * FROM taskline.schedule_slots")) == 1


def test_two_schedulers_racing_on_every_slot_make_one_job_per_slot(store, dispatcher,
                                                                   settings):
    define(store, cron="* * * * * *")  # every second
    a, b = Scheduler(store, dispatcher, settings), Scheduler(store, dispatcher, settings)
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,)) for s in (a, b)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(slot_jobs(store)) >= 4, timeout=20, message="four slots")
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    jobs = slot_jobs(store)
    slots = [j.scheduled_for for j in jobs]
    assert len(slots) == len(set(slots)), "a slot got two jobs"
    # Every second after the first fired slot fired: no slot was lost between the two.
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]


def test_slots_before_creation_never_fire(store, dispatcher, settings):
    define(store, cron="0 0 1 1 *")  # the last one is long past, but before creation
    assert Scheduler(store, dispatcher, settings).run_once().fired == 0
    assert slot_jobs(store) == []


def test_catch_up_none_skips_a_long_missed_slot_latest_fires_it(store, dispatcher, settings):
    define(store, "skip", cron="0 0 1 1 *", catch_up="none", backdate="800 days")
    define(store, "late", cron="0 0 1 1 *", catch_up="latest", backdate="800 days")
    result = Scheduler(store, dispatcher, settings).run_once()
    assert result.fired == 1
    assert slot_jobs(store, "skip") == [] and len(slot_jobs(store, "late")) == 1


def test_paused_deleted_and_replaced_schedules(store, dispatcher, settings):
    define(store, "p", paused=True, backdate="12 days")
    scheduler = Scheduler(store, dispatcher, settings)
    assert scheduler.run_once().fired == 0
    # Resuming moves `since`: slots missed while paused never fire.
    define(store, "p", paused=False)
    assert scheduler.run_once().fired == 0
    # Replacing only the job body keeps `since` (a declaration upserted at each start).
    sql(store, "UPDATE taskline.schedules SET since = since - interval '12 days'")
    store.upsert_schedule(name="p", cron=DAILY, timezone="UTC",
                          job={**JOB, "payload": {"n": 2}}, paused=False, catch_up="latest")
    assert scheduler.run_once().fired == 1
    assert slot_jobs(store, "p")[0].payload == {"n": 2}
    assert store.delete_schedule("p") and not store.delete_schedule("p")
    assert len(slot_jobs(store, "p")) == 1  # its job stays


@pytest.fixture
def declared_schedule():
    registry.periodic("code.nightly", cron="0 3 * * *", job={"type": "echo"})(lambda p, c: p)
    yield registry.periodic_declarations()
    registry._periodic.pop("code.nightly", None)


def test_periodic_declarations_are_upserted_on_the_first_pass(store, dispatcher,
                                                              settings: Settings,
                                                              declared_schedule):
    scheduler = Scheduler(store, dispatcher, settings, declarations=declared_schedule)
    scheduler.run_once()
    row = store.get_schedule("code.nightly")
    assert row is not None and row.cron == "0 3 * * *" and row.job["queue"] == "default"
    assert row.job["max_retries"] == settings.default_max_retries


def test_a_schedule_postgresql_refuses_costs_only_its_own_slot(store, dispatcher, settings):
    define(store, "broken", backdate="12 days")
    define(store, "fine", backdate="12 days")
    # Written past the API's validation: a priority the jobs table refuses.
    sql(store, "UPDATE taskline.schedules SET job = jsonb_set(job, '{priority}', '99') "
               "WHERE name = 'broken'")
    result = Scheduler(store, dispatcher, settings).run_once()
    assert result.fired == 1
    assert slot_jobs(store, "broken") == [] and len(slot_jobs(store, "fine")) == 1
    # The refused statement left no slot record behind: the slot fires once it is repaired.
    slots = sql(store, "SELECT schedule FROM taskline.schedule_slots")
    assert [r.schedule for r in slots] == ["fine"]


def test_a_pass_that_falls_behind_fires_every_slot_it_passed(store, dispatcher, settings):
    define(store, cron="* * * * * *")  # every second
    scheduler = Scheduler(store, dispatcher, settings)
    scheduler.run_once()
    time.sleep(3.5)  # a slow pass, or a database that answered late: slots went by unjudged
    late = scheduler.run_once()
    assert late.fired >= 3 and late.skipped == 0
    slots = [j.scheduled_for for j in slot_jobs(store)]
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]


def test_slots_passed_while_not_leading_follow_catch_up(store, dispatcher, settings):
    define(store, "skip", cron="* * * * * *", catch_up="none")
    define(store, "late", cron="* * * * * *", catch_up="latest")
    scheduler = Scheduler(store, dispatcher, settings)
    scheduler.run_once()
    scheduler.idle()  # leadership lost; whatever passes now passes while no instance leads
    sql(store, "UPDATE taskline.schedules SET last_slot = last_slot - interval '2 minutes', "
               "since = since - interval '2 minutes'")
    before = {name: len(slot_jobs(store, name)) for name in ("skip", "late")}
    result = scheduler.run_once()  # leads again: the slots of the last two minutes were missed
    assert len(slot_jobs(store, "late")) - before["late"] <= 2  # the newest missed (+ now's)
    assert len(slot_jobs(store, "skip")) - before["skip"] <= 2  # recent enough under none
    assert result.skipped >= 2 * 100
