"""How Redis errors are counted (taskline.dispatch.connection.translate_errors) and how a
`+cluster` URL scheme reads: pure, no server."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from taskline.dispatch.connection import cluster_scheme, plain_url, translate_errors
from taskline.errors import DispatchUnavailable

UNFOLLOWED = [MovedError("3999 127.0.0.1:7001"), AskError("3999 127.0.0.1:7001"),
              TryAgainError("Multiple keys request during rehashing of slot"),
              ClusterDownError("The cluster is down"), MasterDownError("Link with MASTER is down"),
              ReadOnlyError("You can't write against a read only replica."),
              RedisClusterException("Redis Cluster cannot be connected"),
              SlotNotCoveredError("Command # 1 (EVALSHA) does not have a slot")]


@pytest.mark.parametrize("error", UNFOLLOWED, ids=lambda e: type(e).__name__)
def test_what_a_client_could_not_follow_counts_as_unavailable(error):
    with pytest.raises(DispatchUnavailable) as raised, translate_errors():
        raise error
    assert raised.value.__cause__ is error


def test_a_redirection_tells_the_dispatcher_it_met_a_cluster():
    met: list[str] = []
    for error in (MovedError("1 127.0.0.1:7001"), ClusterDownError("down")):
        with pytest.raises(DispatchUnavailable), translate_errors(lambda: met.append("moved")):
            raise error
    assert met == ["moved"]


def test_other_error_replies_stay_errors():
    with pytest.raises(redis.ResponseError), translate_errors():
        raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind")


@pytest.mark.parametrize(("url", "plain", "cluster"), [
    ("redis+cluster://h:7000/0", "redis://h:7000/0", True),
    ("REDISS+CLUSTER://:pw@h:7000", "rediss://:pw@h:7000", True),
    ("redis://h:6379/2", "redis://h:6379/2", False),
])
def test_a_cluster_scheme_asks_for_cluster_mode(url, plain, cluster):
    assert plain_url(url) == plain
    assert cluster_scheme(url) is cluster
