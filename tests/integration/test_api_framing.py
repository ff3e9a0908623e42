"""The API under gunicorn against clients that break HTTP/1.1 framing, stall, or reuse their
connection after an early answer, over raw sockets.

Invariant checked: broken framing (bad chunk sizes, chunks longer than declared, a missing CRLF,
a body shorter than its Content-Length, codings other than chunked) is answered in the error
shape with `Connection: close` and creates nothing; an answer given without reading the whole
body closes the connection, so a pooled client's next request goes on a new one and is answered;
a connection that misses its header or body deadline gets 408 and is closed; and 1,000 slow or
half-open connections leave normal requests answered within 2 s.
"""

from __future__ import annotations

import json
import socket
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from tests.helpers import wait_for
from tests.integration.gunicorn_api import Api, running_api

pytestmark = pytest.mark.slow

TOKEN = "framing-token"
LIMIT = 4096
DEADLINE_S = 6.0
AUTH = f"Authorization: Bearer {TOKEN}\r\n"


@pytest.fixture(scope="module")
def api(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One `taskline api` (2 processes) for the module: a 4 KiB body limit, a token, 6 s
    header and body deadlines, and `t`, the Host these raw requests name, as a name it
    answers to."""
    with running_api(template_db, tmp_path_factory.mktemp("framing-logs"),
                     TASKLINE_MAX_PAYLOAD_BYTES=str(LIMIT), TASKLINE_API_TOKENS=TOKEN,
                     TASKLINE_ALLOWED_HOSTS="t",
                     TASKLINE_HTTP_HEADER_TIMEOUT_S=str(DEADLINE_S),
                     TASKLINE_HTTP_BODY_TIMEOUT_S=str(DEADLINE_S)) as running:
        yield running


def connect(api: Api) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=10)
    return sock


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error_code(self) -> str:
        return json.loads(self.body)["error"]["code"]


_UNREAD: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()
"""Bytes received past the last answer read off a socket: two answers can arrive in one
segment, and the second must not be lost with the first's read."""


def read_answer(sock: socket.socket) -> Answer:
    """One response read off `sock` (Content-Length framed, as every API answer here is)."""
    data = _UNREAD.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without a (whole) response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = 0 if status == 100 else int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response body"
        body += chunk
    _UNREAD[sock] = body[length:]
    if status == 100:  # the final response follows
        return read_answer(sock)
    return Answer(status, headers, body[:length])


def closed_by_server(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the server closes `sock` (EOF, or a reset) within `timeout`; what it sends
    before (a 408) is read and dropped."""
    end = time.monotonic() + timeout
    try:
        while (left := end - time.monotonic()) > 0:
            sock.settimeout(left)
            if sock.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        pass
    return False


def exchange(api: Api, raw: bytes, half_close: bool = False) -> tuple[Answer, bool]:
    """Send `raw` on a new connection; the answer, and whether the server then closed it."""
    with connect(api) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = read_answer(sock)
        return answer, closed_by_server(sock)


def chunked_post(path: str, chunks: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\n{AUTH}Content-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks


JOB = b'{"type": "echo"}'
BROKEN_CHUNKS = {
    "letters": b"zz\r\n" + JOB + b"\r\n0\r\n\r\n",
    "negative": b"-5\r\n" + JOB + b"\r\n0\r\n\r\n",
    "hex prefix": b"0x10\r\n" + JOB + b"\r\n0\r\n\r\n",
    "longer than declared": b"5\r\n" + JOB + b"\r\n0\r\n\r\n",
    "missing CRLF": b"10\r\n" + JOB + b"0\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(BROKEN_CHUNKS))
@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/jobs/batch", "/healthz"])
def test_broken_chunked_framing_is_a_400_that_closes(api: Api, name: str, path: str) -> None:
    before = api.jobs()
    answer, closed = exchange(api, chunked_post(path, BROKEN_CHUNKS[name]))
    assert answer.status == 400 and answer.error_code() == "invalid_framing"
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["connection"] == "close" and closed
    assert api.jobs() == before


def test_a_chunk_size_with_trailing_space_is_refused_where_the_body_is_read(api: Api) -> None:
    before = api.jobs()
    raw = chunked_post("/api/v1/jobs", b"10 \r\n" + JOB + b"\r\n0\r\n\r\n")
    answer, closed = exchange(api, raw)
    assert answer.status == 400 and answer.error_code() == "invalid_framing"
    assert answer.headers["connection"] == "close" and closed
    assert api.jobs() == before


def test_gzip_then_chunked_is_501(api: Api) -> None:
    raw = (f"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\n{AUTH}Content-Type: application/json\r\n"
           "Transfer-Encoding: gzip, chunked\r\n\r\n10\r\n").encode() + JOB + b"\r\n0\r\n\r\n"
    answer, closed = exchange(api, raw)
    assert answer.status == 501 and answer.error_code() == "not_implemented" and closed


def test_content_length_with_transfer_encoding_is_refused(api: Api) -> None:
    raw = (f"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\n{AUTH}Content-Type: application/json\r\n"
           "Content-Length: 16\r\nTransfer-Encoding: chunked\r\n\r\n").encode() + JOB
    answer, closed = exchange(api, raw)
    assert answer.status == 400 and answer.error_code() == "invalid_framing" and closed


def test_a_body_shorter_than_its_content_length_creates_nothing(api: Api) -> None:
    before = api.jobs()
    raw = (f"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\n{AUTH}Content-Type: application/json\r\n"
           "Content-Length: 100\r\n\r\n").encode() + JOB
    answer, _ = exchange(api, raw, half_close=True)
    assert answer.status == 400 and answer.error_code() == "invalid_framing"
    assert api.jobs() == before


@pytest.mark.parametrize("raw", [
    "GET /" + "a" * 9000 + " HTTP/1.1\r\nHost: t\r\n\r\n",  # request line past 8190
    "GET /healthz HTTP/1.1\r\nHost: t\r\n" + "".join(f"X-{i}: v\r\n" for i in range(120)) + "\r\n",
    "GET /healthz HTTP/1.1\r\nHost: t\r\nX: " + "v" * 70000 + "\r\n\r\n",
    "GET /healthz HTTP/1.1\r\nHost t\r\n\r\n",
], ids=["long-line", "many-fields", "huge-head", "no-colon"])
def test_errors_of_the_http_layer_are_in_the_error_shape(api: Api, raw: str) -> None:
    answer, closed = exchange(api, raw.encode())
    assert answer.status in (400, 414, 431)
    assert answer.headers["content-type"] == "application/json"
    assert answer.error_code() in ("invalid_framing", "uri_too_long", "headers_too_large")
    assert closed


def test_expect_continue_gets_one_100_then_the_answer(api: Api) -> None:
    with connect(api) as sock:
        sock.sendall((f"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\n{AUTH}"
                      "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                      f"Content-Length: {len(JOB)}\r\n\r\n").encode())
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(JOB)
        assert read_answer(sock).status == 201


# --- a client that reuses its connection after an early answer ---------------------------

def test_pooled_client_after_413_415_401_and_400(api: Api) -> None:
    """Each early answer either reads the body (keeps the connection) or says close; either
    way the same Session's next request is answered."""
    session = requests.Session()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    big = json.dumps({"type": "echo", "payload": "x" * (LIMIT * 4)})
    early = [
        lambda: session.post(api.url("/api/v1/jobs"), data=big, timeout=10,
                             headers={**auth, "Content-Type": "application/json"}),
        lambda: session.post(api.url("/api/v1/jobs"), data=iter([big.encode()]), timeout=10,
                             headers={**auth, "Content-Type": "application/json"}),
        lambda: session.post(api.url("/api/v1/jobs"), data=big, timeout=10,
                             headers={"Content-Type": "application/json"}),
        lambda: session.post(api.url("/api/v1/jobs"), data="x" * 100, timeout=10,
                             headers={**auth, "Content-Type": "text/plain"}),
        lambda: session.post(api.url("/api/v1/jobs"), data=JOB, timeout=10,
                             headers={"Content-Type": "application/json"}),
    ]
    expected = [(413, "close"), (413, "close"), (401, "close"), (415, "keep-alive"),
                (401, "keep-alive")]
    for send, (status, connection) in zip(early, expected, strict=True):
        response = send()
        assert response.status_code == status
        assert response.headers["Connection"] == connection
        after = session.get(api.url("/api/v1/jobs?limit=1"), headers=auth, timeout=10)
        assert after.status_code == 200


def test_a_raw_client_reusing_its_connection_after_a_401_gets_its_next_answer(api: Api) -> None:
    """A route that never reads the body (the token check) leaves nothing on the connection:
    the next request's answer is the only thing that follows."""
    with connect(api) as sock:
        sock.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                     b"\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + JOB + b"\r\n0\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_answer(sock).status == 401
        second = read_answer(sock)
        assert second.status == 200 and json.loads(second.body)["status"] == "ok"
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing more: no unrequested second answer


# --- deadlines -----------------------------------------------------------------------------

def test_a_head_that_stalls_is_answered_408_and_closed(api: Api) -> None:
    with connect(api) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        sock.settimeout(DEADLINE_S + 5)
        started = time.monotonic()
        answer = read_answer(sock)
        assert answer.status == 408 and answer.error_code() == "request_timeout"
        assert DEADLINE_S - 1 <= time.monotonic() - started <= DEADLINE_S + 3
        assert closed_by_server(sock)


def test_a_body_that_stalls_is_answered_408_and_creates_nothing(api: Api) -> None:
    before = api.jobs()
    with connect(api) as sock:
        sock.sendall((f"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\n{AUTH}"
                      "Content-Type: application/json\r\nContent-Length: 40\r\n\r\n").encode()
                     + JOB[:8])
        sock.settimeout(DEADLINE_S + 5)
        answer = read_answer(sock)
        assert answer.status == 408 and closed_by_server(sock)
    assert api.jobs() == before


def test_a_silent_connection_is_closed_at_the_header_deadline(api: Api) -> None:
    with connect(api) as sock:
        assert closed_by_server(sock, timeout=DEADLINE_S + 3)


def _hold(api: Api, count: int) -> list[socket.socket]:
    """`count` connections in three kinds: silent, half a head, and half a body."""
    held = []
    partial = [b"", b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: 1\r\n",
               (f"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\n{AUTH}Content-Type: application/json"
                "\r\nContent-Length: 1000\r\n\r\n{\"type\"").encode()]
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", api.port), timeout=10)
        if partial[i % 3]:
            sock.sendall(partial[i % 3])
        held.append(sock)
    return held


def test_a_thousand_slow_connections_leave_requests_answered_within_two_seconds(
        api: Api) -> None:
    held = _hold(api, 1000)
    try:
        worst = 0.0
        deadline = time.monotonic() + 2.5
        served = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            response = requests.post(api.url("/api/v1/jobs"), data=JOB, timeout=5, headers={
                "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            assert requests.get(api.url("/healthz"), timeout=5).status_code == 200
            worst = max(worst, time.monotonic() - started)
            assert response.status_code == 201
            served += 1
        assert worst < 2.0, f"slowest request took {worst:.2f} s"
        assert served >= 5
        # The held ones are closed by the server once their deadline passes.
        still_open = [s for s in held if not closed_by_server(s, timeout=DEADLINE_S + 5)]
        assert not still_open
    finally:
        for sock in held:
            sock.close()


def _open_streams(api: Api, count: int) -> list[socket.socket]:
    """Ask for `count` event streams; the connections that got one (the others are closed)."""
    opened = []
    for _ in range(count):
        sock = connect(api)
        sock.sendall(f"GET /api/v1/events HTTP/1.1\r\nHost: t\r\n{AUTH}\r\n".encode())
        if sock.recv(65536).startswith(b"HTTP/1.1 200"):
            opened.append(sock)
        else:
            sock.close()
    return opened


def test_an_abandoned_event_stream_frees_its_slot_within_seconds(api: Api) -> None:
    """Each process serves 8 streams (half its 16 threads). Once every slot is taken and the
    clients vanish, all 16 are free again within seconds, not at the next heartbeat (15 s)."""
    full = _open_streams(api, 24)
    assert len(full) == 16
    for sock in full:
        sock.close()
    started = time.monotonic()
    held: list[socket.socket] = []
    try:
        wait_for(lambda: held.extend(_open_streams(api, 16 - len(held))) or len(held) == 16,
                 timeout=6, interval=0.2, message="every stream slot free again")
        assert time.monotonic() - started < 6
    finally:
        for sock in held:
            sock.close()


def test_an_empty_last_event_id_does_not_hide_an_invalid_parameter(api: Api) -> None:
    response = requests.get(api.url("/api/v1/events?last_event_id=abc"), timeout=5, headers={
        "Authorization": f"Bearer {TOKEN}", "Last-Event-ID": ""})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_parameter"
