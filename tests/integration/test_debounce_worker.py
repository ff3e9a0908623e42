"""A debounced job runs once, after its delay, with every joined payload as `ctx.coalesced`;
an arrival after the job was promoted begins a new job, which runs with its own payloads
(real worker, promoter, PostgreSQL and Redis)."""

from __future__ import annotations

import time

from flask.testing import FlaskClient

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.promoter import Promoter
from tests.helpers import wait_for
from tests.integration.worker_handlers import running_worker


def _debounced(client: FlaskClient, n: int) -> str:
    answer = client.post("/api/v1/jobs", json={
        "type": "t.coalesced", "payload": {"n": n}, "debounce": {"key": "g", "delay_s": 0.3}})
    assert answer.status_code in (200, 201), answer.json
    return str(answer.json["id"])


def _promote_when_due(store: Store, dispatcher: Dispatcher, settings: Settings) -> int:
    time.sleep(0.35)
    return Promoter(store, dispatcher, settings).run_once().promoted


def test_one_run_with_every_joined_payload(client: FlaskClient, store: Store,
                                           dispatcher: Dispatcher, settings: Settings) -> None:
    first = {_debounced(client, n) for n in range(4)}
    assert len(first) == 1
    assert store.get_job(next(iter(first))).status == "scheduled"
    assert _promote_when_due(store, dispatcher, settings) == 1
    second = {_debounced(client, n) for n in range(4, 6)}  # after promotion: a new job
    assert second.isdisjoint(first) and len(second) == 1
    assert _promote_when_due(store, dispatcher, settings) == 1
    with running_worker(settings):
        wait_for(lambda: all(store.get_job(i).status == "succeeded" for i in first | second),
                 timeout=15, message="both debounced jobs ran")
    assert store.get_job(first.pop()).result == {"coalesced": [{"n": n} for n in range(4)]}
    assert store.get_job(second.pop()).result == {"coalesced": [{"n": 4}, {"n": 5}]}


def test_plain_job_sees_its_one_payload(client: FlaskClient, store: Store,
                                        settings: Settings) -> None:
    job_id = client.post("/api/v1/jobs", json={"type": "t.coalesced", "payload": 7}).json["id"]
    with running_worker(settings):
        wait_for(lambda: store.get_job(job_id).status == "succeeded", timeout=15,
                 message="plain job ran")
    assert store.get_job(job_id).result == {"coalesced": [7]}
