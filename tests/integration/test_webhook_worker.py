"""The webhook handler run by a real `taskline worker` process, end to end.

The worker loads the built-in handlers and applies TASKLINE_WEBHOOK_ALLOW at start, so a job
aimed at loopback is dead-lettered as refused without the allow-list (the receiver never sees a
request) and succeeds with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from taskline.dispatch.dispatcher import Dispatcher
from taskline.jobs import Job
from taskline.settings import Settings
from taskline.store.store import Store
from tests.helpers import enqueue, service, service_env, wait_for
from tests.integration.test_webhook_handler import Receiver, _serve, _url


@pytest.fixture
def receiver() -> Iterator[ThreadingHTTPServer]:
    yield from _serve(ThreadingHTTPServer(("127.0.0.1", 0), Receiver))


def _finished(store: Store, job_id: uuid.UUID) -> Job | None:
    job = store.get_job(job_id)
    return job if job.status.terminal else None


def test_loopback_target_is_dead_lettered_without_the_allow_list(
        settings: Settings, store: Store, dispatcher: Dispatcher,
        receiver: ThreadingHTTPServer, tmp_path: Path) -> None:
    with service(["worker"], service_env(settings), tmp_path / "logs"):
        job = enqueue(store, dispatcher, "webhook", {"url": _url(receiver, "/ok")})
        done = wait_for(lambda: _finished(store, job.id), timeout=20, message="the webhook job")
    assert done.status == "dead"
    assert "not a public address" in done.last_error
    assert receiver.seen == []


def test_allow_listed_target_receives_the_post(
        settings: Settings, store: Store, dispatcher: Dispatcher,
        receiver: ThreadingHTTPServer, tmp_path: Path) -> None:
    env = service_env(settings, TASKLINE_WEBHOOK_ALLOW="127.0.0.1/32")
    with service(["worker"], env, tmp_path / "logs"):
        job = enqueue(store, dispatcher, "webhook",
                      {"url": _url(receiver, "/ok"), "body": {"n": 1}})
        done = wait_for(lambda: _finished(store, job.id), timeout=20, message="the webhook job")
    assert done.status == "succeeded", done.last_error
    assert done.result == {"status": 200, "body": '{"received": true}'}
    assert receiver.seen[0]["headers"]["Idempotency-Key"] == f"taskline:{job.id}"
