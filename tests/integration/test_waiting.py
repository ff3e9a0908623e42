"""Waiting for a result, woken by the commit that finishes the job: migration 0017's signal, sent
only for a job a waiter flagged (migration 0028), the process's FinishListener, `taskline.wait`
on a connection, `wait_s` on the API (under gunicorn, waiting requests hold no thread: more of
them than threads still leave the API answering), and Client / AsyncClient `wait` and
`wait_workflow` raising JobFailed and JobCancelled."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from sqlalchemy import text

import taskline
from taskline import JobCancelled, JobFailed
from taskline.client import AsyncClient, Client
from taskline.finishing import FinishListener
from taskline.handlers.registry import handler
from taskline.settings import Settings
from taskline.testing import drain
from taskline_producer.app import close_app, create_app
from tests.helpers import wait_for
from tests.integration.test_client_api import start_api

THREADS = 16  # gunicorn.conf.py's threads per API process


@handler("tw.job")
def job(payload: Any, ctx: Any) -> Any:
    if payload.get("fail"):
        raise RuntimeError(payload["fail"])
    return {"done": payload.get("n")}


def commit(database_url: str, payload: Any, **fields: Any) -> uuid.UUID:
    with psycopg.connect(database_url) as conn:
        return taskline.enqueue(conn, "tw.job", payload, **fields)


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as err:
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# --- the signal and the listener -----------------------------------------------------------

def signals(database_url: str) -> psycopg.Connection:
    """A connection listening on the finish channel itself (not through a FinishListener)."""
    conn = psycopg.connect(database_url, autocommit=True)
    conn.execute("LISTEN taskline_finished")
    return conn


def received(conn: psycopg.Connection, seconds: float = 1.0) -> list[str]:
    """The payloads signalled within `seconds` of the last one (at least `seconds` in all)."""
    return [note.payload for note in conn.notifies(timeout=seconds)]


def watched(database_url: str, *ids: uuid.UUID) -> list[bool | None]:
    """Each job's `watched` flag, in the order of `ids`."""
    with psycopg.connect(database_url) as conn:
        rows = dict(conn.execute("SELECT id, watched FROM taskline.jobs WHERE id = ANY(%s)",
                                 (list(ids),)).fetchall())
    return [rows[i] for i in ids]


def test_only_a_watched_job_signals_and_only_at_its_finishing_commit(database_url, store):
    listener = FinishListener(database_url)
    try:
        job_id, unwatched = commit(database_url, {"n": 1}), commit(database_url, {"n": 2})
        assert listener.watch([], lambda: None) is not None
        assert listener.live.wait(10)
        fired, other = threading.Event(), threading.Event()
        listener.watch([str(job_id)], fired.set)
        listener.watch([str(unwatched)], other.set)
        store.watch_finish(job_ids=[job_id])
        assert watched(database_url, job_id, unwatched) == [True, None]
        with store.engine.begin() as conn:  # a move that finishes nothing
            conn.execute(text("UPDATE taskline.jobs SET priority = 9 WHERE id = :id"),
                         {"id": job_id})
        assert not fired.wait(0.5)
        with signals(database_url) as channel:
            assert drain(database_url).succeeded == 2
            assert received(channel) == [str(job_id)]  # nothing for the unwatched job
        assert fired.wait(10)
        assert not other.is_set()
        assert listener.watching == 1  # a watch fires once; the unwatched job's still waits
        store.watch_finish(job_ids=[unwatched])  # finished already: nothing to flag
        assert watched(database_url, unwatched) == [None]
    finally:
        listener.stop()


def test_a_watched_workflow_signals_as_each_step_finishes(database_url, store):
    steps = [{"id": "a", "job": {"type": "tw.job"}},
             {"id": "b", "job": {"type": "tw.job"}, "after": ["a"]}]
    with psycopg.connect(database_url) as conn:
        wf = taskline.submit_workflow(conn, "w", steps)
        other = taskline.submit_workflow(conn, "w2", steps[:1])
    listener = FinishListener(database_url)
    try:
        fired = threading.Event()
        listener.watch([str(wf)], fired.set)
        assert listener.live.wait(10)
        store.watch_finish(workflow_ids=[wf])
        with signals(database_url) as channel:
            drain(database_url)
            got = received(channel)
        assert fired.wait(10)
        ids = [str(r["id"]) for r in store.workflow_steps_page(wf, None, 10)]
        # Each step's id and its workflow's, at each step's finish; nothing of the unwatched one.
        assert sorted(got) == sorted([*ids, str(wf), str(wf)])
        assert str(other) not in got
    finally:
        listener.stop()


