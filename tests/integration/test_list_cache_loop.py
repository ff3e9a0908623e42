"""Repeated workflow lists answered by the event loop (taskline_producer.http.listcache), over
real sockets: with authentication off, a request byte-identical to one answered into the cache
is answered at once even while every list thread is held, with the body and headers a thread
gives (Date aside); with authentication on, it waits for a list thread like any list.

Every list thread is held by list reads of another query, themselves held by an ACCESS
EXCLUSIVE lock on the workflows table that the test takes and then releases.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import requests

from tests.integration.gunicorn_api import running_api

HELD = 6  # list reads of another query: more than the two processes' one list thread each
WORKFLOW = {"name": "listed", "steps": [{"id": "a", "job": {"type": "wf.loop"}}]}


def test_a_repeated_list_is_answered_on_the_loop(template_db: str, tmp_path: Path):
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_THREADS="1",
                     TASKLINE_API_LIST_CACHE_S="30") as api, requests.Session() as session:
        url = api.url("/api/v1/workflows")
        assert session.post(url, json=WORKFLOW, timeout=10).status_code == 201
        first = session.get(url, timeout=10)  # into the cache, by a thread
        assert first.status_code == 200 and len(first.json()["workflows"]) == 1
        with _lists_held(api.database_url, api.url("/api/v1/workflows?limit=7")) as held:
            started = time.monotonic()
            again = session.get(url, timeout=10)  # the same bytes, on the same connection
            took = time.monotonic() - started
            assert held == []  # every list thread is still held
        assert took < 2.0, f"the repeated list waited {took:.1f} s for a list thread"
        assert again.status_code == 200 and again.content == first.content
        assert _headers(again) == _headers(first)
        assert sorted(held) == [200] * HELD


def test_with_authentication_on_lists_wait_for_a_thread(template_db: str, tmp_path: Path):
    token = {"Authorization": "Bearer r-secret"}
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_THREADS="1",
                     TASKLINE_API_LIST_CACHE_S="30",
                     TASKLINE_API_TOKENS="reader:r-secret:jobs:read") as api, \
            requests.Session() as session:
        url = api.url("/api/v1/workflows")
        assert session.get(url, headers=token, timeout=10).status_code == 200
        answered: list[int] = []
        with _lists_held(api.database_url, api.url("/api/v1/workflows?limit=7"), token):
            again = threading.Thread(target=lambda: answered.append(
                session.get(url, headers=token, timeout=30).status_code))
            again.start()
            time.sleep(2.0)
            assert answered == []  # it waits behind the held list reads: no loop answer
        again.join(timeout=30)
        assert answered == [200]


class _lists_held:
    """Holds every list thread: HELD list reads of `url`, blocked by a lock on the workflows
    table until the block ends; the list is their statuses once they are answered."""

    def __init__(self, database_url: str, url: str, headers: dict[str, str] | None = None):
        self._lock = psycopg.connect(database_url)
        self._url, self._headers = url, headers or {}
        self.statuses: list[int] = []
        self._threads = [threading.Thread(target=self._get) for _ in range(HELD)]

    def _get(self) -> None:
        self.statuses.append(requests.get(self._url, headers=self._headers,
                                          timeout=60).status_code)

    def __enter__(self) -> list[int]:
        self._lock.execute("LOCK TABLE taskline.workflows IN ACCESS EXCLUSIVE MODE")
        for thread in self._threads:
            thread.start()
        time.sleep(1.0)  # every held read has arrived: running (blocked) or waiting for a slot
        return self.statuses

    def __exit__(self, *exc: object) -> None:
        self._lock.rollback()
        self._lock.close()
        for thread in self._threads:
            thread.join(timeout=60)


def _headers(answer: requests.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in answer.headers.items() if k.lower() != "date"}
