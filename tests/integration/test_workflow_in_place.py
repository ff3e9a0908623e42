"""A released workflow step starting on the worker whose completion released it: claimed by
the same transaction (`Store.settle_continuing`) only when it overtakes nobody (no job already
queued in its queue as urgent or more, none in a queue the worker serves before it), only
through the one claim rule (paused and limited steps stay queued, to be pushed), and at most
one per slot the finished steps free; and a worker running a chain this way, each step on the
handler thread its parent ended on."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from taskline import flow, transitions
from taskline.handlers.registry import JobContext, handler
from taskline.jobs import Status
from taskline.metrics import STEPS_STARTED_IN_PLACE
from taskline.store.rows import Settlement
from taskline.store.store import Store
from taskline.workflows import StepJob, StepSpec, insert_workflow
from tests.helpers import enqueue, wait_for
from tests.integration.worker_handlers import running_worker

pytestmark = pytest.mark.usefixtures("clean_handlers")

WORKER = "w-in-place"


@handler("wf.place")
def place_handler(payload: Any, ctx: JobContext) -> dict:
    return {"step": ctx.step, "worker": ctx.worker_id,
            "thread": threading.current_thread().name}


def _submit(store: Store, steps: list[StepSpec]) -> dict[str, uuid.UUID]:
    with store.transaction() as conn:
        return {k: j.id for k, j in insert_workflow(conn, "in-place", steps).jobs.items()}


def _job(queue: str = "default", priority: int = 5, job_type: str = "wf.place") -> StepJob:
    return StepJob(job_type, queue=queue, priority=priority)


def _fan_out(store: Store, children: dict[str, StepJob]) -> dict[str, uuid.UUID]:
    return _submit(store, [StepSpec("root", _job()),
                           *(StepSpec(k, job, ("root",)) for k, job in children.items())])


def _finish_root(store: Store, jobs: dict[str, uuid.UUID], *, queues=("default",), most=1):
    (claimed,) = store.claim_jobs([jobs["root"]], WORKER, 30.0)
    settlement = Settlement(claimed.lease_id, WORKER, transitions.succeeded({"ok": 1}),
                            releases=True)
    return store.settle_continuing([settlement], worker_id=WORKER, lease_s=30.0,
                                   queues=list(queues), most=most)


def _events(store: Store, job_id: uuid.UUID) -> list[str]:
    return [e["event"] for e in store.get_history(job_id)[0]]


def test_the_released_step_is_claimed_by_the_completing_transaction(store: Store):
    jobs = _fan_out(store, {"next": _job()})
    settled, claimed = _finish_root(store, jobs)
    assert [c.job.id for c in claimed] == [jobs["next"]]
    assert claimed[0].job.status == Status.RUNNING and claimed[0].job.attempts == 1
    assert store.get_job(jobs["root"]).status is Status.SUCCEEDED
    assert _events(store, jobs["next"]) == ["waiting", "unblocked", "claimed"]
    with store.transaction() as conn:
        owner = conn.execute(text("SELECT worker_id FROM taskline.live_leases WHERE id = :id"),
                             {"id": claimed[0].lease_id}).scalar_one()
        xids = conn.execute(text(
            "SELECT DISTINCT xmin::text FROM taskline.job_events WHERE (job_id = :root AND event = "
            "'succeeded') OR (job_id = :next AND event IN ('unblocked', 'claimed'))"),
            {"root": jobs["root"], "next": jobs["next"]}).scalars().all()
    assert owner == WORKER
    assert len(xids) == 1, "success, release and claim commit together"
    assert [r.id for row in settled for r in row.released] == [], "started: not to be pushed"


def test_a_job_queued_as_urgent_in_the_queue_keeps_its_turn(store: Store, dispatcher):
    waiting_turn = enqueue(store, dispatcher, "wf.place", push=False, priority=5)
    jobs = _fan_out(store, {"next": _job(priority=5)})
    settled, claimed = _finish_root(store, jobs)
    assert claimed == []
    assert store.get_job(jobs["next"]).status is Status.QUEUED  # pushed by the caller
    assert [r.id for row in settled for r in row.released] == [jobs["next"]]
    assert store.get_job(waiting_turn.id).status is Status.QUEUED


def test_a_more_urgent_step_goes_ahead_of_less_urgent_queued_work(store: Store, dispatcher):
    enqueue(store, dispatcher, "wf.place", push=False, priority=2)
    jobs = _fan_out(store, {"next": _job(priority=5)})
    _settled, claimed = _finish_root(store, jobs)
    assert [c.job.id for c in claimed] == [jobs["next"]]


def test_work_queued_in_a_queue_served_earlier_comes_first(store: Store, dispatcher):
    enqueue(store, dispatcher, "wf.place", queue="first", push=False, priority=1)
    enqueue(store, dispatcher, "wf.place", queue="last", push=False, priority=9)
    jobs = _fan_out(store, {"next": _job(queue="middle")})
    _settled, claimed = _finish_root(store, jobs, queues=("first", "middle", "last"))
    assert claimed == []
    jobs = _fan_out(store, {"next": _job(queue="front")})
    _settled, claimed = _finish_root(store, jobs, queues=("front", "first", "last"))
    assert [c.job.id for c in claimed] == [jobs["next"]]


def test_a_step_of_a_queue_the_worker_does_not_serve_is_left_to_push(store: Store):
    jobs = _fan_out(store, {"next": _job(queue="elsewhere")})
    _settled, claimed = _finish_root(store, jobs, queues=("default",))
    assert claimed == []
    assert store.get_job(jobs["next"]).status is Status.QUEUED


def test_paused_and_limited_steps_go_through_the_claim_rule(store: Store):
    store.pause_queue("held", None)
    store.put_flow_limit(flow.Limit("type:wf.limited", concurrency=5))
    jobs = _fan_out(store, {"paused": _job(queue="held"),
                            "limited": _job(job_type="wf.limited")})
    _settled, claimed = _finish_root(store, jobs, queues=("default", "held"), most=2)
    assert claimed == []
    assert {store.get_job(jobs[k]).status for k in ("paused", "limited")} == {Status.QUEUED}
    assert _events(store, jobs["paused"]) == ["waiting", "unblocked"]


def test_one_step_per_slot_freed_the_most_urgent_first(store: Store):
    jobs = _fan_out(store, {f"c{p}": _job(priority=p) for p in (3, 8, 5)})
    settled, claimed = _finish_root(store, jobs, most=1)
    assert [c.job.id for c in claimed] == [jobs["c8"]]
    assert {store.get_job(jobs[k]).status for k in ("c3", "c5")} == {Status.QUEUED}
    assert {r.id for row in settled for r in row.released} == {jobs["c3"], jobs["c5"]}


def test_the_most_urgent_start_first_and_equals_in_id_order(store: Store):
    jobs = _fan_out(store, {"low": _job(priority=1), "a": _job(priority=9),
                            "b": _job(priority=9), "other": _job(queue="x", priority=9)})
    settled, claimed = _finish_root(store, jobs, most=2)
    assert [c.job.id for c in claimed] == sorted([jobs["a"], jobs["b"]])
    assert {r.id for row in settled for r in row.released} == {jobs["low"], jobs["other"]}
    for c in claimed:
        assert c.job.type == "wf.place" and c.job.workflow_id is not None
        assert c.leased_until is not None and c.job.status is Status.RUNNING


def test_none_starts_when_the_worker_takes_none(store: Store):
    jobs = _fan_out(store, {"next": _job()})
    settled, claimed = _finish_root(store, jobs, most=0)
    assert claimed == []
    assert [r.id for row in settled for r in row.released] == [jobs["next"]]
    assert _events(store, jobs["next"]) == ["waiting", "unblocked"]


def test_a_worker_runs_a_chain_each_step_started_where_its_parent_ended(store: Store, settings,
                                                                      dispatcher):
    before = STEPS_STARTED_IN_PLACE._value.get()
    steps = [StepSpec("s0", _job())] + [StepSpec(f"s{i}", _job(), (f"s{i - 1}",))
                                        for i in range(1, 20)]
    jobs = _submit(store, steps)
    with running_worker(settings, concurrency=2) as worker:
        dispatcher.push([("default", 5, str(jobs["s0"]))])
        wait_for(lambda: store.get_job(jobs["s19"]).status is Status.SUCCEEDED, timeout=30,
                 message="chain done")
        wait_for(lambda: worker.attempts.busy == 0 and len(worker.attempts) == 0, timeout=5,
                 message="every slot given back")
    assert STEPS_STARTED_IN_PLACE._value.get() - before == 19
    with store.transaction() as conn:
        starts = conn.execute(text(
            "SELECT j.step, l.leased_at FROM taskline.job_leases l JOIN taskline.jobs j ON "
            "j.id = l.job_id "
            "WHERE j.id = ANY(:ids) ORDER BY l.leased_at"), {"ids": list(jobs.values())}).all()
    assert [s for s, _ in starts] == [f"s{i}" for i in range(20)]
    threads = {store.get_job(job_id).result["thread"] for job_id in jobs.values()}
    assert len(threads) == 1, f"each step ran on its parent's handler thread: {threads}"