def test_flagging_waits_only_for_a_held_row_and_never_holds_one_meanwhile(database_url,
                                                                          store):
    """A transaction holds step b; flagging the workflow flags a at once and commits, then waits
    for b alone: the holder can take a next without waiting (a flag statement holding a while it
    waited for b would deadlock with a holder that wants a next)."""
    steps = [{"id": "a", "job": {"type": "tw.job"}}, {"id": "b", "job": {"type": "tw.job"}}]
    with psycopg.connect(database_url) as conn:
        wf = taskline.submit_workflow(conn, "w", steps)
    a, b = (uuid.UUID(str(r["id"])) for r in store.workflow_steps_page(wf, None, 10))
    with psycopg.connect(database_url) as holder:
        holder.execute("SET lock_timeout = '5s'")
        holder.execute("UPDATE taskline.jobs SET priority = 5 WHERE id = %s", (b,))
        thread, out = in_thread(store.watch_finish, workflow_ids=[wf])
        wait_for(lambda: watched(database_url, a) == [True], timeout=10)
        assert thread.is_alive() and watched(database_url, b) == [None]  # waits for b's holder
        holder.execute("UPDATE taskline.jobs SET priority = 5 WHERE id = %s", (a,))  # no wait
        holder.commit()
    thread.join(10)
    assert not thread.is_alive() and out == {"value": None}
    assert watched(database_url, a, b) == [True, True]


# --- taskline.wait on a database connection ------------------------------------------------

def test_taskline_wait_returns_the_result_once_the_job_finishes(database_url):
    job_id = commit(database_url, {"n": 7})
    thread, out = in_thread(taskline.wait, database_url, job_id, 30)
    assert not out and thread.is_alive()
    drain(database_url)
    thread.join(30)
    assert out == {"value": {"done": 7}}


def test_taskline_wait_raises_for_dead_and_cancelled_and_times_out(database_url, store):
    dead = commit(database_url, {"fail": "no luck"}, max_retries=0)
    drain(database_url)
    with psycopg.connect(database_url) as conn, pytest.raises(JobFailed) as failed:
        taskline.wait(conn, dead, 5)
    assert (failed.value.error, failed.value.attempts) == ("RuntimeError: no luck", 1)
    assert taskline.wait(database_url, dead, 5, raise_on_failure=False)["status"] == "dead"
    cancelled = commit(database_url, {})
    store.cancel_pending_job(cancelled)
    with pytest.raises(JobCancelled):
        taskline.wait(database_url, cancelled, 5)
    pending = commit(database_url, {})
    with pytest.raises(TimeoutError, match="still queued"):
        taskline.wait(database_url, pending, 0.2)
    with pytest.raises(LookupError):
        taskline.wait(database_url, uuid.uuid4(), 0.2)


# --- wait_s without gunicorn: the request's thread waits -----------------------------------

def test_wait_s_is_checked_and_holds_a_flask_request_until_the_finish(settings, database_url):
    app = create_app(settings)
    try:
        holds_a_flask_request(app, database_url)
    finally:
        close_app(app)


def holds_a_flask_request(app: Any, database_url: str) -> None:
    http = app.test_client()
    for bad in ("31", "-1", "soon", "nan"):
        answer = http.get(f"/api/v1/jobs/{uuid.uuid4()}?wait_s={bad}")
        assert answer.status_code == 400
        assert answer.json["error"]["code"] == "invalid_parameter"
        assert answer.json["error"]["details"] == {"parameter": "wait_s"}
    job_id = commit(database_url, {"n": 2})
    thread, out = in_thread(http.get, f"/api/v1/jobs/{job_id}?wait_s=20")
    listener = app.extensions["taskline_waits"].listener()
    wait_for(lambda: listener.watching == 1, timeout=10, message="the request to wait")
    listener.fire()  # what a reconnection does: the request looks again, and waits on
    wait_for(lambda: listener.watching == 1, timeout=10, message="the request to wait again")
    assert thread.is_alive()
    assert watched(database_url, job_id) == [True]  # flagged before its first read: signalled
    drain(database_url)
    thread.join(10)  # woken by the finishing commit, not by the end of its 20 s
    assert not thread.is_alive() and out["value"].json["status"] == "succeeded"
    assert http.get(f"/api/v1/jobs/{uuid.uuid4()}?wait_s=1").status_code == 404


