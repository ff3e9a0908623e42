"""Enqueue quotas at the API: a request's jobs are taken from its client's quota before any is
written (taskline.quota decides, across every API process, in Redis).

Invariant: a request over its client's quota is answered 429 with Retry-After and the error
shape, and nothing of it is written; a batch counts its jobs and is taken or refused whole.
Idempotent replays count too: whether a job is new is known only after it is written.
"""

from __future__ import annotations

from taskline.quota import Decision
from taskline_producer.http.auth import principal
from taskline_producer.operations.backends import backends
from taskline_producer.schemas.errors import ApiError


class QuotaExceeded(ApiError):
    """This client's enqueue quota is used up for now."""

    status = 429
    code = "quota_exceeded"


def take(jobs: int) -> None:
    """Take `jobs` from the calling client's quota, or raise QuotaExceeded."""
    quotas = backends().quotas
    if quotas is None:
        return
    client = principal().name
    decision = quotas.take(client, jobs)
    if not decision.taken:
        raise _refusal(client or "", quotas.quotas[client or ""], jobs, decision)


def _refusal(client: str, quota: object, jobs: int, decision: Decision) -> QuotaExceeded:
    details = {"client": client, "quota": str(quota), "jobs": jobs,
               "retry_after_s": round(decision.retry_after_s, 3)}
    if decision.too_large:
        message = (f"{jobs} jobs in one request exceed the quota of {quota} of {client!r}; "
                   "send them in smaller batches")
    else:
        message = f"the enqueue quota of {quota} of {client!r} is used up; retry later"
    return QuotaExceeded(message, details, {"Retry-After": decision.retry_after_header})
