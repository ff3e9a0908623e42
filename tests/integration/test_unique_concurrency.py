"""Simultaneous enqueues of one unique key make one job: 50 at once per round, through two
gunicorn API processes and the library (`taskline.enqueue` on psycopg connections), 100
rounds, each round's key new. Every request of a round must name the same job, and the round
must leave exactly one job holding its key; a debounce group likewise makes one job holding
every payload."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
import requests

import taskline
from tests.integration.gunicorn_api import Api, running_api

ROUNDS = 100
AT_ONCE = 50
VIA_LIBRARY = 16  # of the 50; the other 34 go through the two API processes


@pytest.fixture(scope="module")
def api(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with running_api(template_db, tmp_path_factory.mktemp("unique-logs")) as running:
        yield running


def _round(pool: ThreadPoolExecutor, senders: list[Callable[[dict], str]],
           body: Callable[[int], dict]) -> set[str]:
    """Each sender's request (`body(its index)`) sent at once; the job ids answered."""
    start = threading.Barrier(len(senders))

    def send(index: int) -> str:
        start.wait(10)  # released together, so the requests race for the key
        return senders[index](body(index))

    return set(pool.map(send, range(len(senders))))


def _senders(api: Api) -> tuple[list[Callable[[dict], str]], list[psycopg.Connection]]:
    connections = [psycopg.connect(api.database_url) for _ in range(VIA_LIBRARY)]
    sessions = [requests.Session() for _ in range(AT_ONCE - VIA_LIBRARY)]

    def via_library(conn: psycopg.Connection) -> Callable[[dict], str]:
        def send(body: dict) -> str:
            with conn.transaction():
                fields = {k: v for k, v in body.items() if k not in ("type", "payload")}
                return str(taskline.enqueue(conn, body["type"], body.get("payload"), **fields))
        return send

    def via_api(session: requests.Session) -> Callable[[dict], str]:
        def send(body: dict) -> str:
            answer = session.post(api.url("/api/v1/jobs"), json=body, timeout=30)
            assert answer.status_code in (200, 201), answer.text
            return str(answer.json()["id"])
        return send

    return ([via_library(c) for c in connections] + [via_api(s) for s in sessions],
            connections)


def _jobs_holding(api: Api, column: str, key: str) -> list[tuple]:
    with psycopg.connect(api.database_url) as conn:
        return conn.execute(f"SELECT id::text, coalesced FROM taskline.jobs WHERE {column} = %s",
                            (key,)).fetchall()


def test_fifty_at_once_make_one_job_every_round(api: Api) -> None:
    senders, connections = _senders(api)
    try:
        with ThreadPoolExecutor(AT_ONCE) as pool:
            for n in range(ROUNDS):
                key = f"round-{n}"
                ids = _round(pool, senders, lambda i, n=n, key=key: {
                    "type": "echo", "payload": {"round": n, "sender": i},
                    "unique": {"key": key}})
                held = _jobs_holding(api, "unique_key", key)
                assert len(ids) == 1 and [r[0] for r in held] == list(ids), (n, ids, held)
    finally:
        for conn in connections:
            conn.close()


def test_fifty_debounce_arrivals_make_one_job_with_every_payload(api: Api) -> None:
    senders, connections = _senders(api)
    try:
        with ThreadPoolExecutor(AT_ONCE) as pool:
            for n in range(10):
                key = f"group-{n}"
                ids = _round(pool, senders, lambda i, key=key: {
                    "type": "echo", "payload": {"sender": i},
                    "debounce": {"key": key, "delay_s": 60}})
                held = _jobs_holding(api, "debounce_key", key)
                assert len(ids) == 1 and len(held) == 1, (n, ids, held)
                # Every arrival's payload, each once (their order is the lock's order).
                assert sorted(p["sender"] for p in held[0][1]) == list(range(AT_ONCE))
    finally:
        for conn in connections:
            conn.close()


def test_log_dir_has_no_errors(api: Api) -> None:
    logs = "".join(p.read_text() for p in Path(api.log_dir).glob("*.log"))
    assert "internal error" not in logs and "Traceback" not in logs
