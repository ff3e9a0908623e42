"""The one owner of "after commit, mirror to Redis" (taskline.mirror), against real servers.

Every service commits through it: when Redis is unreachable the queues of jobs made queued are
announced through PostgreSQL (a workflow's first steps included, which the API used to push
without that fallback), an outage is logged once and its end once, and `strict` callers (the
outbox relay, retention) still see the failure.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from taskline import transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import DispatchUnavailable
from taskline.mirror import Mirror
from taskline.readiness import CHANNEL
from taskline.transitions import Committed
from taskline_producer.app import close_app, create_app

MIRROR_LOG = "taskline.mirror"


def _queued(queue: str = "mail") -> Committed:
    return Committed(transitions.HAND_BACK, str(uuid.uuid4()), queue, 5, worker_id="w1")


def _warnings(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == MIRROR_LOG and r.levelno == level]


def test_an_outage_is_logged_once_and_its_end_once(store, fresh_redis, caplog) -> None:
    dispatcher = Dispatcher(fresh_redis.url, breaker=True)
    mirror = Mirror(dispatcher, store)
    caplog.set_level(logging.DEBUG, logger=MIRROR_LOG)
    try:
        assert mirror.follow([_queued()], action="test")
        fresh_redis.kill()
        assert [mirror.follow([_queued()], action="test") for _ in range(5)] == [False] * 5
        (warning,) = _warnings(caplog, logging.WARNING)
        assert "Redis unreachable" in warning
        said = [r for r in caplog.records if r.name == MIRROR_LOG and r.levelno == logging.WARNING]
        assert said[0].breaker == "open"  # the failed call opened it
        assert len(_warnings(caplog, logging.DEBUG)) == 4
        fresh_redis.start()
        assert _follow_until_reachable(mirror)
        assert _warnings(caplog, logging.INFO) == [
            "Redis reachable again: committed changes are mirrored"]
    finally:
        dispatcher.close()


def test_a_stale_ack_counts_toward_the_same_outage_as_the_moves(store, fresh_redis,
                                                                caplog) -> None:
    """A worker acking away the id of an outcome that came too late moves no job: Redis down,
    it joins the outage the moves reported (no second warning), nothing raised."""
    dispatcher = Dispatcher(fresh_redis.url, breaker=True)
    mirror = Mirror(dispatcher, store)
    caplog.set_level(logging.DEBUG, logger=MIRROR_LOG)
    ack = [("mail", str(uuid.uuid4()))]
    try:
        assert mirror.write(lambda: dispatcher.ack(ack, "w1"), action="stale_ack", jobs=1)
        fresh_redis.kill()
        assert not mirror.follow([_queued()], action="test")
        assert not mirror.write(lambda: dispatcher.ack(ack, "w1"), action="stale_ack", jobs=1)
        assert len(_warnings(caplog, logging.WARNING)) == 1
        assert [r.action for r in caplog.records
                if r.name == MIRROR_LOG and r.levelno == logging.DEBUG] == ["stale_ack"]
    finally:
        dispatcher.close()


def _follow_until_reachable(mirror: Mirror, tries: int = 100) -> bool:
    """The breaker's probe closes it within a second or so of Redis answering again."""
    for _ in range(tries):
        if mirror.follow([_queued()], action="test"):
            return True
        time.sleep(0.1)
    return False


def test_strict_callers_see_the_outage_after_the_queues_are_notified(settings, store,
                                                                      unused_port) -> None:
    dead = Dispatcher(f"redis://127.0.0.1:{unused_port}/0", breaker=True)
    with psycopg.connect(settings.database_url, autocommit=True) as listen:
        listen.execute(f"LISTEN {CHANNEL}")
        try:
            with pytest.raises(DispatchUnavailable):
                Mirror(dead, store).follow([_queued("bulk")], action="test", strict=True)
        finally:
            dead.close()
        notes = list(listen.notifies(timeout=1, stop_after=1))
    assert [n.payload for n in notes] == ["bulk"]


def test_one_mirror_per_dispatcher(store, dispatcher) -> None:
    assert Mirror.of(dispatcher, store) is Mirror.of(dispatcher, store)


@pytest.fixture
def api_without_redis(settings, unused_port) -> Iterator:
    app = create_app(settings.replace(redis_url=f"redis://127.0.0.1:{unused_port}/0"))
    yield app.test_client()
    close_app(app)


def test_a_workflow_submitted_while_redis_is_down_announces_its_first_steps(
        settings, api_without_redis) -> None:
    with psycopg.connect(settings.database_url, autocommit=True) as listen:
        listen.execute(f"LISTEN {CHANNEL}")
        answer = api_without_redis.post("/api/v1/workflows", json={"name": "nightly", "steps": [
            {"id": "a", "job": {"type": "t.record", "queue": "reports"}},
            {"id": "b", "job": {"type": "t.record", "queue": "reports"}, "after": ["a"]}]})
        assert answer.status_code == 201, answer.get_data(as_text=True)
        notes = list(listen.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["reports"]
