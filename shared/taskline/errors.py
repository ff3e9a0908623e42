"""The library's exceptions: one base class, the docstring is the default message.

Redis and database errors are translated into these at the boundary, so services handle
"the store is down" without knowing which driver said so. The translation keeps the driver's
error as the cause, and `detail` reads it back for logs: an operator needs "connection
refused" or "database does not exist", not only "unavailable".
"""

from __future__ import annotations

import re
from typing import Any

# Secrets a driver message could echo: a DSN's `password=...` and a URL's `user:pass@`.
_SECRETS = ((re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE), r"\1***"),
            (re.compile(r"(://[^:/@\s]*:)\S*@"), r"\1***@"))


class TasklineError(Exception):
    """A taskline error occurred."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(TasklineError):
    """The configuration is invalid."""


class StoreUnavailable(TasklineError):
    """PostgreSQL cannot be reached."""


class DispatchUnavailable(TasklineError):
    """Redis cannot be reached."""


class IdempotencyConflict(TasklineError):
    """The idempotency key was already used with a different request body."""


class AlreadyStarted(TasklineError):
    """The unique job to replace has started; nothing was written (the API answers 409
    `already_started`)."""

    def __init__(self, job_id: str, status: str, key: str | None) -> None:
        super().__init__(f"unique key {key!r} is held by job {job_id}, which has started "
                         f"({status}): it cannot be replaced")
        self.job_id = job_id
        self.status = status


class NonRetryableError(TasklineError):
    """Raised by a handler: the job goes straight to the dead-letter queue, no retries."""


class RetryableError(TasklineError):
    """Raised by a handler to ask for a retry; `delay_s` overrides the backoff."""

    def __init__(self, message: str | None = None, delay_s: float | None = None) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class Snooze(TasklineError):
    """Raised by a handler: the job goes back to `scheduled` for `delay_s` seconds without
    consuming an attempt (event `snoozed`); past TASKLINE_MAX_SNOOZES snoozes it is dead."""

    MAX_DELAY_S = 365 * 86_400.0

    def __init__(self, delay_s: float) -> None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) \
                or not 0 <= delay_s <= self.MAX_DELAY_S:  # NaN fails this too
            raise TypeError(f"Snooze(delay_s) takes a number of seconds 0..{self.MAX_DELAY_S:.0f}, "
                            f"not {delay_s!r}")
        super().__init__(f"snoozed for {delay_s} s")
        self.delay_s = float(delay_s)


class JobCancelled(TasklineError):
    """The job was cancelled while running (raised by a handler that stops); also what waiting
    for a result raises when the job was cancelled, with `job` the job as the API shows it."""

    def __init__(self, message: str | None = None, job: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.job = job


class JobFailed(TasklineError):
    """Waiting for a result found the job dead (or a workflow failed): `error` is its final
    error, `attempts` the attempts it made, `job` the job (or workflow) as the API shows it."""

    def __init__(self, message: str, job: dict[str, Any], error: str | None = None,
                 attempts: int | None = None) -> None:
        super().__init__(message)
        self.job = job
        self.error = error
        self.attempts = attempts


class InvalidJob(TasklineError, ValueError):
    """The job request has invalid fields (the API answers the same request 422)."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        shown = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        super().__init__(f"invalid job: {shown}" + (" ..." if len(errors) > 5 else ""))
        self.errors = errors
        """Each invalid field as {"field", "message"}, as the API's 422 details list them."""


class QueueLimitReached(InvalidJob):
    """Writing the jobs would make more queues hold unfinished jobs than TASKLINE_MAX_QUEUES
    allows; nothing was written (the API answers 422 `queue_limit`)."""

    def __init__(self, queues: list[str], limit: int) -> None:
        shown = ", ".join(queues[:5]) + (" ..." if len(queues) > 5 else "")
        super().__init__([{"field": "queue", "message": (
            f"more than {limit} queues would hold unfinished jobs (TASKLINE_MAX_QUEUES); "
            f"new queues refused: {shown}")}])
        self.queues = queues
        self.limit = limit


def detail(err: BaseException) -> str:
    """`err`'s message followed by its driver's own (psycopg's or redis-py's), on one line and
    without passwords: what a log says about an outage.

    The message alone stays short on purpose, since it is also what /readyz answers to anyone;
    the driver's message (which names the host and the reason) goes to logs only.
    """
    text = str(err)
    cause = err.__cause__
    driver = getattr(cause, "orig", None) or cause  # SQLAlchemy wraps the driver's error
    if driver is not None and not isinstance(driver, TasklineError):
        said = " ".join(str(driver).split())
        if said and said not in text:
            text = f"{text} ({said})"
    return redact(text)


def redact(text: str) -> str:
    """`text` with any password a connection string or URL in it held replaced by `***`."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text
