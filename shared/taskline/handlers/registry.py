"""Handler registry: job types mapped to the functions that run them.

A handler is registered with `@handler("send_email")` in a module named by TASKLINE_HANDLERS.
It receives the payload and a `JobContext`; what it returns (JSON-serialisable) becomes the
job's result. It should check `ctx.stopping` in long loops: the flag is set when the job is
cancelled, its lease is lost, its timeout passed or the worker is shutting down.

A periodic job is declared beside it with `@periodic("nightly", cron="0 3 * * *",
job={"type": "report"})`; the maintenance service upserts every declaration at start.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

HandlerFn = Callable[[Any, "JobContext"], Any]

_registry: dict[str, HandlerFn] = {}
_periodic: dict[str, dict[str, Any]] = {}
_EVENTS_LOCK = threading.Lock()
"""Guards the lazy creation of JobContext.stop_event against a concurrent stop request."""
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
        """Each parent step's id -> the result it stored, for a workflow step ({} otherwise).

        Read once, on first use, so a job that never asks (and every plain job) costs nothing.
        Every parent has succeeded before its step runs, and retention keeps every step of an
        unfinished workflow, so each parent is present.
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

    def on_complete(self, hook: Callable[[Any], None]) -> None:
        """Run `hook(connection)` inside the transaction that records this attempt's success.

        The hook's writes commit if and only if the fenced completion commits, which gives
        exactly-once database side effects: a zombie or a re-run never commits them twice.
        """
        self.completion_hooks.append(hook)


def handler(job_type: str) -> Callable[[HandlerFn], HandlerFn]:
    """Register the decorated function as the handler of `job_type`."""
    if not job_type or len(job_type) > 200:
        raise ValueError("a job type is 1..200 characters")

    def register(fn: HandlerFn) -> HandlerFn:
        _registry[job_type] = fn
        return fn

    return register


def periodic(name: str, *, cron: str, job: dict[str, Any], timezone: str = "UTC",
             catch_up: str = "latest", paused: bool = False) -> Callable[[HandlerFn], HandlerFn]:
    """Declare schedule `name` (as PUT /api/v1/schedules/{name} takes it); the decorated
    function is returned unchanged. Checked when maintenance upserts it."""

    def declare(fn: HandlerFn) -> HandlerFn:
        _periodic[name] = {"cron": cron, "job": dict(job), "timezone": timezone,
                           "catch_up": catch_up, "paused": paused}
        return fn

    return declare


def periodic_declarations() -> list[tuple[str, dict[str, Any]]]:
    """The schedules declared with `@periodic` in the modules loaded so far, by name."""
    return sorted((name, dict(spec)) for name, spec in _periodic.items())


def get(job_type: str) -> HandlerFn | None:
    return _registry.get(job_type)


def registered_types() -> list[str]:
    return sorted(_registry)


def load(modules: Iterable[str]) -> list[str]:
    """Import the built-ins and `modules` for their registrations; return the known types."""
    for name in (*BUILTIN_MODULES, *modules):
        importlib.import_module(name)
    return registered_types()
