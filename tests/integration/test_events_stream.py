"""GET /api/v1/events without a browser: auth, order, replay, heartbeats, bounded clients.

Invariants checked: only committed changes are streamed, in job_events id order even when
transactions commit out of that order, each with its job_events id; a reconnect with
Last-Event-ID gets exactly what it missed (a replayed frame is byte-for-byte the live one); an
idle stream gets heartbeat comments; a client that stops reading is dropped after
`queue_limit` frames instead of growing a buffer; losing PostgreSQL connections loses no event;
a process never opens more than `max_streams` streams.

The app runs in-process under werkzeug's threaded server (real PostgreSQL and Redis) so the
limits can be shortened; test_events_gunicorn.py runs the real `taskline api`.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from flask import Flask
from prometheus_client import REGISTRY
from sqlalchemy import text
from werkzeug.serving import make_server

import taskline
from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_producer.app import close_app, create_app
from taskline_producer.routes import events
from tests.helpers import enqueue, succeed, wait_for
from tests.integration.events_client import SseClient

TOKEN = "stream-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Server:
    port: int
    app: Flask

    def stream(self, path: str = "/api/v1/events", **headers: str) -> SseClient:
        client = SseClient(self.port, path, {**AUTH, **headers})
        assert client.status == 200, client.response.read()
        first = client.next()  # the preamble: reconnection delay and a comment
        assert first.retry == 2000 and first.comments == ["connected"]
        return client

    def streams(self) -> int:
        broadcaster = self.app.extensions[events.EXTENSION].current()
        return broadcaster.streams() if broadcaster is not None else 0


@pytest.fixture
def server(settings: Settings) -> Iterator[Server]:
    app = create_app(settings.replace(api_tokens=(TOKEN,)))  # its own pool: "taskline-api"
    events.set_limits(app, heartbeat_s=0.3, queue_limit=5, max_streams=3, replay_limit=4,
                      poll_s=0.05, gap_wait_s=5.0)
    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield Server(httpd.server_port, app)
    finally:
        close_app(app)  # ends every stream first, so no request thread outlives the test
        httpd.shutdown()
        thread.join(5)


def add_events(store: Store, job_id: uuid.UUID, count: int, event: str = "promoted") -> None:
    """Append `count` events to a job's history in one committed statement."""
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO taskline.job_events (job_id, attempt, event) "
                          "SELECT :id, g, :event FROM generate_series(1, :n) g"),
                     {"id": job_id, "event": event, "n": count})


def test_the_stream_needs_the_token_as_header_or_query(server: Server) -> None:
    for path, headers in (("/api/v1/events", {}), ("/api/v1/events?token=wrong", {}),
                          ("/api/v1/events", {"Authorization": "Bearer wrong"})):
        client = SseClient(server.port, path, headers)
        assert client.status == 401
        assert client.body()["error"]["code"] == "unauthorized"
        assert client.response.getheader("WWW-Authenticate").startswith("Bearer")
        client.close()
    by_query = SseClient(server.port, f"/api/v1/events?token={TOKEN}")
    assert by_query.status == 200
    assert by_query.response.getheader("Content-Type").startswith("text/event-stream")
    by_query.close()
    # Only the stream takes a token in the query: it would end up in logs anywhere else.
    other = SseClient(server.port, f"/api/v1/queues?token={TOKEN}")
    assert other.status == 401
    other.close()


def test_enqueue_claim_success_arrive_in_order_and_rollbacks_never(
        server: Server, store: Store, dispatcher: Dispatcher) -> None:
    client = server.stream()
    job = enqueue(store, dispatcher, "echo", {"n": 1}, priority=7)
    [claimed] = store.claim_jobs([job.id], "worker-a", lease_s=5)
    with pytest.raises(RuntimeError), store.transaction() as conn:
        store.insert_event(conn, job.id, 1, "dead_lettered")
        raise RuntimeError("roll back")
    assert succeed(store, claimed.lease_id, "worker-a", {"ok": True})
    changes = client.jobs(3)
    assert [(c["event"], c["status"]) for c in changes] == [
        ("enqueued", "queued"), ("claimed", "running"), ("succeeded", "succeeded")]
    assert all(c["job_id"] == str(job.id) and c["queue"] == "default" and c["type"] == "echo"
               and c["priority"] == 7 for c in changes)
    assert [c["worker_id"] for c in changes] == [None, "worker-a", "worker-a"]
    ids = [c["id"] for c in changes]
    assert ids == sorted(ids)
    add_events(store, job.id, 1, "restored")  # a marker: nothing rolled back comes before it
    marker = client.next_event().json()
    assert marker["event"] == "restored" and marker["id"] > ids[-1]
    client.close()


def test_last_event_id_replays_what_was_missed_then_goes_live(
        server: Server, store: Store, dispatcher: Dispatcher) -> None:
    first = server.stream()
    job = enqueue(store, dispatcher, "echo")
    add_events(store, job.id, 2)
    seen = [first.next_event() for _ in range(3)]
    first.close()
    add_events(store, job.id, 2, "requeued")  # committed while no stream is open
    again = server.stream(**{"Last-Event-ID": seen[0].id})
    replayed = [again.next_event() for _ in range(4)]
    # The frames both streams carried are identical: replay reads what the trigger sent.
    assert [(m.id, m.data) for m in replayed[:2]] == [(m.id, m.data) for m in seen[1:3]]
    assert [m.json()["event"] for m in replayed[2:]] == ["requeued", "requeued"]
    add_events(store, job.id, 1, "released")
    live = again.next_event().json()
    assert live["event"] == "released" and live["id"] == int(replayed[-1].id) + 1
    again.close()


