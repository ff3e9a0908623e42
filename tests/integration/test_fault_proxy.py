"""The fault suite's TCP proxy: it forwards faithfully, and each fault it injects is what a
client sees on a broken network (delay, silence, RST, refusal, a lost reply), checked against a
tiny echo server and against real Redis."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.faults.proxy import Proxy
from tests.helpers import wait_for


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass  # the proxy reset the connection: that is what several tests do on purpose


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[Proxy]:
    with Proxy(*echo) as p:
        yield p


def _connect(proxy: Proxy, timeout: float = 3.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def _roundtrip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _silent(sock: socket.socket, wait: float = 0.3) -> bool:
    """True when nothing arrives within `wait` seconds and the connection stays open."""
    sock.settimeout(wait)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(3.0)
    return False


def _assert_reset_on_connect(proxy: Proxy) -> None:
    """The connection is reset at once: the RST may even beat connect() back to us."""
    with pytest.raises(ConnectionResetError), _connect(proxy) as sock:
        sock.sendall(b"x")
        sock.recv(1)


def test_forwards_both_ways_and_passes_the_close_on(proxy: Proxy):
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"hello") == b"hello"
        big = bytes(range(256)) * 2048
        assert _roundtrip(sock, big) == big
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""  # the echo server saw our FIN and closed its side
    wait_for(lambda: proxy.open_connections == 0, message="link closed")


def test_latency_delays_each_direction(proxy: Proxy):
    with _connect(proxy) as sock:
        proxy.set_latency(0.2)
        started = time.monotonic()
        assert _roundtrip(sock, b"x") == b"x"
        assert time.monotonic() - started >= 0.4  # 0.2 out + 0.2 back
        proxy.set_latency(0)
        assert _roundtrip(sock, b"y") == b"y"


def test_blackhole_holds_old_and_new_connections_then_releases_them(proxy: Proxy):
    old = _connect(proxy)
    assert _roundtrip(old, b"a") == b"a"
    proxy.blackhole(True)
    old.sendall(b"b")
    new = _connect(proxy)  # the accept still succeeds, as behind a silent router
    new.sendall(b"c")
    assert _silent(old) and _silent(new)
    proxy.blackhole(False)
    assert old.recv(1) == b"b"
    assert new.recv(1) == b"c"
    old.close()
    new.close()


def test_reset_all_sends_rst_to_every_open_connection(proxy: Proxy):
    socks = [_connect(proxy) for _ in range(3)]
    for sock in socks:
        assert _roundtrip(sock, b"z") == b"z"
    assert proxy.reset_all() == 3
    for sock in socks:
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"after")
            sock.recv(1)
        sock.close()
    with _connect(proxy) as sock:  # new connections work again
        assert _roundtrip(sock, b"again") == b"again"


def test_refuse_resets_new_connections_only(proxy: Proxy):
    old = _connect(proxy)
    assert _roundtrip(old, b"1") == b"1"
    proxy.refuse(True)
    _assert_reset_on_connect(proxy)
    assert _roundtrip(old, b"3") == b"3"
    proxy.refuse(False)
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"4") == b"4"
    old.close()


def test_latency_is_a_delay_not_a_throttle(proxy: Proxy):
    proxy.set_latency(0.4)
    with _connect(proxy) as sock:
        started = time.monotonic()
        for i in range(6):  # six chunks in flight at once, each delayed, none queued behind
            sock.sendall(bytes([i]))
            time.sleep(0.02)
        got = b""
        while len(got) < 6:
            got += sock.recv(16)
        assert got == bytes(range(6))
        # ~0.9 s as a delay line; a proxy that sleeps chunk after chunk needs >= 2.4 s.
        assert 0.8 <= time.monotonic() - started < 2.4


def test_swallow_next_reply_drops_one_chunk_and_keeps_the_connection(proxy: Proxy):
    with _connect(proxy) as sock:
        proxy.swallow_next_reply()
        sock.sendall(b"lost")
        assert _silent(sock)
        assert _roundtrip(sock, b"kept") == b"kept"
    assert proxy.swallowed == 1


def test_target_down_resets_the_client(echo: tuple[str, int]):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with Proxy("127.0.0.1", dead_port) as proxy:
        _assert_reset_on_connect(proxy)


def test_stop_closes_the_listener(echo: tuple[str, int]):
    proxy = Proxy(*echo).start()
    port = proxy.port
    sock = _connect(proxy)
    assert _roundtrip(sock, b"up") == b"up"
    proxy.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        sock.sendall(b"x")
        sock.recv(1)
    sock.close()


# -- against real Redis ----------------------------------------------------------------

def _client(port: int, db: int, timeout: float = 0.5) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, db=db, socket_timeout=timeout,
                       socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


@pytest.fixture
def redis_proxy(redis_url: str) -> Iterator[tuple[Proxy, redis.Redis]]:
    direct = redis.Redis.from_url(redis_url)
    host, port = direct.connection_pool.connection_kwargs["host"], \
        direct.connection_pool.connection_kwargs["port"]
    with Proxy(host, port) as proxy:
        yield proxy, direct
    direct.close()


def _db(client: redis.Redis) -> int:
    return client.connection_pool.connection_kwargs.get("db", 0)


def test_redis_lost_reply_means_executed_but_unanswered(redis_proxy):
    proxy, direct = redis_proxy
    client = _client(proxy.port, _db(direct))
    assert client.ping()
    proxy.swallow_next_reply()
    with pytest.raises(redis.TimeoutError):
        client.incr("proxy:counter")
    assert direct.get("proxy:counter") == b"1"  # the command ran; only its answer was lost
    client.close()


def test_redis_swallow_containing_hits_only_the_matching_reply(redis_proxy):
    proxy, direct = redis_proxy
    direct.rpush("proxy:list", "plain", "marked-id")
    client = _client(proxy.port, _db(direct))
    proxy.swallow_next_reply(containing=b"marked-id")
    assert client.lmove("proxy:list", "proxy:mine", "LEFT", "LEFT") == b"plain"
    with pytest.raises(redis.TimeoutError):
        client.lmove("proxy:list", "proxy:mine", "LEFT", "LEFT")
    # The id moved, its reply was lost: it is stranded in the destination list.
    assert direct.lrange("proxy:mine", 0, -1) == [b"marked-id", b"plain"]
    assert proxy.swallowed == 1
    client.close()


def test_redis_blackhole_times_out_then_heals(redis_proxy):
    proxy, direct = redis_proxy
    client = _client(proxy.port, _db(direct))
    assert client.ping()
    proxy.blackhole(True)
    with pytest.raises(redis.TimeoutError):
        client.set("proxy:bh", "1")
    proxy.blackhole(False)
    # The held SET is delivered late: a network partition does not undo a sent command.
    wait_for(lambda: direct.get("proxy:bh") == b"1", timeout=5, message="held SET delivered")
    assert client.ping()
    client.close()


def test_redis_reset_and_refuse_surface_as_connection_errors(redis_proxy):
    proxy, direct = redis_proxy
    client = _client(proxy.port, _db(direct))
    assert client.ping()
    proxy.refuse(True)
    assert proxy.reset_all() >= 1
    with pytest.raises(redis.ConnectionError):
        client.ping()
    proxy.refuse(False)
    assert client.ping()
    client.close()
