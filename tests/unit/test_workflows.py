"""The workflow graph rules and the derived status (pure): what a workflow may be, the order
its steps are inserted in, and how its status follows from its steps' states."""

from __future__ import annotations

import pytest

from taskline.jobs import Status
from taskline.settings import Settings
from taskline.workflows import (
    MAX_STEPS,
    StepJob,
    StepSpec,
    graph_errors,
    step_rows,
    topological,
    workflow_status,
)
from taskline_producer.schemas.workflowspec import WorkflowSpec, parse_workflow

JOB = StepJob("echo")


def step(step_id: str, *after: str) -> StepSpec:
    return StepSpec(step_id, JOB, after)


def test_a_diamond_is_a_workflow_inserted_parents_first() -> None:
    steps = [step("d", "b", "c"), step("b", "a"), step("c", "a"), step("a")]
    assert graph_errors(steps) == []
    assert topological(steps) == ["a", "b", "c", "d"]
    rows = step_rows(steps, None)
    assert [(r["step"], r["status"], r["pending_parents"]) for r in rows] == [
        ("a", Status.QUEUED, 0), ("b", Status.WAITING, 1), ("c", Status.WAITING, 1),
        ("d", Status.WAITING, 2)]


@pytest.mark.parametrize(("steps", "named", "text"), [
    ([step("a", "b"), step("b", "c"), step("c", "a")], {"a", "b", "c"}, "cycle"),
    ([step("a"), step("b", "zzz")], {"b"}, "unknown step 'zzz'"),
    ([step("a"), step("a")], {"a"}, "repeated"),
    ([step("a", "a")], {"a"}, "itself"),
    ([], {None}, "1..1000"),
    ([step(f"s{i}") for i in range(MAX_STEPS + 1)], {None}, "not 1001"),
])
def test_bad_graphs_name_the_step(steps, named, text) -> None:
    errors = graph_errors(steps)
    assert errors and {e.step for e in errors} <= named
    assert any(text in e.message for e in errors)


def test_a_cycle_behind_a_good_start_is_found() -> None:
    errors = graph_errors([step("start"), step("x", "start", "y"), step("y", "x")])
    assert [e.step for e in errors] in (["x"], ["y"])


@pytest.mark.parametrize(("states", "expected"), [
    (["succeeded", "succeeded"], "succeeded"),
    (["succeeded", "running", "waiting"], "running"),
    (["dead", "waiting"], "failed"),
    (["dead", "cancelled"], "failed"),
    (["succeeded", "cancelled"], "cancelled"),
    (["cancelled", "running"], "running"),
    (["queued"], "running"),
])
def test_status_is_derived_from_the_steps(states, expected) -> None:
    assert workflow_status(states) == expected


def test_the_api_refuses_step_keys_and_delays_after_parents_naming_the_step() -> None:
    settings = Settings.from_env(env={})
    body = {"name": "w", "steps": [
        {"id": "a", "job": {"type": "echo", "idempotency_key": "k"}},
        {"id": "b", "job": {"type": "echo", "delay_s": 5}, "after": ["a"]},
        {"id": "c", "after": ["a"]},
        {"id": "d", "job": {"type": "echo", "priority": 99}}]}
    errors = parse_workflow(body, settings)
    assert not isinstance(errors, WorkflowSpec)
    fields = [e.field for e in errors]
    assert fields == ["steps[0] (a).job.idempotency_key", "steps[1] (b).job", "steps[2] (c).job",
                      "steps[3] (d).job.priority"]


