"""Steps that run when a workflow fails (`when`), against real PostgreSQL and Redis.

Each outcome combination of an `any_failed` and an `always` step's parents (all succeed, one
dead, one cancelled, one dead then requeued and succeeding), decided by each way a parent ends:
a worker's success, failure and cancel (the settle statement), the reaper's dead path, a cancel
cascade, a DLQ purge and retention; the workflow's status, `parent_results`, the API's view
and its validation, and the in-process submit.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from taskline import transitions
from taskline.handlers.registry import JobContext, handler
from taskline.jobs import Status
from taskline.store.rows import Settlement
from taskline.store.store import DeadFilter
from taskline.workflows import StepJob, StepSpec, insert_workflow
from tests.helpers import wait_for
from tests.integration.worker_handlers import running_worker

pytestmark = pytest.mark.usefixtures("clean_handlers")

SEEN: list[tuple[str, dict[str, Any]]] = []


@handler("wfw.step")
def step_handler(payload: Any, ctx: JobContext) -> dict:
    SEEN.append((ctx.step or "", dict(ctx.parent_results)))
    if payload.get("fail"):
        raise RuntimeError(f"step {ctx.step} failed: {payload['fail']}")
    return {"step": ctx.step}


@pytest.fixture(autouse=True)
def _clean_seen():
    SEEN.clear()
    yield
    SEEN.clear()


def spec(step_id: str, after: tuple[str, ...] = (), when: str = "all_succeeded") -> StepSpec:
    return StepSpec(step_id, StepJob("wfw.step", max_retries=0), after, when)


def insert(store, *steps: StepSpec) -> dict[str, uuid.UUID]:
    with store.transaction() as conn:
        return {k: j.id for k, j in insert_workflow(conn, "when", list(steps)).jobs.items()}


def run(store, job_id: uuid.UUID, transition) -> list:
    """Claim one step and settle it as a worker would (releasing `when` dependents)."""
    [claimed] = store.claim_jobs([job_id], "w", 30.0)
    settled = store.settle([Settlement(claimed.lease_id, "w", transition, releases=True)])
    assert settled
    return list(settled[0].released)


def status(store, jobs: dict[str, uuid.UUID]) -> dict[str, Status | None]:
    return {k: getattr(store.get_job(j), "status", None) for k, j in jobs.items()}


def events(store, job_id: uuid.UUID) -> list[str]:
    return [e["event"] for e in store.get_history(job_id)[0]]


def view(client, store, jobs: dict[str, uuid.UUID]) -> dict:
    workflow_id = store.get_job(next(iter(jobs.values()))).workflow_id
    return client.get(f"/api/v1/workflows/{workflow_id}").get_json()


SUCCESS = transitions.succeeded({"ok": True})
DEATH = transitions.dead("ValueError: bad row 17", reason="test")


def test_any_failed_runs_once_a_parent_dies_with_its_error_and_attempts(store, client):
    jobs = insert(store, spec("a"), spec("b"), spec("next", ("a", "b")),
                  spec("on_fail", ("a", "b"), "any_failed"))
    assert run(store, jobs["a"], DEATH)[0].id == jobs["on_fail"]  # released by the death
    assert status(store, jobs)["on_fail"] is Status.QUEUED
    assert status(store, jobs)["next"] is Status.WAITING  # b still runs: nothing else moves
    results = store.parent_results(jobs["on_fail"])
    assert results["a"] == {"status": "dead", "error": "ValueError: bad row 17", "attempts": 1}
    assert results["b"] == {"status": "queued", "error": None, "attempts": 0}
    assert run(store, jobs["b"], SUCCESS) == []  # b's success changes nothing for it
    assert events(store, jobs["on_fail"]) == ["waiting", "unblocked"]
    shown = view(client, store, jobs)
    assert shown["status"] == "failed"
    assert {s["id"]: s["when"] for s in shown["steps"]}["on_fail"] == "any_failed"


def test_any_failed_is_cancelled_as_condition_unmet_and_the_workflow_succeeds(store, client):
    jobs = insert(store, spec("a"), spec("b"), spec("on_fail", ("a", "b"), "any_failed"),
                  spec("after_b", ("b",)))
    run(store, jobs["a"], SUCCESS)
    assert status(store, jobs)["on_fail"] is Status.WAITING
    assert run(store, jobs["b"], SUCCESS)[0].id == jobs["after_b"]
    assert status(store, jobs)["on_fail"] is Status.CANCELLED
    history = store.get_history(jobs["on_fail"])[0]
    assert [e["event"] for e in history] == ["waiting", "cancelled"]
    assert history[-1]["detail"] == {"cause": "condition_unmet"}
    run(store, jobs["after_b"], SUCCESS)
    shown = view(client, store, jobs)
    assert (shown["status"], shown["condition_unmet"]) == ("succeeded", 1)
    step = next(s for s in shown["steps"] if s["id"] == "on_fail")
    assert (step["status"], step["when"], step["cancel_cause"]) == (
        "cancelled", "any_failed", "condition_unmet")


def test_always_runs_once_every_parent_finished_whatever_the_outcome(store):
    jobs = insert(store, spec("a"), spec("b"), spec("c"),
                  spec("finally", ("a", "b", "c"), "always"))
    assert run(store, jobs["a"], DEATH) == []
    assert run(store, jobs["b"], SUCCESS) == []
    [cancelled] = store.claim_jobs([jobs["c"]], "w", 30.0)
    settled = store.settle([Settlement(cancelled.lease_id, "w",
                                       transitions.cancelled_while_running("stopped"),
                                       releases=True)])
    assert [r.id for r in settled[0].released] == [jobs["finally"]]
    results = store.parent_results(jobs["finally"])
    assert results["b"] == {"ok": True}
    assert results["a"]["status"] == "dead" and results["c"]["status"] == "cancelled"
    assert events(store, jobs["finally"]).count("unblocked") == 1


def test_always_after_parents_that_all_succeed_runs_and_the_workflow_succeeds(store, client):
    jobs = insert(store, spec("a"), spec("b"), spec("finally", ("a", "b"), "always"))
    run(store, jobs["a"], SUCCESS)
    assert run(store, jobs["b"], SUCCESS)[0].id == jobs["finally"]
    run(store, jobs["finally"], SUCCESS)
    assert view(client, store, jobs)["status"] == "succeeded"


def test_a_requeued_dead_parent_that_succeeds_runs_no_failure_step_again(store, client):
    jobs = insert(store, spec("a"), spec("b"), spec("next", ("a",)),
                  spec("on_fail", ("a",), "any_failed"), spec("finally", ("a", "b"), "always"))
    run(store, jobs["b"], SUCCESS)
    released = {r.id for r in run(store, jobs["a"], DEATH)}
    assert released == {jobs["on_fail"], jobs["finally"]}
    run(store, jobs["on_fail"], SUCCESS)
    run(store, jobs["finally"], SUCCESS)
    assert view(client, store, jobs)["status"] == "failed"

    assert store.requeue_dead_job(jobs["a"], "ops") is not None
    assert [r.id for r in run(store, jobs["a"], SUCCESS)] == [jobs["next"]]
    for step in ("on_fail", "finally"):  # each ran once, and is not released again
        assert events(store, jobs[step]).count("unblocked") == 1
        assert status(store, jobs)[step] is Status.SUCCEEDED
    run(store, jobs["next"], SUCCESS)
    assert view(client, store, jobs)["status"] == "succeeded"


def test_the_reapers_dead_path_releases_a_failure_step(store, dispatcher, settings):
    from taskline_maintenance.reaper import Reaper

    jobs = insert(store, spec("a"), spec("on_fail", ("a",), "any_failed"))
    store.claim_jobs([jobs["a"]], "gone-worker", 30.0)  # max_retries 0: its last attempt
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.job_leases SET leased_until = now() - "
                          "interval '1 second' WHERE job_id = :id"), {"id": jobs["a"]})
    assert Reaper(store, dispatcher, settings).run_once().dead_lettered == 1
    assert status(store, jobs) == {"a": Status.DEAD, "on_fail": Status.QUEUED}
    assert _in_ready(dispatcher, jobs["on_fail"])  # pushed after the commit


def _in_ready(dispatcher, job_id: uuid.UUID) -> bool:
    from taskline.dispatch.keys import QueueKeys

    return any(str(job_id) in dispatcher.list_range(key, 0, -1)
               for key in QueueKeys("default").ready_by_urgency)


def test_cancelling_a_step_releases_its_failure_steps_and_those_of_what_it_cancels(store):
    jobs = insert(store, spec("a"), spec("b", ("a",)), spec("on_a", ("a",), "any_failed"),
                  spec("on_b", ("b",), "any_failed"), spec("finally", ("b",), "always"),
                  spec("after_b", ("b",)))
    job, dependents = store.cancel_step(jobs["a"], "ops")
    assert job is not None and job.status is Status.CANCELLED
    by_status = {d.id: d.status for d in dependents}
    assert by_status == {jobs["b"]: Status.CANCELLED, jobs["after_b"]: Status.CANCELLED,
                         jobs["on_a"]: Status.QUEUED, jobs["on_b"]: Status.QUEUED,
                         jobs["finally"]: Status.QUEUED}
    assert store.parent_results(jobs["on_b"])["b"]["status"] == "cancelled"
    assert store.get_history(jobs["after_b"])[0][-1]["detail"] == {"cause": "parent_cancelled"}


def test_asking_a_running_step_to_stop_lets_its_failure_step_wait_for_its_end(store):
    jobs = insert(store, spec("a"), spec("on_a", ("a",), "any_failed"), spec("next", ("a",)))
    [claimed] = store.claim_jobs([jobs["a"]], "w", 30.0)
    job, dependents = store.request_cancel_step(jobs["a"], "ops")
    assert job is not None and [d.id for d in dependents] == [jobs["next"]]
    assert status(store, jobs)["on_a"] is Status.WAITING
    settled = store.settle([Settlement(claimed.lease_id, "w",
                                       transitions.cancelled_while_running("stopped"),
                                       releases=True)])
    assert [r.id for r in settled[0].released] == [jobs["on_a"]]


def test_purging_a_dead_parent_releases_the_failure_step_of_what_it_cancels(store):
    jobs = insert(store, spec("a"), spec("b", ("a",)), spec("on_b", ("b",), "any_failed"),
                  spec("on_a", ("a",), "any_failed"))
    assert [r.id for r in run(store, jobs["a"], DEATH)] == [jobs["on_a"]]
    [purged] = store.purge_dead(DeadFilter(ids=(jobs["a"],)), uuid.UUID(int=0), 10,
                                actor="ops")
    assert purged.id == jobs["a"] and [r.id for r in purged.released] == [jobs["on_b"]]
    assert status(store, jobs) == {"a": None, "b": Status.CANCELLED, "on_b": Status.QUEUED,
                                   "on_a": Status.QUEUED}
    assert events(store, jobs["on_a"]).count("unblocked") == 1


def test_retention_of_a_dead_parent_releases_the_failure_step_of_what_it_cancels(
        store, dispatcher, settings):
    from taskline_maintenance.retention import Retention

    jobs = insert(store, spec("a"), spec("b", ("a",)), spec("on_b", ("b",), "any_failed"))
    run(store, jobs["a"], DEATH)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET finished_at = now() - interval '2 hours' "
                          "WHERE id = :id"), {"id": jobs["a"]})
    Retention(store, dispatcher, settings.replace(retain_dead_s=3600.0)).run_once()
    assert status(store, jobs)["b"] is Status.CANCELLED
    assert status(store, jobs)["on_b"] is Status.QUEUED
    assert _in_ready(dispatcher, jobs["on_b"])


def test_cancelling_the_workflow_cancels_its_unstarted_when_steps(store, client):
    jobs = insert(store, spec("a"), spec("on_fail", ("a",), "any_failed"),
                  spec("finally", ("a",), "always"))
    workflow_id = store.get_job(jobs["a"]).workflow_id
    assert client.delete(f"/api/v1/workflows/{workflow_id}").status_code == 200
    assert set(status(store, jobs).values()) == {Status.CANCELLED}
    shown = view(client, store, jobs)
    assert (shown["status"], shown["condition_unmet"]) == ("cancelled", 0)


def test_a_worker_runs_the_failure_step_with_the_failed_parents_in_parent_results(
        client, settings):
    steps = [{"id": "a", "job": {"type": "wfw.step", "payload": {"fail": "disk full"},
                                 "max_retries": 0}},
             {"id": "b", "job": {"type": "wfw.step"}},
             {"id": "on_fail", "after": ["a", "b"], "when": "any_failed",
              "job": {"type": "wfw.step"}},
             {"id": "finally", "after": ["a", "b"], "when": "always",
              "job": {"type": "wfw.step"}}]
    response = client.post("/api/v1/workflows", json={"name": "e2e", "steps": steps})
    assert response.status_code == 201, response.get_json()
    wf = response.get_json()
    assert {s["id"]: s["when"] for s in wf["steps"]} == {
        "a": "all_succeeded", "b": "all_succeeded", "on_fail": "any_failed",
        "finally": "always"}
    with running_worker(settings, concurrency=2):
        wait_for(lambda: {s for s, _ in SEEN} >= {"on_fail", "finally"}, timeout=30,
                 message="both when steps ran")
        wait_for(lambda: client.get(f"/api/v1/workflows/{wf['id']}").get_json()[
            "step_counts"].get("succeeded") == 3, message="when steps recorded")
    finally_parents = next(p for s, p in SEEN if s == "finally")
    assert finally_parents["a"]["status"] == "dead"
    assert finally_parents["a"]["error"].endswith("step a failed: disk full")
    assert finally_parents["a"]["attempts"] == 1
    assert finally_parents["b"] == {"step": "b"}
    assert [s for s, _ in SEEN].count("on_fail") == 1
    assert [s for s, _ in SEEN].count("finally") == 1
    assert client.get(f"/api/v1/workflows/{wf['id']}").get_json()["status"] == "failed"


@pytest.mark.parametrize(("steps", "field"), [
    ([{"id": "a", "job": {"type": "x"}},
      {"id": "b", "after": ["a"], "when": "sometimes", "job": {"type": "x"}}],
     "steps[1] (b).when"),
    ([{"id": "a", "when": "always", "job": {"type": "x"}}], "steps[0] (a).when"),
    ([{"id": "a", "job": {"type": "x"}},
      {"id": "f", "after": ["a"], "when": "any_failed", "job": {"type": "x"}},
      {"id": "g", "after": ["f"], "job": {"type": "x"}}], "steps[2] (g).after"),
    ([{"id": "a", "job": {"type": "x"}},
      {"id": "b", "after": ["a"], "when": ["always"], "job": {"type": "x"}}],
     "steps[1] (b).when"),
])
def test_a_bad_when_is_a_422_naming_the_field_and_nothing_is_written(client, store, steps,
                                                                     field):
    response = client.post("/api/v1/workflows", json={"name": "bad", "steps": steps})
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "validation_failed"
    assert [d["field"] for d in error["details"]] == [field]
    with store.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.jobs")).scalar_one() == 0


def test_submit_workflow_in_the_callers_transaction_takes_when(store):
    import taskline

    steps = [{"id": "a", "job": {"type": "wfw.step"}},
             {"id": "f", "after": ["a"], "when": "any_failed", "job": {"type": "wfw.step"}}]
    with store.transaction() as conn:
        workflow_id = taskline.submit_workflow(conn, "lib", steps)
    shown = {s["step"]: s["run_when"] for s in store.workflow_steps([workflow_id])[workflow_id]}
    assert shown == {"a": "all_succeeded", "f": "any_failed"}
    with pytest.raises(ValueError, match="no parents"), store.transaction() as conn:
        taskline.submit_workflow(conn, "lib", [{"id": "a", "when": "always",
                                                "job": {"type": "wfw.step"}}])


def test_the_workflow_views_with_when_steps_match_the_document(client, store):
    from tests.integration.test_api_ops import _validator

    doc = client.get("/api/v1/openapi.json").get_json()
    jobs = insert(store, spec("a"), spec("on_fail", ("a",), "any_failed"),
                  spec("finally", ("a",), "always"))
    run(store, jobs["a"], SUCCESS)
    workflow_id = store.get_job(jobs["a"]).workflow_id
    step = client.get(f"/api/v1/jobs/{jobs['on_fail']}").get_json()
    assert (step["step"], step["when"]) == ("on_fail", "any_failed")
    assert step["events"][-1]["detail"] == {"cause": "condition_unmet"}
    checks = [("Workflow", client.get(f"/api/v1/workflows/{workflow_id}").get_json()),
              ("WorkflowPage", client.get("/api/v1/workflows").get_json()),
              ("JobDetail", step)]
    for name, instance in checks:
        assert [e.message for e in _validator(doc, name).iter_errors(instance)] == [], name
    when = doc["components"]["schemas"]["WorkflowStepCreate"]["properties"]["when"]
    assert when["enum"] == ["all_succeeded", "any_failed", "always"]


# --- audit verify's step_before_parents rule, with when ------------------------------------

def _audit(capsys, monkeypatch, settings) -> tuple[int, set[tuple[str, str | None]], dict]:
    from tests.integration.test_audit_verify import audit, found

    code, report = audit(capsys, monkeypatch, settings)
    return code, found(report), report


def test_a_history_of_when_steps_the_engine_wrote_passes_the_audit(store, settings, capsys,
                                                                   monkeypatch):
    jobs = insert(store, spec("a"), spec("b"), spec("on_fail", ("a", "b"), "any_failed"),
                  spec("finally", ("a", "b"), "always"), spec("next", ("a",)))
    run(store, jobs["a"], DEATH)
    run(store, jobs["on_fail"], SUCCESS)
    run(store, jobs["b"], SUCCESS)
    run(store, jobs["finally"], SUCCESS)
    store.requeue_dead_job(jobs["a"], "ops")
    run(store, jobs["a"], SUCCESS)
    run(store, jobs["next"], SUCCESS)
    unmet = insert(store, spec("a"), spec("on_fail", ("a",), "any_failed"))
    run(store, unmet["a"], SUCCESS)
    assert status(store, unmet)["on_fail"] is Status.CANCELLED
    code, violations, _ = _audit(capsys, monkeypatch, settings)
    assert (code, violations) == (0, set())


def _plant_release(store, job_id: uuid.UUID) -> None:
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'queued' WHERE id = :id"),
                     {"id": job_id})
        conn.execute(text("INSERT INTO taskline.job_events (job_id, attempt, event) "
                          "VALUES (:id, 0, 'unblocked')"), {"id": job_id})


def test_an_any_failed_step_released_though_no_parent_failed_is_reported(
        store, settings, capsys, monkeypatch):
    jobs = insert(store, spec("a"), spec("b"), spec("on_fail", ("a", "b"), "any_failed"))
    run(store, jobs["a"], SUCCESS)
    _plant_release(store, jobs["on_fail"])
    code, violations, report = _audit(capsys, monkeypatch, settings)
    assert (code, violations) == (1, {("step_before_parents", str(jobs["on_fail"]))})
    assert "any_failed" in report["violations"][0]["message"]


def test_an_always_step_released_before_a_parent_finished_is_reported(
        store, settings, capsys, monkeypatch):
    jobs = insert(store, spec("a"), spec("b"), spec("finally", ("a", "b"), "always"))
    run(store, jobs["a"], DEATH)
    _plant_release(store, jobs["finally"])
    code, violations, report = _audit(capsys, monkeypatch, settings)
    assert (code, violations) == (1, {("step_before_parents", str(jobs["finally"]))})
    assert f"before parent {jobs['b']} finished" in report["violations"][0]["message"]


def test_a_condition_unmet_before_every_parent_succeeded_is_reported(
        store, settings, capsys, monkeypatch):
    jobs = insert(store, spec("a"), spec("b"), spec("on_fail", ("a", "b"), "any_failed"))
    run(store, jobs["a"], SUCCESS)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'cancelled', finished_at = now() "
                          "WHERE id = :id"), {"id": jobs["on_fail"]})
        conn.execute(text("INSERT INTO taskline.job_events (job_id, attempt, event, detail) "
                          "VALUES (:id, 0, 'cancelled', '{\"cause\": \"condition_unmet\"}')"),
                     {"id": jobs["on_fail"]})
    code, violations, report = _audit(capsys, monkeypatch, settings)
    assert (code, violations) == (1, {("step_before_parents", str(jobs["on_fail"]))})
    assert "condition_unmet" in report["violations"][0]["message"]


def test_a_worker_counts_the_failure_steps_it_cancels_as_unmet(client, settings):
    from prometheus_client import REGISTRY

    def unmet() -> float:
        return REGISTRY.get_sample_value("taskline_workflow_steps_condition_unmet_total") or 0.0

    before = unmet()
    steps = [{"id": "a", "job": {"type": "wfw.step"}},
             {"id": "on_fail", "after": ["a"], "when": "any_failed", "job": {"type": "wfw.step"}}]
    wf = client.post("/api/v1/workflows", json={"name": "m", "steps": steps}).get_json()
    with running_worker(settings, concurrency=1):
        wait_for(lambda: client.get(f"/api/v1/workflows/{wf['id']}").get_json()["status"]
                 == "succeeded", timeout=30, message="workflow succeeded")
    assert unmet() == before + 1
    assert [s for s, _ in SEEN] == ["a"]
