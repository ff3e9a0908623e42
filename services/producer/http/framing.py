"""Where one HTTP/1.1 request ends in the bytes a connection sent, found as the bytes arrive.

Invariant: a request reaches the application only once its head and its whole body are here
(`Framed.complete`), or once its head and more body than the size limit allows are here
(`complete` False: the answer closes the connection, the rest is never read). Framing the
standard refuses (a bad chunk size, a chunk longer than declared, a missing CRLF, a body shorter
than its Content-Length, a transfer coding other than chunked, Content-Length together with
Transfer-Encoding) is a `Refused` with the status to answer, never a request. No I/O happens
here; h11 (a strict, incremental HTTP/1.1 parser) does the reading.
"""

from __future__ import annotations

from dataclasses import dataclass

import h11

# The most bytes a request line and its headers may take (as nginx's default 4 x 8 KiB, twice).
HEAD_LIMIT = 65536
_STATUS_CODES = {400: "invalid_framing", 431: "headers_too_large", 501: "not_implemented"}


@dataclass(frozen=True)
class Framed:
    """A request the application can be handed."""

    message: bytes
    """The request's bytes: its head and its body (when `complete`, exactly; else the start)."""
    complete: bool
    """Whether the whole body is in `message`; if not, the connection closes after the answer."""
    rest: bytes
    """Bytes received after the message: the start of a pipelined next request."""


@dataclass(frozen=True)
class Refused:
    """Bytes that are not a request this API takes; answered, then the connection closes."""

    status: int
    code: str
    message: str


class RequestFramer:
    """Reads one request; `feed` returns None until the request is framed or refused."""

    def __init__(self, body_limit: int, pending: bytes = b"") -> None:
        self._parser = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        self._limit = body_limit
        self._buffer = bytearray()
        self._body = 0
        self.head_done = False
        self.expects_continue = False
        if pending:
            self.feed(pending)

    @property
    def started(self) -> bool:
        """Whether any byte of a request has arrived."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> Framed | Refused | None:
        """Take the next bytes read from the connection (never b"": see `close`)."""
        if not self._buffer:
            data = data.lstrip(b"\r\n")  # RFC 9112 2.2: empty lines before a request are ignored
            if not data:
                return None
        self._buffer += data
        self._parser.receive_data(data)
        return self._advance()

    def close(self) -> Framed | Refused | None:
        """The client closed its side of the connection."""
        self._parser.receive_data(b"")
        return self._advance()

    def _advance(self) -> Framed | Refused | None:
        while True:
            try:
                event = self._parser.next_event()
            except h11.RemoteProtocolError as err:
                return _refused(err.error_status_hint, str(err))
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return None
            outcome = self._on_event(event)
            if outcome is not None:
                return outcome

    def _on_event(self, event: object) -> Framed | Refused | None:
        if isinstance(event, h11.Request):
            return self._on_head(event)
        if isinstance(event, h11.Data):
            self._body += len(event.data)
            return self._framed(complete=False) if self._body > self._limit else None
        if isinstance(event, h11.EndOfMessage):
            return self._framed(complete=True)
        return None

    def _on_head(self, head: h11.Request) -> Framed | Refused | None:
        self.head_done = True
        # h11 bounds only a head still incomplete; one that arrived whole is bounded here.
        if len(self._buffer) - len(self._parser.trailing_data[0]) > HEAD_LIMIT:
            return _refused(431, "the request line and headers exceed 64 KiB")
        names = [name for name, _ in head.headers]
        if b"transfer-encoding" in names and b"content-length" in names:
            # RFC 9112 6.3: a message that may be read two ways is refused, not guessed at.
            return _refused(400, "Content-Length and Transfer-Encoding together")
        lengths = [int(value) for name, value in head.headers if name == b"content-length"]
        if lengths and lengths[0] > self._limit:
            return self._framed(complete=False)
        self.expects_continue = self._parser.they_are_waiting_for_100_continue
        return None

    def _framed(self, complete: bool) -> Framed:
        rest = self._parser.trailing_data[0] if complete else b""
        end = len(self._buffer) - len(rest)
        return Framed(bytes(self._buffer[:end]), complete, bytes(rest))


def _refused(status: int, message: str) -> Refused:
    status = status if status in _STATUS_CODES else 400
    return Refused(status, _STATUS_CODES[status], f"the request is not valid HTTP/1.1: {message}")
