"""`taskline audit verify` against real PostgreSQL: a history written by the engine itself (a
worker, the API, a workflow, a flow limit, a dead job requeued) holds no violation, and each
invariant broken by hand-written rows (plain SQL into taskline.job_events / job_leases) is
reported with the job's id and exit 1."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline.audit_verify import verify
from taskline.store.history import HistoryReader
from taskline.store.queries import queries_for
from taskline.workflows import StepJob, StepSpec, insert_workflow
from taskline_cli.main import main
from taskline_maintenance.auditor import Auditor
from taskline_maintenance.promoter import Promoter
from tests.helpers import enqueue, succeed, wait_for
from tests.integration.worker_handlers import running_worker


def audit(capsys, monkeypatch, settings, *args: str) -> tuple[int, dict]:
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    capsys.readouterr()
    code = main(["audit", "verify", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def found(report: dict) -> set[tuple[str, str | None]]:
    return {(v["rule"], v["job_id"]) for v in report["violations"]}


def run_one(store, dispatcher, job_type: str = "echo", **options) -> uuid.UUID:
    """A job enqueued, claimed and succeeded as a worker records it."""
    job = enqueue(store, dispatcher, job_type, push=False, **options)
    (claimed,) = store.claim_jobs([job.id], "w1", 30.0)
    assert succeed(store, claimed.lease_id, "w1")
    return job.id


def sql(store, statement: str, **params) -> list:
    with store.transaction() as conn:
        result = conn.execute(text(statement), params)
        return result.all() if result.returns_rows else []


def wait_done(client, job_id: str, status: str) -> None:
    wait_for(lambda: client.get(f"/api/v1/jobs/{job_id}").get_json()["status"] == status,
             timeout=30, message=f"job {job_id} {status}")


def test_a_history_the_engine_wrote_passes(client, settings, store, dispatcher, capsys,
                                           monkeypatch):
    assert client.put("/api/v1/limits/type:simulate", json={"concurrency": 2}).status_code == 201
    ids = {name: client.post("/api/v1/jobs", json=body).get_json()["id"] for name, body in {
        "ok": {"type": "echo"},
        "retried": {"type": "simulate", "payload": {"fail_first": 1}, "max_retries": 2},
        "dead": {"type": "simulate", "payload": {"fail_first": 1, "non_retryable": True}},
        "later": {"type": "echo", "run_at": "2100-01-01T00:00:00Z"},
    }.items()}
    assert client.delete(f"/api/v1/jobs/{ids['later']}").status_code == 200
    wf = client.post("/api/v1/workflows", json={"name": "d", "steps": [
        {"id": "a", "job": {"type": "echo"}}, {"id": "b", "job": {"type": "echo"}, "after": ["a"]},
        {"id": "c", "job": {"type": "echo"}, "after": ["a"]},
        {"id": "d", "job": {"type": "echo"}, "after": ["b", "c"]}]}).get_json()
    with running_worker(settings, concurrency=4):
        wait_done(client, ids["dead"], "dead")
        assert client.post(f"/api/v1/jobs/{ids['dead']}/retry").status_code == 200
        promoter = Promoter(store, dispatcher, settings)
        expected = {"ok": "succeeded", "retried": "succeeded", "dead": "dead"}

        def settled() -> bool:
            promoter.run_once()  # the retry, once it is due
            jobs = {n: client.get(f"/api/v1/jobs/{ids[n]}").get_json() for n in expected}
            return ({n: j["status"] for n, j in jobs.items()} == expected
                    and jobs["dead"]["attempts"] == 1 and jobs["retried"]["attempts"] == 2)

        wait_for(settled, timeout=30, message="every job finished")
        wait_for(lambda: client.get(f"/api/v1/workflows/{wf['id']}").get_json()["status"]
                 == "succeeded", timeout=30, message="workflow succeeded")
    code, report = audit(capsys, monkeypatch, settings)
    assert report["violations"] == []
    assert (code, report["ok"], report["jobs"], report["limit_settings"]) == (0, True, 8, 1)


def test_two_overlapping_leases_are_reported(store, dispatcher, settings, capsys, monkeypatch):
    clean = run_one(store, dispatcher)
    job_id = run_one(store, dispatcher)
    sql(store, "INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, "
               "leased_until, released_at, outcome) SELECT job_id, attempt, 'w2', leased_at, "
               "leased_until, released_at, 'lost' FROM taskline.job_leases WHERE job_id = :id",
        id=job_id)
    code, report = audit(capsys, monkeypatch, settings)
    assert code == 1 and not report["ok"]
    assert ("lease_overlap", str(job_id)) in found(report)
    assert str(clean) not in {v["job_id"] for v in report["violations"]}


def test_a_finished_job_whose_lease_recorded_another_end_is_reported(
        store, dispatcher, settings, capsys, monkeypatch):
    job_id = run_one(store, dispatcher)
    sql(store, "INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, "
               "leased_until, released_at, outcome) VALUES (:id, 1, 'w2', "
               "clock_timestamp() + interval '1 s', clock_timestamp() + interval '30 s', "
               "clock_timestamp() + interval '2 s', 'failed')", id=job_id)
    code, report = audit(capsys, monkeypatch, settings)
    assert code == 1
    assert found(report) == {("terminal_outcome", str(job_id))}


def test_a_second_terminal_event_is_reported(store, dispatcher, settings, capsys, monkeypatch):
    job_id = run_one(store, dispatcher)
    sql(store, "INSERT INTO taskline.job_events (job_id, attempt, event) "
               "VALUES (:id, 1, 'cancelled')", id=job_id)
    code, report = audit(capsys, monkeypatch, settings)
    assert code == 1
    assert ("terminal_outcome", str(job_id)) in found(report)
    assert ("illegal_sequence", str(job_id)) in found(report)


def test_an_illegal_event_sequence_is_reported(store, dispatcher, settings, capsys, monkeypatch):
    job_id = run_one(store, dispatcher)
    sql(store, "INSERT INTO taskline.job_events (job_id, attempt, event) "
               "VALUES (:id, 1, 'promoted')", id=job_id)
    code, report = audit(capsys, monkeypatch, settings)
    assert code == 1
    assert found(report) == {("illegal_sequence", str(job_id))}
    lines = [v["message"] for v in report["violations"]]
    assert "promoted is not a move from succeeded" in lines[0]


def test_a_step_released_before_its_parent_succeeded_is_reported(
        store, settings, capsys, monkeypatch):
    with store.transaction() as conn:
        submitted = insert_workflow(conn, "early", [
            StepSpec("a", StepJob("echo")), StepSpec("b", StepJob("echo"), ("a",))])
    child = submitted.jobs["b"].id
    sql(store, "UPDATE taskline.jobs SET status = 'queued', pending_parents = 0 WHERE id = :id",
        id=child)
    sql(store, "INSERT INTO taskline.job_events (job_id, attempt, event) "
               "VALUES (:id, 0, 'unblocked')", id=child)
    code, report = audit(capsys, monkeypatch, settings)
    assert code == 1
    assert found(report) == {("step_before_parents", str(child))}
    assert "before parent" in report["violations"][0]["message"]


def _overlapping_leases(store, job_ids, start, step=timedelta(milliseconds=10),
                        until=None) -> None:
    """Leases of `job_ids` starting `step` apart from `start`, open until `until` (or open)."""
    for n, job_id in enumerate(job_ids):
        sql(store, "UPDATE taskline.jobs SET status = 'running', attempts = 1 WHERE id = :id",
            id=job_id)
        sql(store, "INSERT INTO taskline.job_events (job_id, attempt, event) "
                   "VALUES (:id, 1, 'claimed')", id=job_id)
        sql(store, "INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, "
                   "leased_until, released_at, outcome) VALUES (:id, 1, 'w', :at, "
                   ":at + interval '1 hour', CAST(:until AS timestamptz), "
                   "CASE WHEN CAST(:until AS timestamptz) IS NULL THEN NULL "
                   "ELSE 'lost' END)", id=job_id, at=start + step * n, until=until)


def test_a_start_beyond_a_concurrency_limit_in_force_is_reported(
        client, store, dispatcher, settings, capsys, monkeypatch):
    assert client.put("/api/v1/limits/type:mail", json={"concurrency": 1}).status_code == 201
    (set_at,) = sql(store, "SELECT at FROM taskline.audit_log WHERE action = 'limit.set'")
    jobs = [enqueue(store, dispatcher, "mail", push=False).id for _ in range(2)]
    _overlapping_leases(store, jobs, set_at[0] + timedelta(seconds=1))
    code, report = audit(capsys, monkeypatch, settings)
    assert code == 1
    assert found(report) == {("flow_limit", str(jobs[1]))}
    assert "type:mail: started as lease 2 of 1" in report["violations"][0]["message"]


def test_a_limit_is_judged_by_its_setting_of_the_time(
        client, store, dispatcher, settings, capsys, monkeypatch):
    """Two leases at once under concurrency 1 is a violation; the same after the limit was
    raised to 2 is not, and neither is anything after the limit was removed."""
    assert client.put("/api/v1/limits/type:mail", json={"concurrency": 1}).status_code == 201
    assert client.put("/api/v1/limits/type:mail", json={"concurrency": 2}).status_code == 200
    assert client.delete("/api/v1/limits/type:mail").status_code == 200
    changes = [r[0] for r in sql(store, "SELECT at FROM taskline.audit_log "
                                        "WHERE action LIKE 'limit.%' ORDER BY at, id")]
    assert len(changes) == 3
    early = [enqueue(store, dispatcher, "mail", push=False).id for _ in range(2)]
    later = [enqueue(store, dispatcher, "mail", push=False).id for _ in range(2)]
    span = changes[1] - changes[0]
    _overlapping_leases(store, early, changes[0], span / 3, until=changes[0] + span * 0.9)
    _overlapping_leases(store, later, changes[1] + timedelta(microseconds=1))
    reader = HistoryReader(store.engine)
    flows = [v for v in verify(reader) if v.rule == "flow_limit"]
    assert [v.job_id for v in flows] == [str(early[1])]


def test_since_limits_the_audit_to_newer_jobs(store, dispatcher, settings, capsys,
                                               monkeypatch):
    old = run_one(store, dispatcher)
    sql(store, "UPDATE taskline.jobs SET created_at = now() - interval '2 days' WHERE id = :id",
        id=old)
    sql(store, "INSERT INTO taskline.job_events (job_id, attempt, event) "
               "VALUES (:id, 1, 'promoted')", id=old)
    run_one(store, dispatcher)
    code, report = audit(capsys, monkeypatch, settings, "--since", "1d")
    assert (code, report["jobs"]) == (0, 1)
    code, report = audit(capsys, monkeypatch, settings)
    assert (code, report["jobs"], found(report)) == (1, 2, {("illegal_sequence", str(old))})


def test_pages_cover_every_job_once(store, dispatcher):
    ids = {run_one(store, dispatcher) for _ in range(7)}
    pages = list(HistoryReader(store.engine).pages(None, 3))
    assert [len(p.jobs) for p in pages] == [3, 3, 1]
    assert {j["id"] for p in pages for j in p.jobs} == {str(i) for i in ids}


@pytest.mark.parametrize("since", ["yesterday", "3w"])
def test_a_bad_since_is_a_usage_error(since, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["audit", "verify", "--since", since])
    assert exited.value.code == 2


def test_maintenance_audits_the_last_day_when_asked(store, dispatcher, settings):
    def gauge(rule: str) -> float | None:
        return REGISTRY.get_sample_value("taskline_audit_violations", {"rule": rule})

    job_id = run_one(store, dispatcher)
    assert Auditor(store, settings).run_once().jobs == 0  # TASKLINE_AUDIT_INTERVAL_S 0: off
    auditor = Auditor(store, settings.replace(audit_interval_s=60.0))
    assert auditor.run_once().violations == {}
    assert [gauge(rule) for rule in ("lease_overlap", "illegal_sequence")] == [0.0, 0.0]
    sql(store, "INSERT INTO taskline.job_events (job_id, attempt, event) "
               "VALUES (:id, 1, 'promoted')", id=job_id)
    result = auditor.run_once()
    assert (result.jobs, dict(result.violations)) == (1, {"illegal_sequence": 1})
    assert gauge("illegal_sequence") == 1.0
    sql(store, "UPDATE taskline.jobs SET created_at = now() - interval '2 days' WHERE id = :id",
        id=job_id)
    assert auditor.run_once().jobs == 0  # older than the day a pass looks at
    assert gauge("illegal_sequence") == 0.0


@pytest.mark.parametrize("url", ["postgresql://root@127.0.0.1:1/none", "mysql://x/y"])
def test_an_unreachable_or_foreign_database_is_exit_2(url, capsys, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["audit", "verify"]) == 2
    assert capsys.readouterr().err.startswith("taskline audit verify: ")


def _plan_nodes(plan: dict) -> list[str]:
    return [plan["Node Type"]] + [n for child in plan.get("Plans", ())
                                  for n in _plan_nodes(child)]


def test_a_page_of_jobs_is_read_off_the_index_without_sorting_the_rest(store, dispatcher):
    """A page is the next `limit` entries of index jobs_created: a plan that sorts (the
    selected text id has no index) reads every later job for each page, so the audit's time
    grew with the square of the history (docs/performance.md, "Audit verify at scale")."""
    ids = sorted(str(run_one(store, dispatcher)) for _ in range(3))
    statement = "EXPLAIN (FORMAT JSON) " + queries_for(store.schema)["audit_jobs_page"].text
    with store.transaction() as conn:
        conn.execute(text("SET LOCAL enable_sort = off"))  # as on a table too big to sort
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        (plan,) = conn.execute(text(statement), {
            "since": "1970-01-01T00:00:00Z", "after_created": "1970-01-01T00:00:00Z",
            "after_id": ids[0], "limit": 1000}).scalar_one()
    nodes = _plan_nodes(plan["Plan"])
    assert "Sort" not in nodes and "Incremental Sort" not in nodes, nodes
    assert "Index Scan" in nodes, nodes


def test_pages_walk_every_job_once_in_creation_order(store, dispatcher):
    made = [str(run_one(store, dispatcher)) for _ in range(5)]
    pages = list(HistoryReader(store.engine, store.schema).pages(None, 2))
    assert [len(page.jobs) for page in pages] == [2, 2, 1]
    seen = [job["id"] for page in pages for job in page.jobs]
    created = {job["id"]: job["created_at"] for page in pages for job in page.jobs}
    assert sorted(seen) == sorted(made)
    assert seen == sorted(seen, key=lambda i: (created[i], uuid.UUID(i)))
    assert all(page.leases[job["id"]] and page.events[job["id"]]
               for page in pages for job in page.jobs)


def test_a_job_of_a_shape_judged_clean_comes_without_its_rows(store, dispatcher):
    first, second = (str(run_one(store, dispatcher)) for _ in range(2))
    (page,) = HistoryReader(store.engine, store.schema).pages(None, 10)
    shapes = {job["id"]: job["shape"] for job in page.jobs}
    assert shapes[first] == shapes[second] is not None  # the same path: enqueued, claimed, won
    (page,) = HistoryReader(store.engine, store.schema).pages(None, 10, {shapes[first]})
    assert first not in page.events and first not in page.leases
    assert [job["id"] for job in page.jobs] == [first, second]


def test_a_violation_after_many_clean_jobs_of_its_path_is_still_found(
        store, dispatcher, settings, capsys, monkeypatch):
    """The clean jobs before it teach the audit their shape (their rows are then skipped);
    the planted job's lease recorded another end, so its shape is new."""
    for _ in range(4):
        run_one(store, dispatcher)
    job_id = run_one(store, dispatcher)
    sql(store, "UPDATE taskline.job_leases SET outcome = 'lost' WHERE job_id = :id", id=job_id)
    reader = HistoryReader(store.engine, store.schema)
    assert {(v.rule, v.job_id) for v in verify(reader, page_size=1)} == {
        ("terminal_outcome", str(job_id))}
