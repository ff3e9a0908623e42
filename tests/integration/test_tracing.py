"""Traces from the request that enqueues a job to the worker that runs it, on real PostgreSQL
and Redis.

In-process, with the SDK's InMemorySpanExporter: an enqueue request carrying a W3C
`traceparent` gets an `enqueue` span that is its child, the job stores that span's context,
and every attempt's `claim`, `execute` and `complete` spans are children of it in the same
trace. Tracing off passes the caller's context through to the job and never loads the SDK.
Across processes, `taskline api` and `taskline worker` export their spans over OTLP/HTTP to
OTEL_EXPORTER_OTLP_ENDPOINT, where a receiver in this test decodes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from flask.testing import FlaskClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from taskline import tracing
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.promoter import Promoter
from taskline_producer.app import close_app, create_app
from tests.helpers import service, service_env, wait_for
from tests.integration.worker_handlers import running_worker
from tests.servers import free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
WORKER_SPANS = ("claim", "execute", "complete")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """taskline's spans, kept in memory for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.use(None)
    provider.shutdown()


@pytest.fixture
def client(settings: Settings, store: Store, dispatcher) -> Iterator[FlaskClient]:
    app = create_app(settings, store, dispatcher)
    yield app.test_client()
    close_app(app)


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def hex_id(value: int, digits: int) -> str:
    return f"{value:0{digits}x}"


def stored_traceparent(store: Store, job_id: str) -> str | None:
    text = store.get_job(uuid.UUID(job_id)).trace_context
    return None if text is None else json.loads(text)["traceparent"]


def enqueue(client: FlaskClient, body: dict, traceparent: str | None = TRACEPARENT) -> str:
    headers = {"traceparent": traceparent} if traceparent else {}
    response = client.post("/api/v1/jobs", json=body, headers=headers)
    assert response.status_code == 201, response.get_json()
    return response.get_json()["id"]


def test_the_worker_spans_of_a_job_continue_the_trace_of_its_enqueue_request(
        settings, store, client, spans):
    job_id = enqueue(client, {"type": "echo", "payload": {"n": 1}})

    (enqueue_span,) = named(spans, "enqueue")
    assert hex_id(enqueue_span.context.trace_id, 32) == TRACE_ID
    assert hex_id(enqueue_span.parent.span_id, 16) == CALLER_SPAN
    assert enqueue_span.kind is SpanKind.PRODUCER
    assert enqueue_span.attributes["messaging.message.id"] == job_id
    span_id = hex_id(enqueue_span.context.span_id, 16)
    assert stored_traceparent(store, job_id) == f"00-{TRACE_ID}-{span_id}-01"

    with running_worker(settings):
        wait_for(lambda: named(spans, "complete"), message="the complete span")
    (claim,), (execute,), (complete,) = (named(spans, name) for name in WORKER_SPANS)
    for span in (claim, execute, complete):
        assert span.context.trace_id == enqueue_span.context.trace_id
        assert span.parent.span_id == enqueue_span.context.span_id
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes["messaging.message.id"] == job_id
        assert span.attributes["taskline.job.attempt"] == 1
        assert span.attributes["taskline.worker.id"]
    assert claim.end_time <= execute.start_time
    assert execute.end_time <= complete.start_time <= complete.end_time
    assert complete.attributes["taskline.outcome"] == "succeeded"


def test_every_attempt_of_a_retried_job_lands_in_the_same_trace(settings, store, dispatcher,
                                                                client, spans):
    job_id = enqueue(client, {"type": "simulate", "payload": {"fail_first": 1},
                              "max_retries": 2})
    (enqueue_span,) = named(spans, "enqueue")
    promoter = Promoter(store, dispatcher, settings)

    def both_attempts_recorded() -> bool:
        promoter.run_once()  # no maintenance runs here: promote the retry once it is due
        return len(named(spans, "complete")) == 2

    with running_worker(settings):
        wait_for(both_attempts_recorded, timeout=15, message="two recorded attempts")
    executions = sorted(named(spans, "execute"),
                        key=lambda s: s.attributes["taskline.job.attempt"])
    completions = sorted(named(spans, "complete"), key=lambda s: s.start_time)
    assert [s.attributes["taskline.job.attempt"] for s in executions] == [1, 2]
    assert [s.status.status_code for s in executions] == [StatusCode.ERROR, StatusCode.UNSET]
    assert executions[0].events[0].name == "exception"
    assert [s.attributes["taskline.outcome"] for s in completions] == [
        "retry_scheduled", "succeeded"]
    assert completions[0].status.status_code is StatusCode.ERROR
    for span in [*executions, *completions, *named(spans, "claim")]:
        assert span.context.trace_id == enqueue_span.context.trace_id
        assert span.parent.span_id == enqueue_span.context.span_id
        assert span.attributes["messaging.message.id"] == job_id


