"""The workflow list's cache (taskline_producer.http.listcache): within
TASKLINE_API_LIST_CACHE_S the same query by the same principal is answered what it was
answered, a workflow this process submits or cancels empties it, another principal or another
query reads afresh, and 0 turns it off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from taskline.settings import Settings
from taskline_producer.app import close_app, create_app


@pytest.fixture
def make_client(settings: Settings) -> Iterator[Any]:
    made = []

    def make(**changes: Any) -> FlaskClient:
        made.append(create_app(settings.replace(**changes)))
        return made[-1].test_client()

    yield make
    for app in made:
        close_app(app)


def submit(client: FlaskClient, name: str, **headers: str) -> dict:
    answer = client.post("/api/v1/workflows", headers=headers, json={
        "name": name, "steps": [{"id": "a", "job": {"type": "wf.cached"}}]})
    assert answer.status_code == 201, answer.get_json()
    return dict(answer.get_json())


def counts(client: FlaskClient, query: str = "", **headers: str) -> list[dict]:
    answer = client.get(f"/api/v1/workflows{query}", headers=headers)
    assert answer.status_code == 200
    return [w["step_counts"] for w in answer.get_json()["workflows"]]


def cancel_step(client: FlaskClient, workflow: dict, **headers: str) -> None:
    step = workflow["steps"][0]["job_id"]
    assert client.delete(f"/api/v1/jobs/{step}", headers=headers).status_code == 200


def test_a_list_within_the_cache_age_is_the_same_answer(make_client):
    client = make_client(api_list_cache_s=30.0)
    first = submit(client, "first")
    assert counts(client) == [{"queued": 1}]
    cancel_step(client, first)  # a step's change does not empty the cache: it may be 30 s old
    assert counts(client) == [{"queued": 1}]
    assert counts(client, "?limit=10") == [{"cancelled": 1}]  # another query reads afresh
    submit(client, "second")  # a workflow submitted here empties it
    assert counts(client) == [{"queued": 1}, {"cancelled": 1}]


def test_each_principal_has_its_own_entries(make_client):
    client = make_client(api_list_cache_s=30.0,
                         api_tokens=("ops:o-secret", "reader:r-secret:jobs:read"))
    ops, reader = ({"Authorization": f"Bearer {t}"} for t in ("o-secret", "r-secret"))
    workflow = submit(client, "wf", **ops)
    assert counts(client, **ops) == [{"queued": 1}]
    cancel_step(client, workflow, **ops)
    assert counts(client, **reader) == [{"cancelled": 1}]
    assert counts(client, **ops) == [{"queued": 1}]


def test_no_cache_at_zero(make_client):
    client = make_client(api_list_cache_s=0.0)
    workflow = submit(client, "wf")
    assert counts(client) == [{"queued": 1}]
    cancel_step(client, workflow)
    assert counts(client) == [{"cancelled": 1}]
