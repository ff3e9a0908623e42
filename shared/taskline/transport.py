"""HTTP/1.1 connection pools of the API clients: one for threads, one for asyncio.

A client call costs the producer CPU on every job it enqueues, so the request path is kept
short: a kept-alive connection from a pool, the whole request (head and body) written by one
send, and the answer read by a small HTTP/1.1 reader (status line, headers, then a body framed
by Content-Length, chunked transfer coding, or the connection's close; 1xx answers skipped).
http.client spends more CPU on one answer's headers (the email package parses them) than the
rest of a call together, and h11 about as much (docs/performance.md).

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
import os
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 65536
"""Longest answer head (status line and headers) read, bytes; longer is a broken answer."""
_RECV = 65536
_NO_BODY = frozenset({204, 304})


class TransportError(Exception):
    """A request got no answer."""


class Unreachable(TransportError):
    """The connection could not be opened: the request was never sent."""


class TimedOut(TransportError):
    """The answer did not come in time; the request may have been served."""


class Lost(TransportError):
    """The connection broke after the request was (perhaps partly) sent."""


class BrokenAnswer(ValueError):
    """The bytes that came back are not an HTTP/1.1 answer."""


@dataclass(frozen=True)
class Answer:
    """A whole HTTP response: status, headers (lower-case names) and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port, and the TLS context an https origin needs."""

    host: str
    port: int
    tls: ssl.SSLContext | None

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the API URL must be http:// or https:// with a host, not {url!r}")
        https = parts.scheme == "https"
        return cls(parts.hostname, parts.port or (443 if https else 80),
                   ssl.create_default_context() if https else None)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.tls else 80) else f"{host}:{self.port}"


def request_bytes(origin: Origin, method: str, target: str, headers: Mapping[str, str],
                  body: bytes | None) -> bytes:
    """One request, head and body, ready for a single send."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {origin.host_header}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


@dataclass(frozen=True)
class Head:
    """An answer's status line and headers, and how its body is framed."""

    status: int
    headers: dict[str, str]
    length: int | None
    """Content-Length; None with chunked coding or a body that ends at the close."""
    chunked: bool
    closes: bool
    """The connection ends after this answer (Connection: close, HTTP/1.0, body to the close)."""