def test_a_batch_is_one_enqueue_span_whose_context_every_job_stores(store, client, spans):
    response = client.post("/api/v1/jobs/batch", headers={"traceparent": TRACEPARENT},
                           json={"jobs": [{"type": "echo"}, {"type": "echo"}]})
    assert response.status_code == 201

    (enqueue_span,) = named(spans, "enqueue")
    assert enqueue_span.attributes["messaging.batch.message_count"] == 2
    expected = f"00-{TRACE_ID}-{hex_id(enqueue_span.context.span_id, 16)}-01"
    assert [stored_traceparent(store, j["job"]["id"]) for j in response.get_json()["jobs"]] == [
        expected, expected]


def test_without_a_traceparent_the_enqueue_span_starts_the_trace(settings, store, client, spans):
    job_id = enqueue(client, {"type": "echo"}, traceparent=None)

    (enqueue_span,) = named(spans, "enqueue")
    assert enqueue_span.parent is None
    with running_worker(settings):
        wait_for(lambda: named(spans, "complete"), message="the complete span")
    assert named(spans, "execute")[0].parent.span_id == enqueue_span.context.span_id
    assert stored_traceparent(store, job_id).split("-")[1] == hex_id(
        enqueue_span.context.trace_id, 32)


def test_tracing_off_passes_the_callers_context_through_to_the_job(store, client):
    assert stored_traceparent(store, enqueue(client, {"type": "echo"})) == TRACEPARENT
    assert stored_traceparent(store, enqueue(client, {"type": "echo"}, traceparent=None)) is None
    assert stored_traceparent(store, enqueue(client, {"type": "echo"},
                                             traceparent="00-not-a-trace-01")) is None


def test_tracing_off_never_loads_the_sdk():
    program = ("import sys\n"
               "from taskline import tracing\n"
               "from taskline.settings import Settings\n"
               "assert tracing.setup('worker', Settings()) is False\n"
               "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"


# --- across processes, over OTLP/HTTP --------------------------------------------------------

class OtlpReceiver(ThreadingHTTPServer):
    """Takes OTLP/HTTP protobuf exports; keeps every span as (service, span) for the test."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.paths: list[str] = []
        self.spans: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def named(self, name: str) -> list[tuple[str, object]]:
        with self.lock:
            return [(svc, span) for svc, span in self.spans if span.name == name]


class _OtlpHandler(BaseHTTPRequestHandler):
    server: OtlpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            self.server.paths.append(self.path)
            for resource_spans in request.resource_spans:
                attrs = {a.key: a.value.string_value
                         for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    self.server.spans += [(attrs["service.name"], s) for s in scope.spans]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        """Silent: the test asserts on what was received."""


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    server = OtlpReceiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_api_and_worker_processes_export_one_trace_over_otlp(settings, receiver, tmp_path: Path):
    port = free_port()
    env = service_env(settings, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint + "/",
                      OTEL_BSP_SCHEDULE_DELAY="100")
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "1"], env, tmp_path), \
            service(["worker", "--concurrency", "1"], env, tmp_path):
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url + "/healthz"), timeout=20, message="the api")
        response = requests.post(url + "/api/v1/jobs", json={"type": "echo"},
                                 headers={"traceparent": TRACEPARENT}, timeout=10)
        assert response.status_code == 201
        wait_for(lambda: receiver.named("complete"), timeout=20, message="exported spans")

    assert set(receiver.paths) == {"/v1/traces"}
    ((api, enqueue_span),) = receiver.named("enqueue")
    assert api == "taskline-api"
    assert enqueue_span.trace_id.hex() == TRACE_ID and enqueue_span.parent_span_id.hex() == (
        CALLER_SPAN)
    for name in WORKER_SPANS:
        ((svc, span),) = receiver.named(name)
        assert svc == "taskline-worker"
        assert span.trace_id == enqueue_span.trace_id
        assert span.parent_span_id == enqueue_span.span_id


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False
