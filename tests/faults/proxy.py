"""A small TCP proxy that breaks the network between a service and a server, on demand.

It runs an asyncio loop in a thread of its own and listens on a free loopback port; each
accepted connection gets its own connection to the target. The faults act the way a real
network would, as seen from the client:

- latency: every chunk waits `seconds` before it is forwarded, in each direction;
- blackhole: nothing is forwarded in either direction, on existing and new connections, and
  nothing is closed; held bytes flow again when the blackhole lifts (TCP retransmission);
- reset: every open connection is aborted with an RST on both sides (SO_LINGER 0);
- refuse: new connections are reset as soon as they are accepted;
- swallow: one reply is dropped and its connection stays open, so the command was executed
  but its answer never arrives.

Invariant: the proxy only ever connects to its one target on loopback and only acts on the
connections it accepted itself. Every public method returns once the fault is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

LOOPBACK = "127.0.0.1"
CHUNK = 65536
T = TypeVar("T")


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST instead of a FIN: the peer sees ECONNRESET at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream twin."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)

    def abort(self) -> None:
        for task in self.tasks:
            task.cancel()
        _abort(self.client)
        if self.upstream is not None:
            _abort(self.upstream)


class Proxy:
    """`Proxy(host, port).start()` listens on 127.0.0.1:`.port` and forwards to host:port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port: int | None = None
        self.accepted = 0  # connections accepted since start (refused ones included)
        self.swallowed = 0  # replies dropped by swallow_next_reply
        self._latency = 0.0
        self._refuse = False
        self._swallow_any = 0
        self._swallow_containing: list[bytes] = []
        self._links: set[_Link] = set()
        self._serving: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._flowing: asyncio.Event | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Proxy:
        """Start the loop thread and listen; returns self, `.port` is set."""
        if self._loop is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy",
                                        daemon=True)
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        """Stop listening, reset every connection and end the loop thread."""
        if self._loop is None:
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop.close()
        self._loop = None
        self._refuse = False  # shutdown refused stragglers; a new start() accepts again

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def open_connections(self) -> int:
        return len(self._links)

    # -- faults ------------------------------------------------------------------------
    def set_latency(self, seconds: float) -> None:
        """Delay every chunk by `seconds`, in each direction (0 removes the delay)."""
        self._latency = max(0.0, float(seconds))

    def blackhole(self, on: bool = True) -> None:
        """Forward nothing (both directions, every connection) while on; close nothing."""
        self._call(self._set_flowing(not on))

    def refuse(self, on: bool = True) -> None:
        """While on, every new connection is reset as soon as it is accepted."""
        self._refuse = on

    def reset_all(self) -> int:
        """RST every open connection on both sides; returns how many were reset."""
        return self._call(self._reset_all())

    def swallow_next_reply(self, containing: bytes | None = None) -> None:
        """Drop one server->client chunk and keep its connection open: the command ran, its
        answer is lost. Without `containing` the next chunk on any connection is dropped; with
        it, the next chunk that contains those bytes (e.g. a job id in an LMOVE reply)."""
        self._call(self._arm_swallow(containing))

    # -- loop side ---------------------------------------------------------------------
    def _call(self, coro: Awaitable[T]) -> T:
        assert self._loop is not None, "proxy not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        self._refuse = True  # a connection accepted but not yet served is reset too
        if self._server is not None:
            self._server.close()
        await asyncio.sleep(0.05)  # let accept callbacks already queued run and see it
        await self._reset_all()
        if self._serving:  # let every connection's task finish before the loop stops
            await asyncio.wait(list(self._serving), timeout=2)
        assert self._flowing is not None
        self._flowing.set()  # let held pumps see their cancellation

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _reset_all(self) -> int:
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.difference_update(links)
        return len(links)

    async def _arm_swallow(self, containing: bytes | None) -> None:
        if containing is None:
            self._swallow_any += 1
        else:
            self._swallow_containing.append(containing)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refuse:
            _abort(writer)
            return
        link = _Link(client=writer)
        task = asyncio.current_task()
        assert task is not None
        self._links.add(link)
        self._serving.add(task)
        try:
            await self._serve(link, reader)
        except (OSError, asyncio.IncompleteReadError):
            link.abort()
        finally:
            self._links.discard(link)
            self._serving.discard(task)

    async def _serve(self, link: _Link, client_reader: asyncio.StreamReader) -> None:
        assert self._flowing is not None
        # A blackholed network lets no SYN through either: connect only once it lifts.
        await self._flowing.wait()
        up_reader, link.upstream = await asyncio.open_connection(self.target_host,
                                                                 self.target_port)
        link.tasks = [asyncio.ensure_future(self._pump(client_reader, link.upstream, link, True)),
                      asyncio.ensure_future(self._pump(up_reader, link.client, link, False))]
        await asyncio.gather(*link.tasks, return_exceptions=True)
        for writer in (link.client, link.upstream):
            writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link, to_server: bool) -> None:
        """One direction: a reader stamps each chunk with its due time, the writer forwards it
        then (a delay line: latency delays every chunk without throttling the stream)."""
        line: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        feeder = asyncio.ensure_future(self._feed(reader, line, link))
        link.tasks.append(feeder)
        try:
            await self._deliver(line, writer, to_server)
        except OSError:
            # One side broke: the other must learn at once, as it would without a proxy.
            link.abort()
        finally:
            feeder.cancel()

    async def _feed(self, reader: asyncio.StreamReader,
                    line: asyncio.Queue[tuple[float, bytes] | None], link: _Link) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(CHUNK):
                line.put_nowait((loop.time() + self._latency, data))
        except OSError:
            link.abort()  # a reset peer: the other side gets a reset too, at once
            return
        line.put_nowait(None)

    async def _deliver(self, line: asyncio.Queue[tuple[float, bytes] | None],
                       writer: asyncio.StreamWriter, to_server: bool) -> None:
        assert self._flowing is not None
        loop = asyncio.get_running_loop()
        while (item := await line.get()) is not None:
            due, data = item
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            await self._flowing.wait()
            if not to_server and self._take_swallow(data):
                continue
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    def _take_swallow(self, data: bytes) -> bool:
        for pattern in self._swallow_containing:
            if pattern in data:
                self._swallow_containing.remove(pattern)
                break
        else:
            if not self._swallow_any:
                return False
            self._swallow_any -= 1
        self.swallowed += 1
        return True
