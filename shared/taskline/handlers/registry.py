"""Handler registry: job types mapped to the functions that run them.

A handler is registered with `@handler("send_email")` in a module named by TASKLINE_HANDLERS.
It receives the payload and a `JobContext`; what it returns (JSON-serialisable) becomes the
job's result. `@handler("send_email", payload=Email, queue="mail")` declares the type: the
handler receives a validated `Email`, and the returned Handler enqueues with those defaults
(taskline.handlers.declared). A type has one handler: registering it again from another
function raises at import, naming both modules. A handler should check `ctx.stopping` in long
loops: the flag is set when the job is cancelled, its lease is lost, its timeout passed or the
worker is shutting down.

A periodic job is declared beside it with `@periodic("nightly", cron="0 3 * * *",
job={"type": "report"})`; the maintenance service upserts every declaration at start.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from taskline import progress
from taskline.enqueuing import Priority
from taskline.handlers.declared import Defaults, Handler, check_signature
from taskline.handlers.payloads import PayloadModel

HandlerFn = Callable[[Any, "JobContext"], Any]
P = TypeVar("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

_registry: dict[str, Handler[Any, Any]] = {}
_periodic: dict[str, dict[str, Any]] = {}
_EVENTS_LOCK = threading.Lock()
"""Guards what a JobContext makes on first use (its stop_event, against a concurrent stop
request; its progress reporter, against another thread of the handler reporting)."""
BUILTIN_MODULES = ("taskline.handlers.builtin", "taskline.handlers.webhook")


@dataclass
class JobContext:
    """What a handler knows about the attempt it runs in."""

    job_id: uuid.UUID
    attempt: int
    queue: str
    type: str
    worker_id: str
    completion_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    workflow_id: uuid.UUID | None = None
    """The workflow this job is a step of; None for a plain job."""
    step: str | None = None
    """The step's id within its workflow."""
    load_parent_results: Callable[[], dict[str, Any]] | None = field(default=None, repr=False)
    """Reads the parents' results from PostgreSQL; set by the worker for workflow steps only."""
    payloads: list[Any] = field(default_factory=list, repr=False)
    """What `coalesced` returns; set by the worker from the claimed row."""
    _parent_results: dict[str, Any] | None = field(default=None, repr=False)
    write_progress: Callable[[Any], bool] | None = field(default=None, repr=False)
    """Writes one progress value under the attempt's lease; set by the worker (None: values
    are only kept on the context)."""
    progress_reporter: progress.Reporter | None = field(default=None, repr=False)
    """Paces the writes of `write_progress`: made on the first `progress` call, so a job that
    never reports (most) costs nothing for it; None until then."""
    last_progress: Any = None
    """The last value given to `progress`, validated."""
    _stopped: bool = field(default=False, repr=False)
    _event: threading.Event | None = field(default=None, repr=False)

    @property
    def stopping(self) -> bool:
        """True once the attempt should stop: cancelled, lease lost, timed out or shutdown."""
        return self._stopped

    @property
    def stop_event(self) -> threading.Event:
        """An Event set with `stopping`, for handlers that wait (`ctx.stop_event.wait(s)`).

        Made on first use: most handlers never wait, and an Event per job is a measurable
        share of a busy worker's time.
        """
        with _EVENTS_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._stopped:
                    self._event.set()
            return self._event

    def request_stop(self) -> None:
        """Set `stopping` (and the event, if a handler asked for it)."""
        with _EVENTS_LOCK:
            self._stopped = True
            if self._event is not None:
                self._event.set()

    @property
    def idempotency_key(self) -> str:
        """A key for the handler's side effects, stable across every attempt of this job."""
        return f"taskline:{self.job_id}"

    @property
    def parent_results(self) -> dict[str, Any]:
        """Each parent step's id -> the result it stored, for a workflow step ({} otherwise);
        for a parent that did not succeed (a step with `when`), {"status", "error",
        "attempts"}: its state, last error and attempts when this step read them.

        Read once, on first use, so a job that never asks (and every plain job) costs nothing.
        Retention keeps every step of an unfinished workflow, so each parent is present
        (unless an operator purged a dead one).
        """
        if self._parent_results is None:
            loader = self.load_parent_results
            self._parent_results = {} if loader is None else loader()
        return self._parent_results

    @property
    def coalesced(self) -> list[Any]:
        """Every payload this run covers, in arrival order: for a debounced job, each request
        that joined it (the first included; at most 1,000, or the payload size limit in
        total); for any other job, its one payload."""
        return self.payloads

    def progress(self, value: Any) -> None:
        """Report how far the job is: a number in 0..1 or a JSON object of at most 4 KiB,
        shown as the job's `progress`. Written at most once a second; the last value is
        written before the attempt's outcome. A bad value raises here and writes nothing."""
        self.last_progress = progress.validate(value)
        if self.write_progress is None:
            return
        with _EVENTS_LOCK:  # one reporter even if threads of the handler report at once
            if self.progress_reporter is None:
                self.progress_reporter = progress.Reporter(self.write_progress)
        self.progress_reporter.report(self.last_progress)

    def on_complete(self, hook: Callable[[Any], None]) -> None:
        """Run `hook(connection)` inside the transaction that records this attempt's success.

        The hook's writes commit if and only if the fenced completion commits, which gives
        exactly-once database side effects: a zombie or a re-run never commits them twice.
        """
        self.completion_hooks.append(hook)


