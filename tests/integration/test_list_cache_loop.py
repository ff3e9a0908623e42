"""Repeated workflow lists answered by the event loop (taskline_producer.http.listcache), over
real sockets: a request byte-identical to one answered into the cache is answered at once even
while every list thread is held, with the body and headers a thread gives (Date aside), with
authentication off and for a static token; a JWT's repeats, a token without the scope and
another token's request wait for a list thread like any list; the loop's answers keep the
lane's pace and are counted in the request metrics.

Every list thread is held by list reads of another query, themselves held by an ACCESS
EXCLUSIVE lock on the workflows table that the test takes and then releases.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import jwt
import psycopg
import requests

from tests.integration.gunicorn_api import running_api

HELD = 6  # list reads of another query: more than the two processes' one list thread each
WORKFLOW = {"name": "listed", "steps": [{"id": "a", "job": {"type": "wf.loop"}}]}
HELD_URL = "/api/v1/workflows?limit=7"
SECRET = "an-hs256-secret-of-at-least-32-bytes!"


def test_a_repeated_list_is_answered_on_the_loop(template_db: str, tmp_path: Path):
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_THREADS="1",
                     TASKLINE_API_LIST_CACHE_S="30") as api, requests.Session() as session:
        url = api.url("/api/v1/workflows")
        assert session.post(url, json=WORKFLOW, timeout=10).status_code == 201
        first = session.get(url, timeout=10)  # into the cache, by a thread
        assert first.status_code == 200 and len(first.json()["workflows"]) == 1
        with _lists_held(api.database_url, api.url(HELD_URL)) as held:
            again, took = _timed_get(session, url)  # the same bytes, on the same connection
            assert held.statuses == []  # every list thread is still held
        assert took < 2.0, f"the repeated list waited {took:.1f} s for a list thread"
        assert again.status_code == 200 and again.content == first.content
        assert _headers(again) == _headers(first)
        assert sorted(held.statuses) == [200] * HELD


def test_a_static_tokens_repeats_are_answered_on_the_loop_and_nobody_elses(
        template_db: str, tmp_path: Path):
    reader, other = {"Authorization": "Bearer r-secret"}, {"Authorization": "Bearer o-secret"}
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_THREADS="1",
                     TASKLINE_API_LIST_CACHE_S="30",
                     TASKLINE_API_TOKENS="reader:r-secret:jobs:read,other:o-secret:jobs:read,"
                                         "writer:w-secret:jobs:write") as api, \
            requests.Session() as session:
        url = api.url("/api/v1/workflows")
        first = session.get(url, headers=reader, timeout=10)
        assert first.status_code == 200
        with _lists_held(api.database_url, api.url(HELD_URL), reader) as held:
            again, took = _timed_get(session, url, reader)
            assert held.statuses == [] and took < 2.0, f"waited {took:.1f} s for a list thread"
            assert again.content == first.content and _headers(again) == _headers(first)
            # Another token's request is other bytes: it waits behind the held reads.
            waited = held.answered_later(url, other)
            assert waited == []
        assert waited == [200]


def test_a_jwts_repeats_and_a_refused_token_wait_for_a_thread(template_db: str,
                                                              tmp_path: Path):
    now = int(time.time())
    token = jwt.encode({"sub": "lister", "scope": "jobs:read", "exp": now + 300, "iat": now},
                       SECRET, algorithm="HS256")
    bearer = {"Authorization": f"Bearer {token}"}
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_THREADS="1",
                     TASKLINE_API_LIST_CACHE_S="30", TASKLINE_JWT_KEY=SECRET) as api, \
            requests.Session() as session:
        url = api.url("/api/v1/workflows")
        assert session.get(url, headers=bearer, timeout=10).status_code == 200
        with _lists_held(api.database_url, api.url(HELD_URL), bearer) as held:
            waited = held.answered_later(url, bearer)
            assert waited == []  # no loop answer: Flask checks a JWT's expiry and keys
        assert waited == [200]
        refused = session.get(url, headers={"Authorization": "Bearer nobody"}, timeout=10)
        assert refused.status_code == 401  # never cached, never answered from the cache


def test_the_loops_answers_keep_the_pace_and_are_counted(template_db: str, tmp_path: Path):
    lists = 12
    with running_api(template_db, tmp_path, TASKLINE_API_LIST_RATE="2",
                     TASKLINE_API_LIST_CACHE_S="30") as api, requests.Session() as session:
        url = api.url("/api/v1/workflows")
        before = _counted(api.url("/metrics"))
        started = time.monotonic()
        answers = [session.get(url, timeout=30).status_code for _ in range(lists)]
        took = time.monotonic() - started
        assert answers == [200] * lists
        # One connection, one process: 2 a second after the bucket's 2, so 10 take ~5 s.
        assert took > 3.5, f"{lists} lists took {took:.1f} s at 2 a second"
        assert _counted(api.url("/metrics")) - before == lists  # the loop's answers too


def _counted(metrics_url: str) -> float:
    """The workflow list's 200 answers counted by every API process (merged by the scrape)."""
    text = requests.get(metrics_url, timeout=10).text
    wanted = ('taskline_http_requests_total{method="GET",route="/api/v1/workflows",'
              'status="200"} ')
    return sum(float(line[len(wanted):]) for line in text.splitlines()
               if line.startswith(wanted))


def _timed_get(session: requests.Session, url: str,
               headers: dict[str, str] | None = None) -> tuple[requests.Response, float]:
    started = time.monotonic()
    answer = session.get(url, headers=headers, timeout=10)
    return answer, time.monotonic() - started


class _lists_held:
    """Holds every list thread: HELD list reads of `url`, blocked by a lock on the workflows
    table until the block ends; `statuses` holds theirs once they are answered."""

    def __init__(self, database_url: str, url: str, headers: dict[str, str] | None = None):
        self._lock = psycopg.connect(database_url)
        self._url, self._headers = url, headers or {}
        self.statuses: list[int] = []
        self._threads = [threading.Thread(target=self._get) for _ in range(HELD)]

    def _get(self) -> None:
        self.statuses.append(requests.get(self._url, headers=self._headers,
                                          timeout=60).status_code)

    def answered_later(self, url: str, headers: dict[str, str]) -> list[int]:
        """Start a list of `url` on a thread and give it 2 s; the list holds its status once
        answered (the block's end waits for it)."""
        answered: list[int] = []

        def get() -> None:
            answered.append(requests.get(url, headers=headers, timeout=60).status_code)

        self._threads.append(threading.Thread(target=get))
        self._threads[-1].start()
        time.sleep(2.0)  # a loop answer takes milliseconds; a waiting one, until the block ends
        return answered

    def __enter__(self) -> _lists_held:
        self._lock.execute("LOCK TABLE taskline.workflows IN ACCESS EXCLUSIVE MODE")
        for thread in self._threads:
            thread.start()
        time.sleep(1.0)  # every held read has arrived: running (blocked) or waiting for a slot
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.rollback()
        self._lock.close()
        for thread in self._threads:
            thread.join(timeout=60)


def _headers(answer: requests.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in answer.headers.items() if k.lower() != "date"}