def parse_head(raw: bytes, method: str) -> Head:
    """Read an answer's head (without its final empty line); BrokenAnswer when it is none."""
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise BrokenAnswer(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise BrokenAnswer(f"not a header line: {line[:80]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    status = int(code)
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = _length(headers, status, method, chunked)
    connection = headers.get("connection", "").lower()
    closes = ("close" in connection
              or (version == "HTTP/1.0" and "keep-alive" not in connection)
              or (length is None and not chunked))
    return Head(status, headers, length, chunked, closes)


def _length(headers: dict[str, str], status: int, method: str, chunked: bool) -> int | None:
    if method == "HEAD" or status in _NO_BODY or 100 <= status < 200:
        return 0
    if chunked:
        return None
    declared = headers.get("content-length")
    if declared is None:
        return None
    if not declared.isdigit():
        raise BrokenAnswer(f"invalid Content-Length {declared[:40]!r}")
    return int(declared)


def chunk_size(line: bytes) -> int:
    """The size a chunk's line announces (extensions ignored)."""
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise BrokenAnswer(f"invalid chunk size line {line[:40]!r}") from None


# --- threads ----------------------------------------------------------------------------------

class _Socket:
    """A connected socket with the bytes read past the last answer kept for the next one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        data = self.sock.recv(_RECV)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        self.buffer += data

    def readuntil(self, separator: bytes) -> bytes:
        while (end := self.buffer.find(separator)) < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise BrokenAnswer("the answer's head is too long")
            self._fill()
        line, self.buffer = self.buffer[:end], self.buffer[end + len(separator):]
        return line

    def readexactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            self._fill()
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def read_to_close(self) -> bytes:
        chunks = [self.buffer]
        while data := self.sock.recv(_RECV):
            chunks.append(data)
        self.buffer = b""
        return b"".join(chunks)

    def answer(self, method: str) -> tuple[Answer, bool]:
        """The next whole answer, and whether the connection can be used again."""
        head = parse_head(self.readuntil(b"\r\n\r\n"), method)
        while 100 <= head.status < 200:  # 100 Continue and other interim answers
            head = parse_head(self.readuntil(b"\r\n\r\n"), method)
        if head.chunked:
            parts = []
            while size := chunk_size(self.readuntil(b"\r\n")):
                parts.append(self.readexactly(size))
                self.readexactly(2)
            while self.readuntil(b"\r\n"):  # trailer fields, up to the empty line
                pass
            body = b"".join(parts)
        elif head.length is not None:
            body = self.readexactly(head.length)
        else:
            body = self.read_to_close()
        return Answer(head.status, head.headers, body), not head.closes

    @property
    def dropped(self) -> bool:
        """An idle connection with something to read was closed by the server (or broke):
        HTTP/1.1 sends nothing unasked."""
        if self.buffer:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class SyncPool:
    """Kept-alive connections shared by the threads of one client."""

    def __init__(self, origin: Origin, timeout: float, size: int) -> None:
        self.origin = origin
        self.timeout = timeout
        self.size = size
        self._idle: list[_Socket] = []
        self._lock = threading.Lock()

    def request(self, method: str, target: str, headers: Mapping[str, str],
                body: bytes | None, timeout: float | None = None) -> Answer:
        """One exchange; `timeout` (default the pool's) bounds each read and write of it."""
        conn = self._checkout()
        try:
            if timeout is not None:
                conn.sock.settimeout(timeout)  # an answer the server holds (wait_s)
            conn.sock.sendall(request_bytes(self.origin, method, target, headers, body))
            answer, reusable = conn.answer(method)
            if timeout is not None:
                conn.sock.settimeout(self.timeout)
        except TimeoutError as err:
            conn.close()
            raise TimedOut(str(err) or "timed out") from None
        except (OSError, BrokenAnswer) as err:
            conn.close()
            raise Lost(_reason(err)) from None
        if reusable:
            self._checkin(conn)
        else:
            conn.close()
        return answer

    def _checkout(self) -> _Socket:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.dropped:
                    return conn
                conn.close()
        return self._open()

    def _open(self) -> _Socket:
        origin = self.origin
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=self.timeout)
        except OSError as err:
            raise Unreachable(_reason(err)) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if origin.tls is not None:
            try:
                sock = origin.tls.wrap_socket(sock, server_hostname=origin.host)
            except OSError as err:
                sock.close()
                raise Unreachable(_reason(err)) from None
        return _Socket(sock)

    def _checkin(self, conn: _Socket) -> None:
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

    def forget(self) -> None:
        """Drop the idle connections without a word on them (in a forked child: the parent
        still uses them); only this process's descriptors are closed."""
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()  # no shutdown: the parent's end of the connection stays open


# --- asyncio ----------------------------------------------------------------------------------

class _Stream:
    """One asyncio connection, reused answer after answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @property
    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    async def _until(self, separator: bytes) -> bytes:
        try:
            return (await self.reader.readuntil(separator))[:-len(separator)]
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the server closed the connection") from None
        except asyncio.LimitOverrunError:
            raise BrokenAnswer("the answer's head is too long") from None

    async def _exactly(self, count: int) -> bytes:
        try:
            return await self.reader.readexactly(count)
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the server closed the connection") from None

    async def exchange(self, data: bytes, method: str) -> tuple[Answer, bool]:
        self.writer.write(data)
        await self.writer.drain()
        head = parse_head(await self._until(b"\r\n\r\n"), method)
        while 100 <= head.status < 200:
            head = parse_head(await self._until(b"\r\n\r\n"), method)
        if head.chunked:
            parts = []
            while size := chunk_size(await self._until(b"\r\n")):
                parts.append(await self._exactly(size))
                await self._exactly(2)
            while await self._until(b"\r\n"):
                pass
            body = b"".join(parts)
        elif head.length is not None:
            body = await self._exactly(head.length)
        else:
            body = await self.reader.read()
        return Answer(head.status, head.headers, body), not head.closes

    def close(self) -> None:
        self.writer.close()


class AsyncPool:
    """Kept-alive asyncio connections shared by the tasks of one client (one event loop)."""

    def __init__(self, origin: Origin, timeout: float, size: int) -> None:
        self.origin = origin
        self.timeout = timeout
        self.size = size
        self._idle: list[_Stream] = []

    async def request(self, method: str, target: str, headers: Mapping[str, str],
                      body: bytes | None, timeout: float | None = None) -> Answer:
        """One exchange, within `timeout` (default the pool's)."""
        stream = await self._checkout()
        data = request_bytes(self.origin, method, target, headers, body)
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                answer, reusable = await stream.exchange(data, method)
        except TimeoutError:
            stream.close()
            raise TimedOut("timed out") from None
        except (OSError, BrokenAnswer) as err:
            stream.close()
            raise Lost(_reason(err)) from None
        if reusable and stream.usable and len(self._idle) < self.size:
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
                    origin.host, origin.port, ssl=origin.tls, limit=MAX_HEAD_BYTES)
        except (OSError, TimeoutError) as err:
            raise Unreachable(_reason(err) or "connect timed out") from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Stream(reader, writer)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for stream in idle:
            stream.close()
            with contextlib.suppress(OSError):
                await stream.writer.wait_closed()

    def forget(self) -> None:
        """Drop the idle connections (in a forked child: they belong to the parent's event
        loop); only this process's descriptors are closed."""
        idle, self._idle = self._idle, []
        for stream in idle:
            sock = stream.writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    os.close(sock.fileno())


def _reason(err: BaseException) -> str:
    """The useful part of a socket error ("[Errno 111] Connection refused")."""
    return str(err) or type(err).__name__