def test_a_long_absence_replays_the_newest_events_after_a_gap(
        server: Server, store: Store, dispatcher: Dispatcher) -> None:
    job = enqueue(store, dispatcher, "echo")
    add_events(store, job.id, 10)
    client = server.stream(path=f"/api/v1/events?last_event_id=0&token={TOKEN}")
    gap = client.next_event("gap")
    assert gap.json() == {"replayed": 4}
    ids = [int(client.next_event().id) for _ in range(4)]
    # Ids start where the partitions do (migration 0021): enqueued is the first, then ten more.
    first = store.get_history(job.id)[0][0]["id"]
    assert ids == list(range(first + 7, first + 11))  # the newest four
    client.close()
    bad = SseClient(server.port, "/api/v1/events?last_event_id=x", AUTH)
    assert bad.status == 400 and bad.body()["error"]["code"] == "invalid_parameter"


def test_an_idle_stream_gets_heartbeat_comments(server: Server) -> None:
    client = server.stream()
    assert client.next().comments == ["heartbeat"]
    assert client.next().comments == ["heartbeat"]
    client.close()


def drops(reason: str) -> float:
    return REGISTRY.get_sample_value("taskline_event_stream_drops_total",
                                     {"reason": reason}) or 0.0


def test_a_client_that_stops_reading_is_dropped_not_buffered(
        server: Server, store: Store, dispatcher: Dispatcher) -> None:
    job = enqueue(store, dispatcher, "echo")
    before = drops("slow")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(f"GET /api/v1/events?token={TOKEN} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    wait_for(lambda: server.streams() == 1, message="stream open")
    total = 30_000  # ~10 MB of frames: far more than the socket buffers hold
    add_events(store, job.id, total)
    wait_for(lambda: drops("slow") > before, message="slow client dropped")
    received = read_until_closed(sock)
    assert b'event: dropped\ndata: {"reason":"slow"}' in received
    assert received.count(b"\nevent: job\n") < total  # the rest was discarded, not buffered
    wait_for(lambda: server.streams() == 0, message="stream released")


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def test_ids_stream_in_id_order_when_transactions_commit_out_of_it(
        server: Server, store: Store, dispatcher: Dispatcher) -> None:
    job = enqueue(store, dispatcher, "echo")
    client = server.stream()
    slow = store.engine.connect()
    transaction = slow.begin()
    store.insert_event(slow, job.id, 1, "claimed", "worker-slow")  # takes the lower id
    add_events(store, job.id, 1, "cancel_requested")  # commits first, with the higher id
    # Two heartbeats and no event: the committed higher id waits for the lower one.
    assert [client.next().comments for _ in range(2)] == [["heartbeat"], ["heartbeat"]]
    transaction.commit()
    slow.close()
    first, second = client.next_event().json(), client.next_event().json()
    assert (first["event"], second["event"]) == ("claimed", "cancel_requested")
    assert first["id"] < second["id"]
    client.close()


def test_a_rolled_back_id_stops_holding_back_the_ones_after_it(
        server: Server, store: Store, dispatcher: Dispatcher) -> None:
    job = enqueue(store, dispatcher, "echo")
    client = server.stream()
    aborted = store.engine.connect()
    transaction = aborted.begin()
    store.insert_event(aborted, job.id, 1, "dead_lettered")
    add_events(store, job.id, 1, "released")
    assert client.next().comments == ["heartbeat"]
    transaction.rollback()
    aborted.close()
    assert client.next_event().json()["event"] == "released"
    client.close()


def test_lost_database_connections_lose_no_event(
        server: Server, store: Store, dispatcher: Dispatcher) -> None:
    client = server.stream()
    job = enqueue(store, dispatcher, "echo")
    assert client.next_event().json()["event"] == "enqueued"
    with store.transaction() as conn:  # kill the API's pooled connections, the tail's included
        killed = conn.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'taskline-api' AND datname = current_database()"
        )).scalar_one()
    assert killed >= 1
    add_events(store, job.id, 2, "requeued")
    assert [client.next_event().json()["event"] for _ in range(2)] == ["requeued", "requeued"]
    client.close()


def test_a_process_serves_at_most_max_streams(server: Server) -> None:
    open_ = [server.stream() for _ in range(3)]
    refused = SseClient(server.port, "/api/v1/events", AUTH)
    assert refused.status == 503
    assert refused.response.getheader("Retry-After") == "5"
    assert refused.body()["error"]["code"] == "too_many_streams"
    assert SseClient(server.port, "/api/v1/queues", AUTH).status == 200  # others still served
    open_.pop().close()
    # The server notices a closed client when it next writes: a heartbeat, 0.3 s later.
    wait_for(lambda: server.streams() == 2, message="closed stream released")
    server.stream().close()
    for client in open_:
        client.close()


def test_debounce_joins_and_replacements_are_streamed_with_the_state_they_keep(
        server: Server, store: Store) -> None:
    client = server.stream()
    with store.engine.begin() as conn:
        job_id = taskline.enqueue(conn, "echo", 1, debounce={"key": "d", "delay_s": 60})
        taskline.enqueue(conn, "echo", 2, debounce={"key": "d", "delay_s": 60})
        taskline.enqueue(conn, "echo", 3, unique={"key": "u", "on_conflict": "replace"})
        taskline.enqueue(conn, "echo", 4, unique={"key": "u", "on_conflict": "replace"})
    changes = client.jobs(4)
    assert [(c["event"], c["status"]) for c in changes] == [
        ("scheduled", "scheduled"), ("joined", "scheduled"), ("enqueued", "queued"),
        ("replaced", "queued")]
    assert changes[1]["job_id"] == str(job_id)
    client.close()