def test_the_api_names_the_step_of_a_graph_error_and_takes_the_key_once() -> None:
    settings = Settings.from_env(env={})
    cyclic = {"name": "w", "steps": [{"id": "a", "job": {"type": "echo"}, "after": ["b"]},
                                     {"id": "b", "job": {"type": "echo"}, "after": ["a"]}]}
    errors = parse_workflow(cyclic, settings)
    assert [e.field for e in errors] == ["steps[0] (a)"]
    ok = {"name": "w", "idempotency_key": "k1", "steps": [{"id": "a", "job": {"type": "echo"}}]}
    spec = parse_workflow(ok, settings, header_key="k1")
    assert isinstance(spec, WorkflowSpec) and spec.idempotency_key == "k1" and spec.request_hash
    clash = parse_workflow(ok, settings, header_key="k2")
    assert [e.field for e in clash] == ["idempotency_key"]


def test_the_releasing_settle_is_settle_verbatim_then_the_release() -> None:
    from taskline.store.queries import load_queries

    queries = {name: str(q) for name, q in load_queries().items()}
    settle, releasing = queries["settle"], queries["settle_releasing"]
    ctes = settle[:settle.rindex("\nSELECT ")]
    assert releasing.startswith(ctes + ", finished AS (")
    assert "FOR UPDATE OF j" in releasing and "ORDER BY j.id" in releasing


def test_the_step_cascade_is_written_once_and_taken_in_by_each_cancelling_statement() -> None:
    from taskline.store.queries import load_queries

    queries = {name: str(q) for name, q in load_queries().items()}
    assert "step_cascade_ctes" not in queries
    cascade = queries["cancel_waiting_dependents"]
    body = cascade[cascade.index(", below(id) AS ("):cascade.index("\nSELECT 'cancelled'")]
    assert "-- include" not in cascade and "FOR UPDATE OF j" in body
    for name in ("purge_dead_batch", "cancel_dependents_of_expired_dead"):
        assert body in queries[name], name
    source = ("-- name: frag_ctes\n-- a fragment\n, b AS (SELECT 2)\n"
              "-- name: q\n-- uses it\nWITH a AS (SELECT 1)\n-- include: frag_ctes\n"
              "SELECT * FROM a, b;\n")
    assert {n: " ".join(str(q).split()) for n, q in load_queries(source).items()} == {
        "q": "WITH a AS (SELECT 1) , b AS (SELECT 2) SELECT * FROM a, b"}


def test_when_needs_parents_a_known_value_and_no_step_after_an_any_failed_one() -> None:
    def when(step_id: str, value: str, *after: str) -> StepSpec:
        return StepSpec(step_id, JOB, after, value)

    assert graph_errors([step("a"), when("f", "any_failed", "a"), when("g", "always", "a"),
                         step("h", "g")]) == []
    errors = graph_errors([when("a", "always"), when("b", "maybe", "a"),
                           when("f", "any_failed", "a"), step("g", "f")])
    assert [(e.step, e.field) for e in errors] == [("b", "when"), ("a", "when"), ("g", "after")]
    rows = {r["step"]: r["run_when"] for r in step_rows(
        [step("a"), when("f", "any_failed", "a"), step("n", "a")], None)}
    assert rows == {"a": None, "f": "any_failed", "n": None}


@pytest.mark.parametrize(("counts", "unmet", "expected"), [
    ({"succeeded": 3, "cancelled": 1}, 1, "succeeded"),
    ({"succeeded": 2, "cancelled": 2}, 1, "cancelled"),
    ({"dead": 1, "succeeded": 1, "cancelled": 1}, 1, "failed"),
    ({"waiting": 1, "cancelled": 1}, 1, "running"),
])
def test_condition_unmet_steps_leave_a_succeeded_workflow_succeeded(counts, unmet,
                                                                    expected) -> None:
    assert workflow_status(counts, unmet) == expected


def test_the_api_names_the_when_field_of_the_step() -> None:
    body = {"name": "w", "steps": [{"id": "a", "job": {"type": "x"}},
                                   {"id": "b", "job": {"type": "x"}, "after": ["a"],
                                    "when": 3}]}
    errors = parse_workflow(body, Settings.from_env(env={}))
    assert [e.field for e in errors] == ["steps[1] (b).when"]
