"""A registered handler: the function, its declared payload type and the type's defaults.

`@handler("send_receipt", payload=Receipt, queue="receipts")` returns a `Handler`: calling it
calls the function; `.enqueue(conn, payload, ...)` / `.aenqueue(...)` validate the payload
into `Receipt` and enqueue it with the type's defaults (`queue`, `priority`, `max_retries`,
`timeout_s`; a keyword given at the call wins) before anything is written; the worker calls
`.run(payload, ctx)`, which hands the function a validated `Receipt`. For an `async def`
function `.run` returns the coroutine, which the worker awaits on its event loop.

Invariant: a job of a declared type reaches its function only as a valid instance; one whose
stored payload no longer fits (enqueued under an older schema, or past an API that had not yet
heard of this one) fails as InvalidPayload, not retried, with each bad field named.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from taskline.enqueuing import (
    DebounceOptions,
    Priority,
    UniqueOptions,
    aenqueue,
    enqueue,
    given,
)
from taskline.errors import InvalidJob, NonRetryableError
from taskline.handlers.payloads import PayloadModel
from taskline.jobspec import parse_job
from taskline.settings import Settings

if TYPE_CHECKING:
    from taskline.handlers.registry import JobContext
    from taskline.store.caller import AppConnection, AsyncAppConnection

P = TypeVar("P")
R = TypeVar("R")
_DEFAULT_QUEUE = "default"


class InvalidPayload(NonRetryableError):
    """The job's stored payload does not validate as its type's declared payload."""


@dataclass(frozen=True)
class Defaults:
    """What `@handler` declared for its type's jobs; None: the engine's own default."""

    queue: str | None = None
    priority: Priority | None = None
    max_retries: int | None = None
    timeout_s: float | None = None

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}

    def check(self, job_type: str) -> None:
        """ValueError naming the `@handler` argument the API would refuse."""
        parsed = parse_job({"type": job_type, **self.fields()}, Settings())
        if isinstance(parsed, list):
            shown = "; ".join(f"{e.field}={getattr(self, e.field, None)!r}: {e.message}"
                              for e in parsed)
            raise ValueError(f"@handler({job_type!r}): {shown}")


class Handler(Generic[P, R]):
    """The handler of one job type; called like the function it wraps."""

    def __init__(self, job_type: str, fn: Callable[[P, JobContext], R],
                 model: PayloadModel[P] | None, defaults: Defaults) -> None:
        # First, so that nothing copied from the function's own __dict__ hides what follows.
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self.type = job_type
        self.fn = fn
        self.model = model
        self.defaults = defaults
        self.module: str = getattr(fn, "__module__", None) or "?"
        self.qualname: str = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self.is_async = inspect.iscoroutinefunction(fn)
        """An `async def` handler: `run` returns a coroutine, which the worker runs on its
        event loop (taskline.execution.eventloop) instead of a pool thread."""

    def __call__(self, payload: P, ctx: JobContext) -> R:
        return self.fn(payload, ctx)

    def run(self, payload: Any, ctx: JobContext) -> R:
        """The worker's call: the stored payload validated into the declared type, then the
        function. Undeclared types pass the payload as it is, at no cost."""
        if self.model is None:
            return self.fn(payload, ctx)
        try:
            value = self.model.validate(payload)
        except InvalidJob as err:
            raise InvalidPayload(f"payload does not fit {self.type}: {err.errors}") from None
        return self.fn(value, ctx)

    @property
    def queue(self) -> str:
        return self.defaults.queue or _DEFAULT_QUEUE

    @property
    def schema(self) -> dict[str, Any] | None:
        """The payload's JSON Schema; None when any JSON payload is accepted."""
        return None if self.model is None else self.model.schema

    def enqueue(self, conn: AppConnection, payload: P, *, queue: str | None = None,
                priority: Priority | None = None, max_retries: int | None = None,
                timeout_s: float | None = None, delay_s: float | None = None,
                run_at: datetime | str | None = None, idempotency_key: str | None = None,
                limit_key: str | None = None, unique: UniqueOptions | None = None,
                debounce: DebounceOptions | None = None, ordering_key: str | None = None,
                tags: Sequence[str] | None = None, expires_at: datetime | str | None = None,
                start_within_s: float | None = None,
                settings: Settings | None = None) -> uuid.UUID:
        """Validate `payload`, then `taskline.enqueue` it with this type's defaults inside
        `conn`'s transaction; InvalidJob naming the field, before anything is written."""
        fields = given(queue=queue, priority=priority, max_retries=max_retries,
                       timeout_s=timeout_s, delay_s=delay_s, run_at=run_at,
                       idempotency_key=idempotency_key, limit_key=limit_key,
                       unique=unique, debounce=debounce, ordering_key=ordering_key,
                       tags=tags, expires_at=expires_at, start_within_s=start_within_s)
        return enqueue(conn, self.type, self._json(payload), settings=settings,
                       **{**self.defaults.fields(), **fields})

    async def aenqueue(self, conn: AsyncAppConnection, payload: P, *, queue: str | None = None,
                       priority: Priority | None = None, max_retries: int | None = None,
                       timeout_s: float | None = None, delay_s: float | None = None,
                       run_at: datetime | str | None = None, idempotency_key: str | None = None,
                       limit_key: str | None = None, unique: UniqueOptions | None = None,
                       debounce: DebounceOptions | None = None,
                       ordering_key: str | None = None, tags: Sequence[str] | None = None,
                       expires_at: datetime | str | None = None,
                       start_within_s: float | None = None,
                       settings: Settings | None = None) -> uuid.UUID:
        """`enqueue` on an async connection, awaited."""
        fields = given(queue=queue, priority=priority, max_retries=max_retries,
                       timeout_s=timeout_s, delay_s=delay_s, run_at=run_at,
                       idempotency_key=idempotency_key, limit_key=limit_key,
                       unique=unique, debounce=debounce, ordering_key=ordering_key,
                       tags=tags, expires_at=expires_at, start_within_s=start_within_s)
        return await aenqueue(conn, self.type, self._json(payload), settings=settings,
                              **{**self.defaults.fields(), **fields})

    def _json(self, payload: Any) -> Any:
        return payload if self.model is None else self.model.dump(payload)


def check_signature(job_type: str, fn: Callable[..., Any]) -> None:
    """TypeError unless `fn` can be called as fn(payload, ctx): refused at registration, not
    found at run time and retried like any error."""
    if not callable(fn):
        raise TypeError(f"@handler({job_type!r}) decorates {fn!r}, which is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check
    try:
        signature.bind(None, None)
    except TypeError as err:
        raise TypeError(f"@handler({job_type!r}): {getattr(fn, '__qualname__', fn)}"
                        f"{signature} cannot be called as (payload, ctx): {err}") from None
