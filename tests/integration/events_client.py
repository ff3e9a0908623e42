"""A Server-Sent Events reader for tests: one blocking HTTP connection, parsed per the SSE spec.

Invariant: every read is bounded by the connection's socket timeout, so a test waiting for an
event that never comes fails instead of hanging.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Message:
    """One dispatched SSE block: a named event with data, or comments only."""

    event: str | None = None
    id: str | None = None
    data: str = ""
    retry: int | None = None
    comments: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.data)


class SseClient:
    """GET `path` and read its event stream block by block."""

    def __init__(self, port: int, path: str = "/api/v1/events",
                 headers: dict[str, str] | None = None, timeout: float = 10.0) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn.request("GET", path, headers=headers or {})
        self.response = self.conn.getresponse()
        self.status = self.response.status

    def body(self) -> Any:
        """The JSON body of a response that is not a stream (an error)."""
        return json.loads(self.response.read())

    def next(self) -> Message:
        """The next block; EOFError when the server ended the stream."""
        message = Message()
        data: list[str] = []
        seen = False
        while True:
            raw = self.response.readline()
            if not raw:
                raise EOFError("the server ended the stream")
            line = raw.decode().rstrip("\n")
            if line == "":
                if seen:
                    message.data = "\n".join(data)
                    return message
                continue
            seen = True
            _apply(message, data, line)

    def next_event(self, event: str = "job") -> Message:
        """The next block that is an `event` (skipping comments and other events)."""
        while True:
            message = self.next()
            if message.event == event:
                return message

    def jobs(self, count: int) -> list[dict[str, Any]]:
        """The data of the next `count` job events."""
        return [self.next_event("job").json() for _ in range(count)]

    def close(self) -> None:
        self.conn.close()


def _apply(message: Message, data: list[str], line: str) -> None:
    if line.startswith(":"):
        message.comments.append(line[1:].strip())
        return
    name, _, value = line.partition(":")
    value = value[1:] if value.startswith(" ") else value
    if name == "event":
        message.event = value
    elif name == "id":
        message.id = value
    elif name == "data":
        data.append(value)
    elif name == "retry":
        message.retry = int(value)
