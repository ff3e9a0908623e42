"""The webhook handler against a real HTTP server on 127.0.0.1 (in a thread).

Loopback is refused unless the allow-list names it, so most tests allow 127.0.0.1/32 and one
checks the refusal. The server scripts its answer by path and records what it received, so the
tests see the headers, the body and whether a redirect target was ever requested.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from taskline.errors import NonRetryableError, RetryableError
from taskline.handlers import registry
from taskline.handlers.webhook import AddressPolicy, AddressRefused, PinnedAdapter, configure
from taskline.settings import Settings


class Receiver(BaseHTTPRequestHandler):
    """Answers by path: /ok, /status/<code>, /slow, /redirect, /cookie, /big, /nul."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.server.seen.append({"path": self.path, "headers": dict(self.headers),
                                 "body": body})
        route = self.path.split("?")[0]
        if route == "/slow":
            self.server.release.wait(10)
        if route.startswith("/status/"):
            code = int(route.rsplit("/", 1)[1])
            self._answer(code, b"status body", {"Retry-After": "3"} if code == 429 else {})
        elif route == "/redirect":
            self._answer(302, b"", {"Location": "/ok"})
        elif route == "/cookie":
            self._answer(200, b"set", {"Set-Cookie": "session=secret; Path=/"})
        elif route == "/big":
            self._answer(200, b"x" * 500_000)
        elif route == "/nul":
            self._answer(200, b"a\x00b")
        else:
            self._answer(200, b'{"received": true}', {"Content-Type": "application/json"})

    def _answer(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    server.seen = []
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def receiver() -> Iterator[ThreadingHTTPServer]:
    yield from _serve(ThreadingHTTPServer(("127.0.0.1", 0), Receiver))


@pytest.fixture
def allow_loopback() -> Iterator[None]:
    configure(Settings(webhook_allow=("127.0.0.1/32",)))
    yield
    configure(Settings())


def _ctx(attempt: int = 1) -> registry.JobContext:
    return registry.JobContext(job_id=uuid.uuid4(), attempt=attempt, queue="default",
                               type="webhook", worker_id="test-worker")


def _url(server: ThreadingHTTPServer, path: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{server.server_address[1]}{path}"


def _run(payload: dict[str, Any], ctx: registry.JobContext | None = None) -> Any:
    registry.load([])
    return registry.get("webhook")(payload, ctx or _ctx())


@pytest.mark.usefixtures("allow_loopback")
def test_200_posts_json_with_idempotency_key(receiver: ThreadingHTTPServer) -> None:
    ctx = _ctx(attempt=2)
    result = _run({"url": _url(receiver, "/ok"), "body": {"n": 1, "s": "é"},
                   "headers": {"X-Signature": "sig"}}, ctx)
    assert result == {"status": 200, "body": '{"received": true}'}
    [seen] = receiver.seen
    assert json.loads(seen["body"]) == {"n": 1, "s": "é"}
    assert seen["headers"]["Content-Type"] == "application/json"
    assert seen["headers"]["Idempotency-Key"] == ctx.idempotency_key
    assert seen["headers"]["X-Taskline-Job-Id"] == str(ctx.job_id)
    assert seen["headers"]["X-Taskline-Attempt"] == "2"
    assert seen["headers"]["X-Signature"] == "sig"
    assert seen["headers"]["Host"] == f"127.0.0.1:{receiver.server_address[1]}"


@pytest.mark.usefixtures("allow_loopback")
def test_idempotency_key_is_stable_across_attempts(receiver: ThreadingHTTPServer) -> None:
    first = _ctx(attempt=1)
    second = registry.JobContext(job_id=first.job_id, attempt=2, queue="default",
                                 type="webhook", worker_id="another-worker")
    _run({"url": _url(receiver, "/ok")}, first)
    _run({"url": _url(receiver, "/ok")}, second)
    keys = {seen["headers"]["Idempotency-Key"] for seen in receiver.seen}
    assert keys == {first.idempotency_key}


@pytest.mark.usefixtures("allow_loopback")
def test_without_body_sends_an_empty_request(receiver: ThreadingHTTPServer) -> None:
    assert _run({"url": _url(receiver, "/ok")})["status"] == 200
    assert receiver.seen[0]["body"] == b""


@pytest.mark.usefixtures("allow_loopback")
def test_429_is_retried_after_retry_after(receiver: ThreadingHTTPServer) -> None:
    with pytest.raises(RetryableError, match="answered 429") as info:
        _run({"url": _url(receiver, "/status/429")})
    assert info.value.delay_s == 3.0


@pytest.mark.usefixtures("allow_loopback")
def test_500_is_retried_with_backoff(receiver: ThreadingHTTPServer) -> None:
    with pytest.raises(RetryableError, match="answered 500: status body") as info:
        _run({"url": _url(receiver, "/status/500")})
    assert info.value.delay_s is None


@pytest.mark.usefixtures("allow_loopback")
def test_404_dead_letters(receiver: ThreadingHTTPServer) -> None:
    with pytest.raises(NonRetryableError, match="answered 404") as info:
        _run({"url": _url(receiver, "/status/404")})
    assert not isinstance(info.value, RetryableError)


@pytest.mark.usefixtures("allow_loopback")
def test_read_timeout_is_retried(receiver: ThreadingHTTPServer) -> None:
    with pytest.raises(RetryableError, match="failed"):
        _run({"url": _url(receiver, "/slow"), "timeout_s": 0.3})
    assert [seen["path"] for seen in receiver.seen] == ["/slow"]


@pytest.mark.usefixtures("allow_loopback")
def test_connection_refused_is_retried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RetryableError, match="failed"):
        _run({"url": f"http://127.0.0.1:{port}/", "timeout_s": 1})


@pytest.mark.usefixtures("allow_loopback")
def test_redirect_is_not_followed(receiver: ThreadingHTTPServer) -> None:
    with pytest.raises(NonRetryableError, match="redirects are not followed"):
        _run({"url": _url(receiver, "/redirect")})
    assert [seen["path"] for seen in receiver.seen] == ["/redirect"]


@pytest.mark.usefixtures("allow_loopback")
def test_cookies_never_reach_the_next_request(receiver: ThreadingHTTPServer) -> None:
    _run({"url": _url(receiver, "/cookie")})
    _run({"url": _url(receiver, "/ok")})
    assert "Cookie" not in receiver.seen[1]["headers"]


@pytest.mark.usefixtures("allow_loopback")
def test_big_and_nul_bodies_are_trimmed_for_the_result(receiver: ThreadingHTTPServer) -> None:
    big = _run({"url": _url(receiver, "/big")})
    assert big["status"] == 200 and 0 < len(big["body"]) <= 4096
    assert _run({"url": _url(receiver, "/nul")})["body"] == "ab"


def test_loopback_is_refused_without_the_allow_list(receiver: ThreadingHTTPServer) -> None:
    configure(Settings())
    for host in ("127.0.0.1", "localhost", "2130706433", "0x7f.1"):
        with pytest.raises(AddressRefused, match="not a public address"):
            _run({"url": _url(receiver, "/ok", host)})
    assert receiver.seen == []


def test_allow_list_by_host_name_keeps_the_host_header(receiver: ThreadingHTTPServer) -> None:
    configure(Settings(webhook_allow=("localhost",)))
    try:
        assert _run({"url": _url(receiver, "/ok", "localhost")})["status"] == 200
        with pytest.raises(AddressRefused):
            _run({"url": _url(receiver, "/ok", "127.0.0.1")})
    finally:
        configure(Settings())
    assert receiver.seen[0]["headers"]["Host"] == f"localhost:{receiver.server_address[1]}"


@pytest.mark.usefixtures("allow_loopback")
def test_connection_is_pinned_to_the_vetted_address(
        receiver: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that rebinds after the check is never resolved again: the vetted IP is used."""
    real_getaddrinfo = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":
            lookups.append(host)
            host = "127.0.0.1" if len(lookups) == 1 else "10.0.0.1"
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    assert _run({"url": _url(receiver, "/ok", "rebind.test")})["status"] == 200
    assert lookups == ["rebind.test"]
    assert receiver.seen[0]["headers"]["Host"] == f"rebind.test:{receiver.server_address[1]}"


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[tuple[ThreadingHTTPServer, Path, list[str]]]:
    """An HTTPS receiver whose certificate names only `hooks.test`; records the SNI names."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=hooks.test", "-addext", "subjectAltName=DNS:hooks.test",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    names: list[str] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    for served in _serve(server):
        yield served, cert, names


def test_tls_keeps_server_name_and_checks_the_certificate(
        tls_receiver: tuple[ThreadingHTTPServer, Path, list[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, cert, names = tls_receiver
    port = server.server_address[1]
    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real_getaddrinfo(
        "127.0.0.1" if host == "hooks.test" else host, *a, **k))
    session = requests.Session()
    session.trust_env = False
    policy = AddressPolicy.from_entries(["127.0.0.1/32"])
    session.mount("https://", PinnedAdapter(policy=lambda: policy))
    response = session.post(f"https://hooks.test:{port}/ok", verify=str(cert), timeout=5)
    assert response.status_code == 200
    assert names == ["hooks.test"]
    assert server.seen[0]["headers"]["Host"] == f"hooks.test:{port}"
    # The certificate does not name the IP address, so reaching it by address must fail.
    with pytest.raises(requests.exceptions.SSLError):
        session.post(f"https://127.0.0.1:{port}/ok", verify=str(cert), timeout=5)
