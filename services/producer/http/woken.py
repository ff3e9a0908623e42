"""Answers to the woken waiters of GET /api/v1/jobs/{id}?wait_s (taskline_producer.http.waiting),
written without running their requests again.

A burst of finishing jobs wakes all their waiters at once. Running each request again took a
request thread about 1.5 ms, so 1,000 waiters on one API waited up to a second for their answer
(docs/performance.md). Here the jobs of every waiter woken together are read in one transaction
(Store.finished_with_history) and each answer is rendered from its rows.

Invariant: an answer holds the body and the headers the route answers (shapes.job_detail
through the app's JSON encoder, auth.answer_headers) and is given only after the route's scope
check, made again as a run of the request would make it; a waiter whose job is not finished
after all (a listener's reconnection woke it) or whose token no longer passes gets None, and
its request is run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flask import Flask

from taskline_producer.http import auth
from taskline_producer.http.waiting import Reply
from taskline_producer.schemas import shapes


@dataclass(frozen=True)
class Answer:
    """A 200 answer: its body and its headers (Content-Type and Content-Length included)."""

    body: bytes
    headers: list[tuple[str, str]]


def answers(app: Flask, replies: Sequence[Reply]) -> list[Answer | None]:
    """The answer of each of `replies`, in order (None: run its request again)."""
    allowed = [auth.still_allowed(app, r.token, r.endpoint) for r in replies]
    ids = sorted({r.job_id for r, ok in zip(replies, allowed, strict=True) if ok})
    store = app.extensions["taskline"].store
    found = {str(job_id): rows for job_id, rows in store.finished_with_history(ids).items()}
    rendered: dict[str, Answer] = {}
    out: list[Answer | None] = []
    for reply, ok in zip(replies, allowed, strict=True):
        rows = found.get(reply.job_id) if ok else None
        if rows is None:
            out.append(None)
            continue
        key = reply.job_id + reply.path  # several waiters of one job share its answer
        if key not in rendered:
            rendered[key] = _render(app, shapes.job_detail(*rows), reply.path)
        out.append(rendered[key])
    return out


def _render(app: Flask, view: Any, path: str) -> Answer:
    response = app.json.response(view)
    headers = [*response.headers.items(), *auth.answer_headers(path)]
    return Answer(response.get_data(), headers)