@overload
def handler(job_type: str, *, payload: type[P], queue: str | None = None,
            priority: Priority | None = None, max_retries: int | None = None,
            timeout_s: float | None = None,
            ) -> Callable[[Callable[[P, JobContext], R]], Handler[P, R]]: ...


@overload
def handler(job_type: str, *, payload: None = None, queue: str | None = None,
            priority: Priority | None = None, max_retries: int | None = None,
            timeout_s: float | None = None,
            ) -> Callable[[Callable[[Any, JobContext], R]], Handler[Any, R]]: ...


def handler(job_type: str, *, payload: Any = None, queue: str | None = None,
            priority: Priority | None = None, max_retries: int | None = None,
            timeout_s: float | None = None) -> Callable[[Any], Handler[Any, Any]]:
    """Register the decorated function as the handler of `job_type`; `payload` (a pydantic
    model, a dataclass or a TypedDict) declares what its jobs carry, and the other arguments
    its jobs' defaults. Bad arguments raise here, at import, naming the argument."""
    if not isinstance(job_type, str) or not job_type or len(job_type) > 200:
        raise ValueError("a job type is 1..200 characters")
    defaults = Defaults(queue, priority, max_retries, timeout_s)
    defaults.check(job_type)
    model = None if payload is None else PayloadModel(payload)

    def register(fn: Any) -> Handler[Any, Any]:
        if isinstance(fn, Handler):
            fn = fn.fn  # stacked: one function serving several types
        check_signature(job_type, fn)
        declared: Handler[Any, Any] = Handler(job_type, fn, model, defaults)
        _refuse_second(declared)
        _registry[job_type] = declared
        return declared

    return register


def _refuse_second(new: Handler[Any, Any]) -> None:
    """A type registered by another function raises; the same function again (a module
    reloaded) replaces itself."""
    old = _registry.get(new.type)
    if old is not None and (old.module, old.qualname) != (new.module, new.qualname):
        raise ValueError(f"job type {new.type!r} is registered twice: by {old.qualname} in "
                         f"module {old.module} and by {new.qualname} in module {new.module}")


def periodic(name: str, *, cron: str, job: dict[str, Any], timezone: str = "UTC",
             catch_up: str = "latest", paused: bool = False) -> Callable[[F], F]:
    """Declare schedule `name` (as PUT /api/v1/schedules/{name} takes it); the decorated
    function (or Handler) is returned unchanged. Checked when maintenance upserts it."""

    def declare(fn: F) -> F:
        _periodic[name] = {"cron": cron, "job": dict(job), "timezone": timezone,
                           "catch_up": catch_up, "paused": paused}
        return fn

    return declare


def periodic_declarations() -> list[tuple[str, dict[str, Any]]]:
    """The schedules declared with `@periodic` in the modules loaded so far, by name."""
    return sorted((name, dict(spec)) for name, spec in _periodic.items())


def get(job_type: str) -> Handler[Any, Any] | None:
    return _registry.get(job_type)


def declarations() -> list[Handler[Any, Any]]:
    """Every registered handler, by type: what a worker records as the types it serves."""
    return [_registry[t] for t in sorted(_registry)]


def registered_types() -> list[str]:
    return sorted(_registry)


def load(modules: Iterable[str]) -> list[str]:
    """Import the built-ins and `modules` for their registrations; return the known types."""
    for name in (*BUILTIN_MODULES, *modules):
        importlib.import_module(name)
    return registered_types()
