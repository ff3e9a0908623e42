"""HTTP/1.1 connection pools of the API clients: one for threads, one for asyncio.

A client call costs the producer CPU on every job it enqueues, so the request path is kept
short: a kept-alive connection from a pool (the standard library's http.client for threads;
asyncio streams read by h11, the strict HTTP/1.1 parser the API already depends on, for
asyncio), a body encoded once by orjson, and no per-call objects beyond the request itself.

Invariant: a pooled connection is handed out only when it is idle and still open (a connection
the server closed while it sat in the pool is dropped before use, so a request is never written
into a dead socket); a connection is returned to the pool only after a whole response was read
from it and neither side asked to close it. Errors are sorted for the retry rules: `Unreachable`
(the request never left: refused, unresolvable, connect timeout), `TimedOut` and `Lost` (sent,
but no whole answer came back; the server may have acted on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11


class TransportError(Exception):
    """A request got no answer."""


class Unreachable(TransportError):
    """The connection could not be opened: the request was never sent."""


class TimedOut(TransportError):
    """The answer did not come in time; the request may have been served."""


class Lost(TransportError):
    """The connection broke after the request was (perhaps partly) sent."""


@dataclass(frozen=True)
class Answer:
    """A whole HTTP response: status, headers (lower-case names) and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port, and the TLS context an https origin needs."""

    scheme: str
    host: str
    port: int
    tls: ssl.SSLContext | None

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the API URL must be http:// or https:// with a host, not {url!r}")
        https = parts.scheme == "https"
        return cls(parts.scheme, parts.hostname, parts.port or (443 if https else 80),
                   ssl.create_default_context() if https else None)

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class SyncPool:
    """Kept-alive http.client connections shared by the threads of one client."""

    def __init__(self, origin: Origin, timeout: float, size: int) -> None:
        self.origin = origin
        self.timeout = timeout
        self.size = size
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(self, method: str, target: str, headers: dict[str, str],
                body: bytes | None) -> Answer:
        conn = self._checkout()
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            content = response.read()
        except TimeoutError as err:
            conn.close()
            raise TimedOut(str(err) or "timed out") from None
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise Lost(_reason(err)) from None
        if response.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return Answer(response.status, _lower(response.getheaders()), content)

    def _checkout(self) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.sock is not None and not _dropped(conn.sock):
                    return conn
                conn.close()
        return self._open()

    def _open(self) -> http.client.HTTPConnection:
        origin = self.origin
        if origin.tls is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                origin.host, origin.port, timeout=self.timeout, context=origin.tls)
        else:
            conn = http.client.HTTPConnection(origin.host, origin.port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as err:
            conn.close()
            raise Unreachable(_reason(err)) from None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _dropped(sock: socket.socket) -> bool:
    """An idle connection with something to read has been closed by the server (or broken):
    HTTP/1.1 sends nothing unasked."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class _Stream:
    """One asyncio connection and its h11 state, reused request after request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)

    @property
    def usable(self) -> bool:
        return (self.h11.our_state is h11.IDLE and not self.writer.is_closing()
                and not self.reader.at_eof())

    async def exchange(self, request: h11.Request, body: bytes | None) -> Answer:
        out = self.h11.send(request) or b""
        if body:
            out += self.h11.send(h11.Data(data=body)) or b""
        out += self.h11.send(h11.EndOfMessage()) or b""
        self.writer.write(out)
        await self.writer.drain()
        response, chunks = None, []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the server closed the connection")
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        assert response is not None
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in response.headers}
        return Answer(response.status_code, headers, b"".join(chunks))

    def close(self) -> None:
        self.writer.close()


class AsyncPool:
    """Kept-alive asyncio connections shared by the tasks of one client (one event loop)."""

    def __init__(self, origin: Origin, timeout: float, size: int) -> None:
        self.origin = origin
        self.timeout = timeout
        self.size = size
        self._idle: list[_Stream] = []

    async def request(self, method: str, target: str, headers: dict[str, str],
                      body: bytes | None) -> Answer:
        stream = await self._checkout()
        fields = [("host", self.origin.host_header), *headers.items()]
        if body is not None:
            fields.append(("content-length", str(len(body))))
        try:
            async with asyncio.timeout(self.timeout):
                answer = await stream.exchange(
                    h11.Request(method=method, target=target, headers=fields), body)
        except TimeoutError:
            stream.close()
            raise TimedOut("timed out") from None
        except (OSError, h11.ProtocolError) as err:
            stream.close()
            raise Lost(_reason(err)) from None
        if stream.usable and len(self._idle) < self.size:
            self._idle.append(stream)
        else:
            stream.close()
        return answer

    async def _checkout(self) -> _Stream:
        while self._idle:
            stream = self._idle.pop()
            if stream.usable:
                return stream
            stream.close()
        origin = self.origin
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(
                    origin.host, origin.port, ssl=origin.tls)
        except (OSError, TimeoutError) as err:
            raise Unreachable(_reason(err) or "connect timed out") from None
        return _Stream(reader, writer)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for stream in idle:
            stream.close()
            with contextlib.suppress(OSError):
                await stream.writer.wait_closed()


def _lower(headers: list[tuple[str, str]]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers}


def _reason(err: BaseException) -> str:
    """The useful part of a socket error ("[Errno 111] Connection refused")."""
    return str(err) or type(err).__name__
