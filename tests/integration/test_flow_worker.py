"""Flow limits with real workers (PostgreSQL and Redis): a concurrency limit holds across two
workers while another type of the same queue flows; a rate limit's starts stay inside every
sliding window; a tenant's backlog under `per_key` does not hold back another tenant; a removed
limit's jobs run from Redis; the API validates, shows and audits limits."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from tests.helpers import enqueue, wait_for
from tests.integration import worker_handlers as th
from tests.integration.worker_handlers import running_worker

pytestmark = pytest.mark.usefixtures("clean_handlers")


def put(client, scope, body):
    return client.put(f"/api/v1/limits/{scope}", json=body)


def starts(store, job_type: str) -> list[float]:
    with store.transaction() as conn:
        rows = conn.execute(text(
            "SELECT extract(epoch FROM l.leased_at) AS at FROM taskline.job_leases l "
            "JOIN taskline.jobs j ON j.id = l.job_id WHERE j.type = :t ORDER BY l.leased_at"),
            {"t": job_type}).all()
    return [float(r.at) for r in rows]


def all_done(store, n: int) -> bool:
    with store.transaction() as conn:
        return conn.execute(text("SELECT count(*) FROM taskline.jobs WHERE status = 'succeeded'")
                            ).scalar_one() >= n


def test_concurrency_limit_holds_across_workers_and_other_types_flow(settings, store,
                                                                     dispatcher, client):
    assert put(client, "type:t.held", {"concurrency": 2}).status_code == 201
    for i in range(12):
        enqueue(store, dispatcher, "t.held", {"tag": f"h{i}", "sleep_s": 0.1})
    for i in range(30):
        enqueue(store, dispatcher, "t.other", {"tag": f"o{i}", "sleep_s": 0.01})
    with running_worker(settings, concurrency=4), running_worker(settings, concurrency=4):
        wait_for(lambda: all_done(store, 42), timeout=30, message="every job ran")
    assert th.PEAK["t.held"] == 2
    assert th.PEAK["t.other"] >= 3  # the limited type never held the queue's other jobs back
    with store.transaction() as conn:
        attempts = conn.execute(text("SELECT max(attempts) FROM taskline.jobs")).scalar_one()
    assert attempts == 1  # holding consumed no attempt


def test_rate_limit_keeps_every_sliding_window(settings, store, dispatcher, client):
    assert put(client, "type:t.held", {"rate": {"limit": 5, "period_s": 0.5}}).status_code == 201
    for i in range(20):
        enqueue(store, dispatcher, "t.held", {"tag": str(i), "sleep_s": 0})
    with running_worker(settings, concurrency=8):
        wait_for(lambda: all_done(store, 20), timeout=30, message="every job ran")
    at = starts(store, "t.held")
    assert len(at) == 20
    worst = max(sum(1 for t in at if s <= t < s + 0.5) for s in at)
    assert worst <= 5, f"{worst} starts in one 0.5 s window"
    assert at[-1] - at[0] < 3.0  # budget reused as soon as it frees: about 1.5 s for 20


def test_a_tenant_backlog_does_not_hold_back_another_tenant(settings, store, dispatcher, client):
    put(client, "type:t.held", {"concurrency": 2, "per_key": True})
    for i in range(300):
        enqueue(store, dispatcher, "t.held", {"tag": f"a{i}", "sleep_s": 0.2}, limit_key="a")
    b = [enqueue(store, dispatcher, "t.held", {"tag": f"b{i}", "sleep_s": 0.2}, limit_key="b")
         for i in range(3)]
    with running_worker(settings, concurrency=8):
        wait_for(lambda: all(store.get_job(j.id).status.value == "succeeded" for j in b),
                 timeout=5, message="tenant b's jobs ran beside tenant a's backlog")
        assert th.PEAK["t.held"] <= 4


def test_removing_a_limit_runs_what_it_held(settings, store, dispatcher, client):
    put(client, "queue:default", {"concurrency": 1})
    jobs = [enqueue(store, dispatcher, "t.held", {"tag": str(i), "gate": "hold", "sleep_s": 30})
            for i in range(5)]
    with running_worker(settings, concurrency=4):
        wait_for(lambda: th.RUNNING.get("t.held") == 1, message="one job runs, four are held")
        time.sleep(0.5)
        assert th.RUNNING["t.held"] == 1
        listed = client.get("/api/v1/limits").get_json()["limits"]
        assert [(x["scope"], x["running"], x["held"]) for x in listed] == [("queue:default", 1, 4)]
        removed = client.delete("/api/v1/limits/queue:default").get_json()
        assert removed["released"] == 4
        wait_for(lambda: th.RUNNING.get("t.held") == 4, message="the held jobs run from Redis")
        th.release("hold")
        wait_for(lambda: all(store.get_job(j.id).status.value == "succeeded" for j in jobs),
                 message="all done")


@pytest.mark.parametrize(("scope", "body", "status", "field"), [
    ("type:x", {}, 422, "$"),
    ("type:x", {"concurrency": 0}, 422, "concurrency"),
    ("type:x", {"concurrency": -3}, 422, "concurrency"),
    ("type:x", {"concurrency": True}, 422, "concurrency"),
    ("type:x", {"rate": {"limit": 5}}, 422, "rate.period_s"),
    ("type:x", {"rate": {"limit": 5, "period_s": 0}}, 422, "rate.period_s"),
    ("type:x", {"rate": {"period_s": 1}}, 422, "rate.limit"),
    ("type:x", {"rate": {"limit": None, "period_s": 1}}, 422, "rate.limit"),
    ("type:x", {"rate": [5, 1]}, 422, "rate"),
    ("type:x", {"concurrency": 1, "per_key": "yes"}, 422, "per_key"),
    ("type:x", {"concurrency": 1, "burst": 2}, 422, "burst"),
    ("tenant:x", {"concurrency": 1}, 400, "scope"),
    ("queue:bad name", {"concurrency": 1}, 400, "scope"),
])
def test_bad_limits_are_refused_and_change_nothing(client, store, scope, body, status, field):
    response = put(client, scope, body)
    assert response.status_code == status, response.get_json()
    error = response.get_json()["error"]
    if status == 422:
        assert error["code"] == "validation_failed"
        assert field in {d["field"] for d in error["details"]}
    else:
        assert error["code"] == "invalid_parameter"
    assert store.list_flow_limits() == []


def test_limits_are_created_replaced_listed_removed_and_audited(client):
    first = put(client, "type:mail", {"concurrency": 3})
    assert first.status_code == 201
    again = put(client, "type:mail", {"rate": {"limit": 10, "period_s": 1}, "per_key": True})
    assert again.status_code == 200
    body = again.get_json()
    assert (body["concurrency"], body["rate"], body["per_key"]) == (
        None, {"limit": 10, "period_s": 1.0}, True)
    assert [x["scope"] for x in client.get("/api/v1/limits").get_json()["limits"]] == ["type:mail"]
    assert client.delete("/api/v1/limits/type:mail").status_code == 200
    assert client.delete("/api/v1/limits/type:mail").status_code == 404
    actions = [r["action"] for r in client.get("/api/v1/audit").get_json()["records"]]
    assert actions.count("limit.set") == 2 and actions.count("limit.delete") == 1


def test_limit_key_is_validated_and_shown(client):
    ok = client.post("/api/v1/jobs", json={"type": "echo", "limit_key": "tenant-7"})
    assert ok.status_code == 201 and ok.get_json()["limit_key"] == "tenant-7"
    bad = client.post("/api/v1/jobs", json={"type": "echo", "limit_key": ""})
    assert bad.status_code == 422
    assert bad.get_json()["error"]["details"][0]["field"] == "limit_key"