# --- under gunicorn: waiting requests are held on the event loop ---------------------------

@pytest.fixture
def api_url(settings: Settings, tmp_path: Path) -> Iterator[str]:
    yield from start_api(settings, tmp_path / "logs")


def waiting_now(api_url: str) -> float:
    for line in requests.get(api_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("taskline_api_waiting_requests "):
            return float(line.split()[1])
    return 0.0


def test_more_waiting_requests_than_threads_leave_the_api_answering(api_url, database_url):
    waiters = THREADS * 3
    job_id = commit(database_url, {"n": 3})
    with ThreadPoolExecutor(waiters) as pool:
        answers = [pool.submit(requests.get, f"{api_url}/api/v1/jobs/{job_id}?wait_s=25",
                               timeout=40) for _ in range(waiters)]
        wait_for(lambda: waiting_now(api_url) == waiters, timeout=20,
                 message="every request to wait")
        # Every thread is free: other requests are answered while they wait.
        other = commit(database_url, {"n": 4})
        assert requests.get(f"{api_url}/api/v1/jobs/{other}", timeout=5).json()[
            "status"] == "queued"
        assert not any(a.done() for a in answers)
        drain(database_url, max_jobs=1)
        statuses = {a.result().json()["status"] for a in answers}
    assert statuses == {"succeeded"}
    assert waiting_now(api_url) == 0


def metric(api_url: str, name: str) -> float:
    lines = requests.get(api_url + "/metrics", timeout=5).text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(name))


