"""Idempotency keys per principal, and what a replay may show.

Invariant: with authentication on, a key names one request of one principal (a token's name,
or a JWT's `sub` with its `iss`): another principal's same key is another key, so no answer
ever names, refuses or returns another principal's job or workflow. Keys from the library and
from a deployment without authentication share one scope, stored as given (as before keys were
scoped). A replay is a write's answer, so it shows the job's `result` and `last_error` (a
workflow's steps' `last_error`) only to a principal that may also read jobs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from taskline.access import READ
from taskline.jobs import scoped_key
from taskline_producer.http import auth

Spec = TypeVar("Spec")
REDACTED_JOB_FIELDS = ("result", "last_error")


def scoped(spec: Spec) -> Spec:
    """`spec` (a JobSpec or a WorkflowSpec) with its idempotency, unique and debounce keys in
    the calling principal's scope: another principal's same unique key is another key, and
    its debounce arrivals never join (nor learn of) this principal's job."""
    scope = auth.principal().key_scope
    return spec if scope is None else _in_scope(spec, scope)


def scoped_all(specs: list[Spec]) -> list[Spec]:
    """Each of `specs` as `scoped` makes it, the principal looked up once for the batch."""
    scope = auth.principal().key_scope
    return specs if scope is None else [_in_scope(spec, scope) for spec in specs]


def _in_scope(spec: Spec, scope: str) -> Spec:
    changes: dict[str, Any] = {}
    key = getattr(spec, "idempotency_key", None)
    if key is not None:
        changes["idempotency_key"] = scoped_key(key, scope)
    for field in ("unique", "debounce"):
        value = getattr(spec, field, None)
        if value is not None:
            changes[field] = dataclasses.replace(value, key=scoped_key(value.key, scope))
    return dataclasses.replace(spec, **changes) if changes else spec  # type: ignore


def may_read() -> bool:
    return READ in auth.principal().scopes


def job_answer(shaped: dict[str, Any], created: bool) -> dict[str, Any]:
    """A job's answer to a write: a replay hides what only a reader may see."""
    if created or may_read():
        return shaped
    return {**shaped, **dict.fromkeys(REDACTED_JOB_FIELDS)}


def workflow_answer(shaped: dict[str, Any], created: bool) -> dict[str, Any]:
    """A workflow's answer to a write: a replay hides its steps' errors from a non-reader."""
    if created or may_read() or "steps" not in shaped:
        return shaped
    return {**shaped, "steps": [{**s, "last_error": None} for s in shaped["steps"]]}
