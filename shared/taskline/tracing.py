"""Traces: the W3C trace context of the request that enqueues a job, carried to the worker
that runs it.

Invariant: a job's trace context is the W3C `traceparent` (and `tracestate`) of the span that
enqueued it, written with the job (`jobs.trace_context`) in the transaction that accepts it, so
every attempt's `claim`, `execute` and `complete` spans are children of that `enqueue` span,
whichever worker runs the attempt and however long after. The `enqueue` span is a child of the
request's own `traceparent` when it sent one. A job stored without a context (accepted with
neither a `traceparent` nor tracing on in the API) has no worker spans.

Tracing is off unless `Settings.otlp_endpoint` is set. Off, spans go to the OpenTelemetry API's
no-op tracer, the SDK is never imported and the worker skips its spans entirely; the API still
passes an incoming `traceparent` through to the job, so workers that trace join the caller's
trace. On, `setup` installs an SDK provider that batches spans to `<endpoint>/v1/traces` over
OTLP/HTTP from a background thread, once per process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from taskline.jobs import Job
from taskline.settings import Settings

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
"""Where OTLP/HTTP takes spans, below the base URL OTEL_EXPORTER_OTLP_ENDPOINT names."""
INSTRUMENTATION = "taskline"

_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP = trace.NoOpTracer()


class _State:
    """The tracer taskline's spans go to, and whether `setup` installed an exporter."""

    tracer: trace.Tracer = _NOOP
    exporting = False


def setup(service: str, settings: Settings) -> bool:
    """Export this process's spans over OTLP/HTTP when `settings.otlp_endpoint` is set.

    Returns whether spans are exported. Call once per process, after any fork (gunicorn calls
    it in each worker process); later calls change nothing.
    """
    if _State.exporting or not settings.otlp_endpoint:
        return _State.exporting
    # Imported here: a process that does not trace never loads the SDK, which a light install
    # (no `otel` extra) does not have; tracing is no reason to stop running jobs.
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as err:
        log.error("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not "
                  "installed (pip install 'taskline[otel]'): running untraced",
                  extra={"action": "start", "error": str(err)})
        return False

    provider = TracerProvider(resource=Resource.create({"service.name": f"taskline-{service}"}))
    exporter = OTLPSpanExporter(endpoint=traces_url(settings.otlp_endpoint))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    # Also the global provider, so spans a handler makes with the OpenTelemetry API nest under
    # the `execute` span and are exported with it.
    trace.set_tracer_provider(provider)
    use(provider)
    _State.exporting = True
    return True


def use(provider: trace.TracerProvider | None) -> None:
    """Send taskline's spans to `provider`, or to the no-op tracer (None).

    `setup` calls it; tests call it with an SDK provider and an in-memory exporter.
    """
    _State.tracer = _NOOP if provider is None else provider.get_tracer(INSTRUMENTATION)


def traces_url(endpoint: str) -> str:
    """The traces URL below an OTLP/HTTP base URL, as OTEL_EXPORTER_OTLP_ENDPOINT defines it."""
    return endpoint.rstrip("/") + TRACES_PATH


def job_attributes(job: Job, worker_id: str | None = None) -> dict[str, Any]:
    """Span attributes naming one job (OpenTelemetry messaging conventions where they fit)."""
    attributes: dict[str, Any] = {
        "messaging.system": "taskline", "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id), "taskline.job.type": job.type,
        "taskline.job.attempt": job.attempts}
    if worker_id is not None:
        attributes["taskline.worker.id"] = worker_id
    return attributes


# --- producer --------------------------------------------------------------------------------

@contextmanager
def enqueue(headers: Mapping[str, str]) -> Iterator[str | None]:
    """The `enqueue` span (kind producer), a child of the request's W3C trace context.

    Yields the trace context to store with the jobs accepted inside it (None: no trace).
    """
    parent = _PROPAGATOR.extract(headers)
    with _State.tracer.start_as_current_span("enqueue", context=parent, kind=SpanKind.PRODUCER):
        yield stored_context()


def accepted(jobs: Sequence[Job]) -> None:
    """Describe the current `enqueue` span by the jobs it accepted."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("messaging.batch.message_count", len(jobs))
    if len(jobs) == 1:
        span.set_attributes(job_attributes(jobs[0]))


def stored_context() -> str | None:
    """The current span's W3C headers as a job stores them (a JSON object), or None."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else None


# --- worker ----------------------------------------------------------------------------------

def record(name: str, job: Job, worker_id: str, start_ns: int, end_ns: int,
           error: str | None = None, **attributes: Any) -> None:
    """A finished span `name` (claim, complete) of the job's current attempt, with its times
    (time.time_ns()); `error` marks it failed. Nothing when off or the job has no trace."""
    parent = _parent(job)
    if parent is None:
        return
    span = _State.tracer.start_span(name, context=parent, kind=SpanKind.CONSUMER,
                                    attributes={**job_attributes(job, worker_id), **attributes},
                                    start_time=start_ns)
    if error is not None:
        span.set_status(StatusCode.ERROR, error)
    span.end(end_time=end_ns)


@contextmanager
def execute(job: Job, worker_id: str) -> Iterator[None]:
    """The `execute` span around a handler call, current on its thread while the handler runs;
    an exception the handler raises is recorded on it and propagates unchanged."""
    parent = _parent(job)
    if parent is None:
        yield
        return
    with _State.tracer.start_as_current_span("execute", context=parent, kind=SpanKind.CONSUMER,
                                             attributes=job_attributes(job, worker_id)):
        yield


def _parent(job: Job) -> Context | None:
    """The context the job's spans are children of; None when off or the job has none."""
    if _State.tracer is _NOOP or not job.trace_context:
        return None
    try:
        carrier = json.loads(job.trace_context)
    except ValueError:
        return None
    if not isinstance(carrier, dict):
        return None
    context = _PROPAGATOR.extract({k: v for k, v in carrier.items() if isinstance(v, str)})
    return context if trace.get_current_span(context).get_span_context().is_valid else None