def raw_answer(sock: socket.socket) -> tuple[dict[str, str], bytes]:
    """One HTTP answer read from `sock`: its headers (lower-case names) and its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    headers = dict(line.decode().lower().split(": ", 1) for line in head.split(b"\r\n")[1:])
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return headers, body


def test_woken_waiters_are_answered_at_once_what_a_read_answers(api_url, database_url):
    ok, bad = commit(database_url, {"n": 11}), commit(database_url, {"fail": "no"}, max_retries=0)
    host, port = api_url.removeprefix("http://").split(":")
    waits = [ok, ok, bad]  # two waiters of one job share its read
    socks = [socket.create_connection((host, int(port))) for _ in waits]
    for sock, job_id in zip(socks, waits, strict=True):
        sock.sendall(f"GET /api/v1/jobs/{job_id}?wait_s=25 HTTP/1.1\r\nHost: {host}\r\n\r\n"
                     .encode())
    wait_for(lambda: waiting_now(api_url) == len(waits), timeout=10, message="the waits")
    burst = metric(api_url, 'taskline_api_woken_answers_total{how="burst"}')
    drain(database_url)
    answers = [raw_answer(sock) for sock in socks]
    for (headers, body), job_id in zip(answers, waits, strict=True):
        read = requests.get(f"{api_url}/api/v1/jobs/{job_id}", timeout=5)
        assert body == read.content
        for name in ("content-type", "referrer-policy"):
            assert headers[name] == read.headers[name]
        assert headers["connection"] == "keep-alive"
    assert [json_status(body) for _, body in answers] == ["succeeded", "succeeded", "dead"]
    # Written without running the requests again, and counted as answers of the route.
    assert metric(api_url, 'taskline_api_woken_answers_total{how="burst"}') == burst + 3
    assert metric(api_url, 'taskline_api_woken_answers_total{how="request"}') == 0
    # The connections are kept alive: their next requests are read and answered.
    for sock, job_id in zip(socks, waits, strict=True):
        sock.sendall(f"GET /api/v1/jobs/{job_id} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert json_status(raw_answer(sock)[1]) in ("succeeded", "dead")
        sock.close()
    assert waiting_now(api_url) == 0


def test_a_woken_waiter_is_answered_under_its_token_scope(settings, tmp_path, database_url):
    tokens = "reader:r-secret:jobs:read,writer:w-secret:jobs:write"
    for url in start_api(settings, tmp_path / "logs", TASKLINE_API_TOKENS=tokens):
        job_id = commit(database_url, {"n": 12})
        wait_url = f"{url}/api/v1/jobs/{job_id}?wait_s=25"
        refused = requests.get(wait_url, headers={"Authorization": "Bearer w-secret"}, timeout=5)
        assert refused.status_code == 403  # at once: a waiter is checked before it waits
        reader = {"Authorization": "Bearer r-secret"}
        waiting, out = in_thread(requests.get, wait_url, headers=reader, timeout=40)
        wait_for(lambda u=url: waiting_now(u) == 1, timeout=10, message="the wait")
        drain(database_url)
        waiting.join(30)
        read = requests.get(f"{url}/api/v1/jobs/{job_id}", headers=reader, timeout=5)
        assert out["value"].content == read.content and read.json()["status"] == "succeeded"
        assert metric(url, 'taskline_api_woken_answers_total{how="burst"}') == 1


def json_status(body: bytes) -> str:
    return str(json.loads(body)["status"])


def test_a_waiting_client_that_leaves_is_forgotten_and_wait_s_ends_a_wait(api_url,
                                                                           database_url):
    job_id = commit(database_url, {"n": 5})
    host, port = api_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"GET /api/v1/jobs/{job_id}?wait_s=25 HTTP/1.1\r\nHost: {host}\r\n\r\n"
                     .encode())
        wait_for(lambda: waiting_now(api_url) == 1, timeout=10, message="the wait")
    wait_for(lambda: waiting_now(api_url) == 0, timeout=10, message="the client forgotten")
    answer = requests.get(f"{api_url}/api/v1/jobs/{job_id}?wait_s=0.3", timeout=10)
    assert answer.json()["status"] == "queued"


def test_a_waiting_request_outlives_its_listeners_reconnection(api_url, database_url):
    job_id = commit(database_url, {"n": 9})
    waiting, out = in_thread(requests.get, f"{api_url}/api/v1/jobs/{job_id}?wait_s=25",
                             timeout=40)
    wait_for(lambda: waiting_now(api_url) == 1, timeout=10, message="the wait")
    with psycopg.connect(database_url, autocommit=True) as conn:
        killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'taskline-finish-listener' "
                              "AND datname = current_database()").fetchall()
    assert killed == [(True,)]
    # The new LISTEN wakes every waiting request: each reads its job, unfinished, and waits on.
    wait_for(lambda: "ended=\"signalled\"" in requests.get(api_url + "/metrics", timeout=5).text,
             timeout=15, message="the reconnection's wake-up")
    wait_for(lambda: waiting_now(api_url) == 1, timeout=10, message="the wait to go on")
    assert waiting.is_alive()
    drain(database_url)
    waiting.join(30)
    assert out["value"].json()["status"] == "succeeded"


def test_client_wait_and_wait_workflow(api_url, database_url):
    ok = commit(database_url, {"n": 6})
    bad = commit(database_url, {"fail": "broken"}, max_retries=0)
    with psycopg.connect(database_url) as conn:
        wf = taskline.submit_workflow(conn, "pair", [
            {"id": "a", "job": {"type": "tw.job", "payload": {"n": 1}}},
            {"id": "b", "job": {"type": "tw.job", "payload": {"fail": "b broke"},
                                "max_retries": 0}, "after": ["a"]}])
    with Client(api_url) as client:
        waiting, out = in_thread(client.wait, ok, timeout=30)
        drain(database_url)
        waiting.join(30)
        assert out == {"value": {"done": 6}}
        with pytest.raises(JobFailed) as failed:
            client.wait(bad, timeout=5)
        assert failed.value.error == "RuntimeError: broken" and failed.value.attempts == 1
        with pytest.raises(JobFailed, match="b broke"):
            client.wait_workflow(wf, timeout=5)
        view = client.wait_workflow(wf, timeout=5, raise_on_failure=False)
        assert view["status"] == "failed"


def test_async_client_wait(api_url, database_url):
    job_id = commit(database_url, {"n": 8})

    async def main() -> Any:
        async with AsyncClient(api_url) as client:
            waiting = asyncio.create_task(client.wait(job_id, timeout=30))
            await asyncio.sleep(0.2)
            await asyncio.to_thread(drain, database_url)
            return await waiting

    assert asyncio.run(main()) == {"done": 8}
