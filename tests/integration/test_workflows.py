"""Workflows end to end against real PostgreSQL and Redis: a diamond, a fan-out of 100 into one
fan-in, a chain of 50, a failed middle step requeued, cancel while running, results passed on,
validation that inserts nothing, and a fan-in of 100 parents completing together (50 runs)
whose child is released exactly once every time."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from taskline import transitions
from taskline.errors import JobCancelled
from taskline.handlers.registry import JobContext, handler
from taskline.jobs import Status
from taskline.store.rows import Settlement
from taskline.workflows import StepJob, StepSpec, insert_workflow
from tests.helpers import wait_for
from tests.integration.worker_handlers import gate, running_worker

pytestmark = pytest.mark.usefixtures("clean_handlers")

RUNS: list[tuple[str, dict[str, Any]]] = []
"""(step, parent_results) of every handler call, in the order they started."""
_FAIL_ONCE: set[str] = set()
_lock = threading.Lock()


@handler("wf.step")
def step_handler(payload: Any, ctx: JobContext) -> dict:
    with _lock:
        RUNS.append((ctx.step or "", dict(ctx.parent_results)))
        fail = payload.get("fail_once") and payload["fail_once"] not in _FAIL_ONCE
        if fail:
            _FAIL_ONCE.add(payload["fail_once"])
    if fail:
        raise RuntimeError("first attempt fails")
    if payload.get("gate"):
        for _ in range(3000):
            if gate(payload["gate"]).wait(0.01):
                break
            if ctx.stopping:
                raise JobCancelled("stopped on request")
    return {"step": ctx.step, "value": payload.get("value", 1)}


@pytest.fixture(autouse=True)
def _clean_runs():
    RUNS.clear()
    _FAIL_ONCE.clear()
    yield
    RUNS.clear()


def _step(step_id: str, after: list[str] = (), **payload: Any) -> dict:
    return {"id": step_id, "job": {"type": "wf.step", "payload": payload, "max_retries": 0},
            "after": list(after)}


def submit(client, steps: list[dict], name: str = "wf", **headers: str) -> dict:
    response = client.post("/api/v1/workflows", json={"name": name, "steps": steps},
                           headers=headers)
    assert response.status_code in (200, 201), response.get_json()
    return response.get_json()


def workflow(client, workflow_id: str) -> dict:
    response = client.get(f"/api/v1/workflows/{workflow_id}")
    assert response.status_code == 200
    return response.get_json()


def wait_status(client, workflow_id: str, status: str, timeout: float = 30.0) -> dict:
    wait_for(lambda: workflow(client, workflow_id)["status"] == status, timeout=timeout,
             message=f"workflow {status}")
    return workflow(client, workflow_id)


def ran(step_id: str) -> list[dict]:
    return [parents for step, parents in RUNS if step == step_id]


def order() -> list[str]:
    return [step for step, _ in RUNS]


def count_rows(store, table: str) -> int:
    with store.transaction() as conn:
        return conn.execute(text(f"SELECT count(*) FROM taskline.{table}")).scalar_one()


def test_diamond_runs_each_step_once_after_its_parents_with_their_results(client, settings,
                                                                           store):
    wf = submit(client, [_step("d", ["b", "c"]), _step("b", ["a"], value=2),
                         _step("c", ["a"], value=3), _step("a")])
    assert wf["status"] == "running"
    steps = {s["id"]: s for s in wf["steps"]}
    assert {k: s["status"] for k, s in steps.items()} == {
        "a": "queued", "b": "waiting", "c": "waiting", "d": "waiting"}
    with running_worker(settings, concurrency=4):
        done = wait_status(client, wf["id"], "succeeded")
    assert sorted(order()) == ["a", "b", "c", "d"]
    assert order()[0] == "a" and order()[-1] == "d"
    assert ran("d") == [{"b": {"step": "b", "value": 2}, "c": {"step": "c", "value": 3}}]
    assert ran("a") == [{}]
    assert {s["status"] for s in done["steps"]} == {"succeeded"}
    job = client.get(f"/api/v1/jobs/{steps['d']['job_id']}").get_json()
    assert (job["workflow_id"], job["step"]) == (wf["id"], "d")
    assert [e["event"] for e in job["events"]][:3] == ["waiting", "unblocked", "claimed"]
    assert [e["event"] for e in job["events"]].count("unblocked") == 1


def test_fan_out_of_100_into_one_fan_in(client, settings):
    parts = [_step(f"p{i}", ["start"], value=i) for i in range(100)]
    wf = submit(client, [_step("start"), *parts, _step("merge", [p["id"] for p in parts])])
    with running_worker(settings, concurrency=8):
        wait_status(client, wf["id"], "succeeded", timeout=60)
    assert len(RUNS) == 102
    merged = ran("merge")
    assert len(merged) == 1
    assert merged[0] == {f"p{i}": {"step": f"p{i}", "value": i} for i in range(100)}
    assert order()[-1] == "merge" and order()[0] == "start"


def test_chain_of_50_runs_in_order(client, settings):
    steps = [_step("s0")] + [_step(f"s{i}", [f"s{i - 1}"]) for i in range(1, 50)]
    wf = submit(client, steps)
    with running_worker(settings, concurrency=4):
        wait_status(client, wf["id"], "succeeded", timeout=60)
    assert order() == [f"s{i}" for i in range(50)]


def test_failed_middle_step_keeps_dependents_waiting_until_requeued(client, settings):
    wf = submit(client, [_step("a"), _step("b", ["a"], fail_once="b"), _step("c", ["b"])])
    job_of = {s["id"]: s["job_id"] for s in wf["steps"]}
    with running_worker(settings, concurrency=2):
        failed = wait_status(client, wf["id"], "failed")
        statuses = {s["id"]: s["status"] for s in failed["steps"]}
        assert statuses == {"a": "succeeded", "b": "dead", "c": "waiting"}
        assert client.post(f"/api/v1/jobs/{job_of['b']}/retry").status_code == 200
        wait_status(client, wf["id"], "succeeded")
    assert order() == ["a", "b", "b", "c"]
    assert ran("c") == [{"b": {"step": "b", "value": 1}}]


def test_cancel_while_running_cancels_waiting_steps_and_stops_the_running_one(client,
                                                                             settings, store):
    wf = submit(client, [_step("a", gate="wf-a"), _step("b", ["a"]), _step("c", ["b"]),
                         _step("side")])
    with running_worker(settings, concurrency=2):
        wait_for(lambda: "a" in order(), message="a running")
        wait_for(lambda: {s["id"]: s["status"] for s in workflow(client, wf["id"])["steps"]
                          }["side"] == "succeeded", message="side done")
        response = client.delete(f"/api/v1/workflows/{wf['id']}")
        assert response.status_code == 200
        statuses = {s["id"]: s["status"] for s in response.get_json()["steps"]}
        assert statuses["b"] == statuses["c"] == "cancelled"
        done = wait_status(client, wf["id"], "cancelled")
    assert {s["id"]: s["status"] for s in done["steps"]} == {
        "a": "cancelled", "b": "cancelled", "c": "cancelled", "side": "succeeded"}
    assert "b" not in order() and "c" not in order()
    assert client.delete(f"/api/v1/workflows/{wf['id']}").status_code == 409


def test_cancel_of_a_step_cancels_its_waiting_dependents_transitively(client, store):
    wf = submit(client, [_step("a"), _step("b", ["a"]), _step("c", ["b"]), _step("x")])
    job_of = {s["id"]: s["job_id"] for s in wf["steps"]}
    assert client.delete(f"/api/v1/jobs/{job_of['a']}").status_code == 200
    statuses = {s["id"]: s["status"] for s in workflow(client, wf["id"])["steps"]}
    assert statuses == {"a": "cancelled", "b": "cancelled", "c": "cancelled", "x": "queued"}
    assert workflow(client, wf["id"])["status"] == "running"


def test_queues_count_waiting_steps(client):
    submit(client, [_step("a"), _step("b", ["a"]), _step("c", ["a"])])
    queues = {q["name"]: q for q in client.get("/api/v1/queues").get_json()["queues"]}
    assert queues["default"]["counts"]["waiting"] == 2
    assert queues["default"]["counts"]["queued"] == 1


def test_list_pages_with_a_cursor(client):
    ids = [submit(client, [_step("a")], name=f"w{i}")["id"] for i in range(3)]
    first = client.get("/api/v1/workflows?limit=2").get_json()
    assert [w["id"] for w in first["workflows"]] == ids[::-1][:2]
    rest = client.get(f"/api/v1/workflows?limit=2&cursor={first['next_cursor']}").get_json()
    assert [w["id"] for w in rest["workflows"]] == [ids[0]]
    assert rest["next_cursor"] is None


def test_idempotency_key_replays_the_same_workflow_and_refuses_another_body(client, store):
    steps = [_step("a"), _step("b", ["a"])]
    first = client.post("/api/v1/workflows", json={"name": "k", "steps": steps},
                        headers={"Idempotency-Key": "wf-1"})
    again = client.post("/api/v1/workflows", json={"name": "k", "steps": steps},
                        headers={"Idempotency-Key": "wf-1"})
    other = client.post("/api/v1/workflows", json={"name": "other", "steps": steps},
                        headers={"Idempotency-Key": "wf-1"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 422)
    assert first.get_json()["id"] == again.get_json()["id"]
    assert count_rows(store, "workflows") == 1 and count_rows(store, "jobs") == 2


@pytest.mark.parametrize(("steps", "named"), [
    ([_step("a", ["b"]), _step("b", ["a"])], "(a)"),
    ([_step("a", ["nope"])], "(a)"),
    ([_step("a"), _step("a")], "(a)"),
    ([{"id": "lonely", "after": []}], "(lonely)"),
    ([_step(f"s{i}") for i in range(1001)], "steps"),
    ([_step("a", ["a"])], "(a)"),
])
def test_bad_graphs_are_422_naming_the_step_and_insert_nothing(client, store, steps, named):
    response = client.post("/api/v1/workflows", json={"name": "bad", "steps": steps})
    assert response.status_code == 422
    body = response.get_json()["error"]
    assert body["code"] == "validation_failed"
    assert any(named in d["field"] for d in body["details"]), body
    assert count_rows(store, "jobs") == 0 and count_rows(store, "workflows") == 0


def test_unknown_workflow_is_404(client):
    missing = uuid.uuid4()
    for answer in (client.get(f"/api/v1/workflows/{missing}"),
                   client.delete(f"/api/v1/workflows/{missing}")):
        assert answer.status_code == 404
        assert answer.get_json()["error"]["message"] == "no workflow has this id"
    assert client.get("/api/v1/workflows/not-a-uuid").status_code == 404


def _fan_in(store, parents: int) -> tuple[list[uuid.UUID], uuid.UUID]:
    steps = [StepSpec(f"p{i}", StepJob("wf.step")) for i in range(parents)]
    steps.append(StepSpec("child", StepJob("wf.step"), tuple(s.id for s in steps)))
    with store.transaction() as conn:
        submitted = insert_workflow(conn, "fan-in", steps)
    return ([submitted.jobs[f"p{i}"].id for i in range(parents)],
            submitted.jobs["child"].id)


def _settle_together(store, claimed, groups: int) -> int:
    """Settle the claimed parents' successes from `groups` threads at once (batches of
    different sizes, some of one); the number of releases the settlements reported."""
    chunks = [claimed[i::groups] for i in range(groups)]
    barrier = threading.Barrier(groups)
    released: list[int] = []

    def settle(chunk) -> None:
        barrier.wait()
        batches = [chunk[:1], chunk[1:]] if len(chunk) > 1 else [chunk]
        for batch in batches:
            rows = store.settle([Settlement(c.lease_id, "w", transitions.succeeded(None),
                                            releases=True) for c in batch])
            with _lock:
                released.extend(len(r.released) for r in rows)

    threads = [threading.Thread(target=settle, args=(chunk,)) for chunk in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return sum(released)


def test_fan_in_of_100_parents_completing_together_releases_the_child_once(settings):
    from taskline.store.store import Store

    store = Store.connect(settings.database_url, pool_size=10)
    try:
        for _run in range(50):
            parents, child = _fan_in(store, 100)
            claimed = store.claim_jobs(parents, "w", 30.0)
            assert len(claimed) == 100
            assert _settle_together(store, claimed, groups=8) == 1
            job = store.get_job(child)
            assert job.status is Status.QUEUED
            events = [e["event"] for e in store.get_history(child)[0]]
            assert events == ["waiting", "unblocked"]
            with store.transaction() as conn:
                left = conn.execute(
                    text("SELECT pending_parents FROM taskline.jobs WHERE id = :id"),
                    {"id": child}).scalar_one()
            assert left == 0
    finally:
        store.dispose()


def test_submit_workflow_inside_the_callers_transaction(store):
    import taskline

    with store.transaction() as conn:
        rolled = taskline.submit_workflow(conn, "x", [_step("a"), _step("b", ["a"])])
        conn.rollback()
    assert store.get_workflow(rolled) is None and count_rows(store, "jobs") == 0
    with store.transaction() as conn:
        kept = taskline.submit_workflow(conn, "x", [_step("a"), _step("b", ["a"])])
    steps = store.workflow_steps([kept])[kept]
    assert sorted((s["step"], s["status"]) for s in steps) == [("a", "queued"),
                                                               ("b", "waiting")]
    with store.transaction() as conn:  # the first step is owed to Redis, the waiting one not
        owed = conn.execute(text("SELECT job_id FROM taskline.enqueue_outbox")).scalars().all()
    assert owed == [next(s["id"] for s in steps if s["step"] == "a")]


def _run_step(store, job_id, transition) -> None:
    [claimed] = store.claim_jobs([job_id], "w", 30.0)
    assert store.settle([Settlement(claimed.lease_id, "w", transition, releases=True)])


def test_retention_keeps_an_unfinished_workflow_and_a_purged_dead_step_cancels_its_dependents(
        store, dispatcher, settings):
    from taskline_maintenance.retention import Retention

    steps = [StepSpec("a", StepJob("wf.step")), StepSpec("b", StepJob("wf.step"), ("a",)),
             StepSpec("c", StepJob("wf.step"), ("b",))]
    with store.transaction() as conn:
        jobs = {k: j.id for k, j in insert_workflow(conn, "kept", steps).jobs.items()}
    _run_step(store, jobs["a"], transitions.succeeded({"n": 1}))
    _run_step(store, jobs["b"], transitions.dead("boom", reason="test"))
    with store.transaction() as conn:  # a and b finished two hours ago
        conn.execute(text("UPDATE taskline.jobs SET finished_at = now() - interval '2 hours', "
                          "updated_at = now() - interval '2 hours' WHERE id = ANY(:ids)"),
                     {"ids": [jobs["a"], jobs["b"]]})
    hour = {"retain_succeeded_s": 3600.0, "retain_cancelled_s": 3600.0}

    Retention(store, dispatcher, settings.replace(**hour, retain_dead_s=86400.0)).run_once()
    statuses = {k: getattr(store.get_job(j), "status", None) for k, j in jobs.items()}
    assert statuses == {"a": Status.SUCCEEDED, "b": Status.DEAD, "c": Status.WAITING}

    Retention(store, dispatcher, settings.replace(**hour, retain_dead_s=3600.0)).run_once()
    statuses = {k: getattr(store.get_job(j), "status", None) for k, j in jobs.items()}
    assert statuses == {"a": None, "b": None, "c": Status.CANCELLED}
    events = [e["event"] for e in store.get_history(jobs["c"])[0]]
    assert events == ["waiting", "cancelled"]


def test_asking_a_running_step_to_stop_cancels_its_waiting_dependents(client, settings):
    wf = submit(client, [_step("a", gate="wf-stop"), _step("b", ["a"]), _step("c", ["b"])])
    job_of = {s["id"]: s["job_id"] for s in wf["steps"]}
    with running_worker(settings, concurrency=1):
        wait_for(lambda: "a" in order(), message="a running")
        assert client.delete(f"/api/v1/jobs/{job_of['a']}").status_code == 202
        statuses = {s["id"]: s["status"] for s in workflow(client, wf["id"])["steps"]}
        assert statuses["b"] == statuses["c"] == "cancelled"
        wait_status(client, wf["id"], "cancelled")
    assert order() == ["a"]


def test_reconciliation_never_restores_a_waiting_step_and_removes_one_found_in_redis(
        store, dispatcher, settings):
    from taskline.dispatch.keys import QueueKeys
    from taskline_maintenance.reconciler import Reconciler

    with store.transaction() as conn:
        jobs = insert_workflow(conn, "r", [StepSpec("a", StepJob("wf.step")),
                                           StepSpec("b", StepJob("wf.step"), ("a",)),
                                           StepSpec("c", StepJob("wf.step"), ("a",))]).jobs
    with store.transaction() as conn:  # past the reconciler's grace
        conn.execute(text("UPDATE taskline.jobs SET updated_at = updated_at - interval '1 minute'"))
    keys = QueueKeys("default")
    dispatcher.push([("default", 5, str(jobs["b"].id))])  # a stray copy of a waiting step
    dispatcher.client.rpush(keys.processing("w-1"), str(jobs["c"].id))

    Reconciler(store, dispatcher, settings, strand_pause_s=0.1).run_once()

    ready = [i for key in keys.ready_by_urgency for i in dispatcher.list_range(key, 0, -1)]
    assert ready == [str(jobs["a"].id)]  # the queued root restored, no waiting step
    assert dispatcher.list_range(keys.processing("w-1"), 0, -1) == []
    assert {store.get_job(jobs[s].id).status for s in ("b", "c")} == {Status.WAITING}


def test_purging_a_dead_step_cancels_its_waiting_dependents(store):
    import uuid as _uuid

    from taskline.store.store import DeadFilter

    steps = [StepSpec("a", StepJob("wf.step")), StepSpec("b", StepJob("wf.step"), ("a",)),
             StepSpec("c", StepJob("wf.step"), ("b",)), StepSpec("x", StepJob("wf.step"))]
    with store.transaction() as conn:
        jobs = {k: j.id for k, j in insert_workflow(conn, "purged", steps).jobs.items()}
    _run_step(store, jobs["a"], transitions.dead("boom", reason="test"))
    purged = store.purge_dead(DeadFilter(ids=(jobs["a"],)), _uuid.UUID(int=0), 10,
                              actor="ops")
    assert [p.id for p in purged] == [jobs["a"]]
    statuses = {k: getattr(store.get_job(j), "status", None) for k, j in jobs.items()}
    assert statuses == {"a": None, "b": Status.CANCELLED, "c": Status.CANCELLED,
                        "x": Status.QUEUED}
    assert [e["actor"] for e in store.get_history(jobs["c"])[0]][-1] == "ops"
