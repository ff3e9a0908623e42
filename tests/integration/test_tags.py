"""Tags against real PostgreSQL: up to 20 labels of 1..100 characters through every way in (the
API single, batch and COPY batch, the library, a workflow step, the client), shown on the job,
`GET /api/v1/jobs?tag=` filtering by one through its index; bad tags are a 422 naming the
field, nothing written."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

import taskline
from taskline.client import job_spec


def tagged(client, tag: str) -> list[str]:
    answer = client.get(f"/api/v1/jobs?tag={tag}")
    assert answer.status_code == 200, answer.get_json()
    return sorted(j["id"] for j in answer.get_json()["jobs"])


def step_ids(client, workflow_id) -> list[str]:
    steps = client.get(f"/api/v1/workflows/{workflow_id}").get_json()["steps"]
    return [s["job_id"] if "job_id" in s else s["id"] for s in steps]


def test_tags_are_shown_and_filtered_by_through_every_way_in(client, database_url):
    one = client.post("/api/v1/jobs", json={"type": "t", "tags": ["blue", "acct-7", "blue"]})
    assert one.status_code == 201, one.get_json()
    assert one.get_json()["tags"] == ["blue", "acct-7"]  # a tag given twice is kept once
    batch = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t", "tags": ["blue"]}, {"type": "t"}]}).get_json()["jobs"]
    batch = [item["job"] for item in batch]
    copied = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t", "tags": ["bulk"]} for _ in range(120)]})
    assert copied.status_code == 201
    with psycopg.connect(database_url) as conn:
        library = taskline.enqueue(conn, "t", tags=("blue", "lib"))
        step = taskline.submit_workflow(conn, "w", [
            {"id": "a", "job": {"type": "t", "tags": ["blue"]}}])
    assert tagged(client, "blue") == sorted([one.get_json()["id"], batch[0]["id"], str(library),
                                             *step_ids(client, step)])
    assert len(client.get("/api/v1/jobs?tag=bulk&limit=200").get_json()["jobs"]) == 120
    assert tagged(client, "nothing") == []
    untagged = client.get(f"/api/v1/jobs/{batch[1]['id']}").get_json()
    assert untagged["tags"] == []
    assert client.get(f"/api/v1/jobs/{library}").get_json()["tags"] == ["blue", "lib"]


@pytest.mark.parametrize("tags, says", [
    ([f"t{i}" for i in range(21)], "at most 20"),
    (["x" * 101], "1..100"),
    ([""], "1..100"),
    ([7], "1..100"),
    ("blue", "array"),
])
def test_bad_tags_are_a_422_naming_the_field_and_nothing_is_written(client, store, tags, says):
    answer = client.post("/api/v1/jobs", json={"type": "t", "tags": tags})
    assert answer.status_code == 422
    details = answer.get_json()["error"]["details"]
    assert any(d["field"] == "tags" and says in d["message"] for d in details), details
    with store.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskline.jobs")).scalar_one() == 0


def test_a_bad_tag_filter_is_a_4xx_naming_the_parameter(client):
    answer = client.get("/api/v1/jobs?tag=" + "x" * 101)
    assert 400 <= answer.status_code < 500
    assert "tag" in str(answer.get_json()["error"])


def test_the_client_sends_tags_and_the_library_refuses_bad_ones(database_url):
    assert job_spec("t", tags=("a", "b"))["tags"] == ["a", "b"]
    with psycopg.connect(database_url) as conn, pytest.raises(taskline.InvalidJob):
        taskline.enqueue(conn, "t", tags=["x" * 101])


def test_the_tag_filter_reads_the_tags_index(client, store):
    client.post("/api/v1/jobs/batch", json={"jobs": [{"type": "t"} for _ in range(1000)]})
    client.post("/api/v1/jobs", json={"type": "t", "tags": ["rare"]})
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE taskline.jobs"))
        shown = "\n".join(r[0] for r in conn.execute(text(
            "EXPLAIN " + str(store._queries["list_jobs"])),
            {"status": None, "type": None, "queue": None, "tag": "rare", "limit": 50,
             "after_created": None, "after_id": None}).all())
    assert "jobs_tags" in shown, shown


def test_the_api_counts_jobs_accepted_with_tags_per_queue_not_per_tag(client):
    def count(queue: str) -> float:
        return REGISTRY.get_sample_value("taskline_jobs_tagged_total", {"queue": queue}) or 0.0

    before = count("default"), count("other")
    client.post("/api/v1/jobs", json={"type": "t", "tags": ["blue", "red"]})
    client.post("/api/v1/jobs", json={"type": "t"})
    answer = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t", "tags": ["blue"]}, {"type": "t", "queue": "other", "tags": ["x"]},
        {"type": "t"}]})
    assert answer.status_code == 201, answer.get_json()
    assert (count("default") - before[0], count("other") - before[1]) == (2, 1)
    tag_labels = {s.labels.get("tag") for m in REGISTRY.collect() for s in m.samples}
    assert tag_labels == {None}  # no series is labelled by a tag
