"""Every Redis client of taskline is built here: a plain client, or redis-py's cluster client
when `REDIS_URL` names a node of a Redis Cluster.

Invariant: no client built here retries a command behind its caller's back (a retried LMOVE
whose first reply was lost would strand an id), and cluster mode is decided from the URL's node
itself (`INFO cluster`), so `REDIS_URL` at any node of a cluster works with no other setting.
The cluster client follows MOVED, ASK and TRYAGAIN (those commands did not run, so following
them is no blind retry); what it cannot follow surfaces as an error the dispatcher counts as
Redis unavailable. `redis+cluster://` (or `rediss+cluster://`) asks for cluster mode without
detection, e.g. while the node cannot be reached at start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)
from redis.retry import Retry

from taskline.dispatch.breaker import Breaker, GuardedConnection
from taskline.errors import DispatchUnavailable

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
DETECT_TIMEOUT_S = 1.0
"""Connect and reply timeout of the `INFO cluster` asked of the URL's node, seconds."""

Client = redis.Redis | RedisCluster
# Replies a client could not follow: a redirection still there after the cluster client's own
# attempts, or reaching a plain client (MOVED and ASK are AskError), a cluster without a
# master for a slot (CLUSTERDOWN, MASTERDOWN), a demoted master (READONLY).
_UNFOLLOWED = (AskError, TryAgainError, ClusterError, ReadOnlyError)


def plain_url(url: str) -> str:
    """`url` with a `+cluster` scheme turned into the scheme redis-py knows."""
    scheme, sep, rest = url.partition("://")
    return CLUSTER_SCHEMES.get(scheme.lower(), scheme) + sep + rest


def cluster_scheme(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def detect_cluster(url: str, timeout_s: float = DETECT_TIMEOUT_S) -> bool | None:
    """Whether the node at `url` runs in cluster mode; None when it cannot be asked now."""
    if cluster_scheme(url):
        return True
    # Database 0: a cluster node refuses SELECT of any other, and the URL may name one.
    node = urlunsplit(urlsplit(plain_url(url))._replace(path="/0"))
    client = _plain(node, socket_timeout=timeout_s, connect_timeout=timeout_s)
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except (redis.ConnectionError, redis.TimeoutError):
        return None
    finally:
        client.close()


def check_cluster_url(url: str) -> None:
    """Refuse, with a message an operator can act on, a URL a cluster cannot serve."""
    db = urlsplit(plain_url(url)).path.strip("/")
    if db not in ("", "0"):
        raise ValueError(f"REDIS_URL names database {db}, but a Redis Cluster has only "
                         "database 0: end the URL with /0 or with no database")


def make_client(url: str, socket_timeout: float | None = 5.0, *, cluster: bool = False,
                breaker: Breaker | None = None, connect_timeout: float = 5.0) -> Client:
    """A client that fails fast and never retries a command; with a `breaker`, its connections
    ask it before every call and report every failure to it. With `cluster`, redis-py's cluster
    client (it must reach a node now: it reads the slot map as it is built)."""
    guarded: dict[str, Any] = {} if breaker is None else {
        "connection_class": GuardedConnection.bound(breaker)}
    if not cluster:
        return _plain(url, socket_timeout=socket_timeout, connect_timeout=connect_timeout,
                      **guarded)
    check_cluster_url(url)
    return RedisCluster.from_url(
        plain_url(url), decode_responses=True, retry=Retry(NoBackoff(), 0),
        socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
        socket_keepalive=True, health_check_interval=0,
        # A failover shows first as MOVED replies: read the new slot map at the first one.
        reinitialize_steps=1, **guarded,
    )


def _plain(url: str, *, socket_timeout: float | None, connect_timeout: float,
           **kwargs: Any) -> redis.Redis:
    return redis.Redis.from_url(
        plain_url(url), decode_responses=True, retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False, socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout, socket_keepalive=True, health_check_interval=0,
        **kwargs,
    )


@contextlib.contextmanager
def translate_errors(redirected: Callable[[], None] | None = None) -> Iterator[None]:
    """Redis errors that mean "no answer to be had now" become DispatchUnavailable (so dispatch
    from PostgreSQL takes over); other error replies stay what they are. `redirected` is
    called first when a MOVED or ASK reaches the client (a plain client at a cluster node)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as err:
        # The driver's error stays the cause, for logs (taskline.errors.detail).
        raise DispatchUnavailable(f"Redis unavailable: {type(err).__name__}") from err
    except _UNFOLLOWED as err:
        if redirected is not None and isinstance(err, AskError):
            redirected()
        raise DispatchUnavailable(f"Redis cluster not followed: {type(err).__name__}") from err
    except RedisClusterException as err:  # no node for a slot, slot map unreadable
        raise DispatchUnavailable(f"Redis cluster unavailable: {type(err).__name__}") from err
    except redis.ResponseError as err:
        if "LOADING" in str(err) or "MASTERDOWN" in str(err):
            raise DispatchUnavailable(f"Redis not ready: {err}") from None
        raise
