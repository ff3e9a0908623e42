"""Workflow answers bounded in size: the list carries step counts by status, never steps, and a
read of one workflow pages its steps by `limit` and `cursor` (and by the parent ids a page
carries), every step exactly once across the pages."""

from __future__ import annotations

import pytest

from taskline_producer.routes import workflows


def _step(step_id: str, after: list[str] = ()) -> dict:
    return {"id": step_id, "job": {"type": "wf.page", "max_retries": 0}, "after": list(after)}


def submit(client, steps: list[dict], name: str = "wf") -> dict:
    response = client.post("/api/v1/workflows", json={"name": name, "steps": steps})
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_the_list_carries_step_counts_not_steps(client):
    wf = submit(client, [_step("a"), _step("b"), _step("c", ["a", "b"])])
    listed = client.get("/api/v1/workflows").get_json()["workflows"]
    assert listed == [{"id": wf["id"], "name": "wf", "status": "running",
                       "created_at": wf["created_at"], "steps_total": 3,
                       "step_counts": {"queued": 2, "waiting": 1}, "condition_unmet": 0}]


def test_a_workflow_s_steps_come_in_pages_each_step_once(client):
    steps = [_step(f"s{i:02}") for i in range(7)] + [_step("last", ["s00", "s01"])]
    wf = submit(client, steps)
    assert wf["steps_total"] == 8 and wf["step_counts"] == {"queued": 7, "waiting": 1}
    seen, cursor, pages = [], None, 0
    while True:
        url = f"/api/v1/workflows/{wf['id']}?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(url).get_json()
        assert len(page["steps"]) <= 3 and page["steps_total"] == 8
        seen += [s["id"] for s in page["steps"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(s["id"] for s in steps)
    assert len(client.get(f"/api/v1/workflows/{wf['id']}").get_json()["steps"]) == 8


def test_a_page_ends_before_it_carries_too_many_parent_ids(client, monkeypatch):
    monkeypatch.setattr(workflows, "MAX_PAGE_EDGES", 3)
    wf = submit(client, [_step("a"), _step("b"), _step("c", ["a", "b"]), _step("d", ["a", "b"])])
    page = client.get(f"/api/v1/workflows/{wf['id']}?limit=10").get_json()
    assert sum(len(s["after"]) for s in page["steps"]) <= 3
    assert page["next_cursor"] is not None
    rest = client.get(f"/api/v1/workflows/{wf['id']}?cursor={page['next_cursor']}").get_json()
    assert len(page["steps"]) + len(rest["steps"]) == 4 and rest["next_cursor"] is None


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "cursor=bm90LWEtdXVpZA",
                                   "cursor=%00"])
def test_a_bad_step_page_parameter_is_a_400(client, query):
    wf = submit(client, [_step("a")])
    response = client.get(f"/api/v1/workflows/{wf['id']}?{query}")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "invalid_parameter"
