"""The library's exceptions: one base class, the docstring is the default message.

Redis and database errors are translated into these at the boundary, so services handle
"the store is down" without knowing which driver said so.
"""

from __future__ import annotations


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


class NonRetryableError(TasklineError):
    """Raised by a handler: the job goes straight to the dead-letter queue, no retries."""


class RetryableError(TasklineError):
    """Raised by a handler to ask for a retry; `delay_s` overrides the backoff."""

    def __init__(self, message: str | None = None, delay_s: float | None = None) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class JobCancelled(TasklineError):
    """The job was cancelled while running."""


class InvalidJob(TasklineError, ValueError):
    """The job request has invalid fields (the API answers the same request 422)."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        shown = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        super().__init__(f"invalid job: {shown}" + (" ..." if len(errors) > 5 else ""))
        self.errors = errors
        """Each invalid field as {"field", "message"}, as the API's 422 details list them."""
