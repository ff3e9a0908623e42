"""`taskline workflow submit | status | cancel` and the Python client's workflow methods,
against a real `taskline api` subprocess. The tests share one database and one API
(tests/integration/conftest.py), so each picks out the workflows it submitted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskline.client import Client, ClientError
from taskline.settings import Settings
from tests.integration.test_cli_client import taskline

REPORT = {"name": "report", "steps": [
    {"id": "fetch", "job": {"type": "echo"}},
    *({"id": f"part{i}", "job": {"type": "echo", "payload": {"part": i}}, "after": ["fetch"]}
      for i in range(3)),
    {"id": "merge", "job": {"type": "echo"}, "after": ["part0", "part1", "part2"]},
]}


@pytest.fixture
def settings(module_settings: Settings, redis_url: str) -> Settings:
    return module_settings


@pytest.fixture
def api_url(module_api_url: str, redis_url: str) -> str:
    return module_api_url


def all_workflow_ids(client: Client) -> list[str]:
    """Every workflow's id, newest first (the module's few fit one page)."""
    page = client.workflows(limit=100)
    assert page["next_cursor"] is None
    return [w["id"] for w in page["workflows"]]


def test_submit_status_and_cancel_from_the_command_line(api_url: str, tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(REPORT))
    done = taskline("workflow", "submit", str(path), "--json", url=api_url)
    assert done.returncode == 0, done.stderr
    wf = json.loads(done.stdout)
    statuses = {s["id"]: s["status"] for s in wf["steps"]}
    assert statuses == {"fetch": "queued", "part0": "waiting", "part1": "waiting",
                        "part2": "waiting", "merge": "waiting"}
    shown = taskline("workflow", "status", wf["id"], url=api_url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == [wf["id"], "report", "running"]
    assert lines[1].split()[:3] == ["STEP", "STATUS", "AFTER"]
    assert any(line.split()[:3] == ["merge", "waiting", "part0,part1,part2"] for line in lines)
    cancelled = taskline("workflow", "cancel", wf["id"], "--json", url=api_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    again = taskline("workflow", "cancel", wf["id"], url=api_url)
    assert again.returncode == 1 and "409" in again.stderr


def test_bad_files_are_usage_errors_and_bad_graphs_api_errors(api_url: str,
                                                              tmp_path: Path) -> None:
    missing = taskline("workflow", "submit", str(tmp_path / "none.json"), url=api_url)
    assert missing.returncode == 2
    cyclic = {"name": "c", "steps": [{"id": "a", "job": {"type": "echo"}, "after": ["b"]},
                                     {"id": "b", "job": {"type": "echo"}, "after": ["a"]}]}
    refused = taskline("workflow", "submit", "-", url=api_url, stdin=json.dumps(cyclic))
    assert refused.returncode == 1 and "validation_failed" in refused.stderr


def test_client_submits_once_under_one_key_and_reads_the_list(api_url: str) -> None:
    with Client(api_url) as client:
        before = all_workflow_ids(client)
        first = client.submit_workflow("report", REPORT["steps"], idempotency_key="r-1")
        again = client.submit_workflow("report", REPORT["steps"], idempotency_key="r-1")
        assert first["id"] == again["id"]
        with pytest.raises(ClientError) as refused:
            client.submit_workflow("other", REPORT["steps"], idempotency_key="r-1")
        assert refused.value.status == 422
        assert client.workflow(first["id"])["status"] == "running"
        assert all_workflow_ids(client) == [first["id"], *before]
        assert client.cancel_workflow(first["id"])["status"] == "cancelled"


def test_status_shows_every_step_of_a_workflow_longer_than_a_page(api_url: str,
                                                                  tmp_path: Path) -> None:
    steps = [{"id": f"s{i:03}", "job": {"type": "echo"}} for i in range(250)]
    with Client(api_url) as client:
        wf = client.submit_workflow("long", steps)
        first = client.workflow(wf["id"], limit=100)
        assert len(first["steps"]) == 100 and first["next_cursor"]
        listed = client.workflows()["workflows"][0]
        assert listed["id"] == wf["id"] and listed["steps_total"] == 250 and "steps" not in listed
    shown = taskline("workflow", "status", wf["id"], "--json", url=api_url)
    assert shown.returncode == 0, shown.stderr
    assert sorted(s["id"] for s in json.loads(shown.stdout)["steps"]) == [s["id"] for s in steps]


WHEN = {"name": "guarded", "steps": [
    {"id": "load", "job": {"type": "echo", "max_retries": 0}},
    {"id": "on_fail", "job": {"type": "echo"}, "after": ["load"], "when": "any_failed"},
    {"id": "finally", "job": {"type": "echo"}, "after": ["load"], "when": "always"},
]}


def test_when_steps_from_the_command_line_show_their_condition_and_cause(
        api_url: str, tmp_path: Path, store) -> None:
    from taskline import transitions
    from taskline.store.rows import Settlement

    path = tmp_path / "guarded.json"
    path.write_text(json.dumps(WHEN))
    done = taskline("workflow", "submit", str(path), "--json", url=api_url)
    assert done.returncode == 0, done.stderr
    wf = json.loads(done.stdout)
    assert {s["id"]: s["when"] for s in wf["steps"]}["finally"] == "always"
    load = next(s["job_id"] for s in wf["steps"] if s["id"] == "load")
    [claimed] = store.claim_jobs([load], "w", 30.0)
    store.settle([Settlement(claimed.lease_id, "w", transitions.succeeded(1), releases=True)])
    shown = taskline("workflow", "status", wf["id"], url=api_url).stdout.splitlines()
    assert shown[1].split()[:4] == ["STEP", "STATUS", "AFTER", "WHEN"]
    rows = {line.split()[0]: line.split()[1:5] for line in shown[2:]}
    assert rows["on_fail"] == ["cancelled", "(condition_unmet)", "load", "any_failed"]
    assert rows["finally"] == ["queued", "load", "always", "echo"]


def test_the_async_client_submits_when_steps_and_a_bad_when_is_refused(api_url: str) -> None:
    import asyncio

    from taskline.client import AsyncClient

    async def main() -> tuple[dict, ClientError]:
        async with AsyncClient(api_url) as client:
            wf = await client.submit_workflow("guarded", WHEN["steps"])
            bad = [WHEN["steps"][0], {**WHEN["steps"][1], "when": "never"}]
            try:
                await client.submit_workflow("bad", bad)
            except ClientError as err:
                return wf, err
            raise AssertionError("a bad when was accepted")

    wf, refused = asyncio.run(main())
    assert {s["id"]: s["when"] for s in wf["steps"]}["on_fail"] == "any_failed"
    assert refused.status == 422
    assert [d["field"] for d in refused.details] == ["steps[1] (on_fail).when"]
