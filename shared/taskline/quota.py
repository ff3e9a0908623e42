"""Enqueue quotas per client, enforced across every API process and host through Redis.

Invariant: no window of a quota's length holds more accepted jobs of one client than the quota
allows, in Redis's clock (one Lua script decides and records atomically: lua/quota_take.lua),
and a request is taken whole or refused whole (a batch counts its jobs). Redis is not needed to
accept a job, PostgreSQL is: while Redis cannot be reached, quotas fail open, said in one log
line per outage and counted in `taskline_quota_decisions_total{decision="unchecked"}`, and
Redis is not asked again for `RETRY_REDIS_S`, so an outage costs a request no more than one
short timeout per process and second.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources

import redis
from redis.exceptions import AskError, RedisClusterException

from taskline.access import Quota
from taskline.dispatch.connection import detect_cluster, make_client
from taskline.metrics import QUOTA_DECISIONS, QUOTA_JOBS

log = logging.getLogger(__name__)

KEY_PREFIX = "taskline:quota:"
REDIS_TIMEOUT_S = 0.25
"""Socket and connect timeout of a quota check: an enqueue must not wait long for Redis."""
RETRY_REDIS_S = 1.0
"""After Redis failed, quotas stay unchecked this long before Redis is asked again."""
_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError,
                 RedisClusterException)


def quota_key(client: str) -> str:
    """The list of one client's accepted-job instants (client names are CLIENT_NAME only)."""
    return f"{KEY_PREFIX}{{{client}}}"


@dataclass(frozen=True)
class Decision:
    """One quota check: whether the jobs were taken, and when to try again if not."""

    taken: bool
    retry_after_s: float = 0.0
    checked: bool = True
    too_large: bool = False
    """The request alone asks for more jobs than the quota allows in a whole window."""
    at_s: float | None = None
    """When Redis decided, in Redis's clock (epoch seconds); None when Redis was not asked."""

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, at least 1 (RFC 9110 Retry-After takes no fractions)."""
        return str(max(1, math.ceil(self.retry_after_s)))


NO_QUOTA = Decision(True)
"""The decision for a client without a quota: nothing to check."""


class EnqueueQuotas:
    """Takes jobs from per-client sliding windows in Redis; clients without a quota pass."""

    def __init__(self, redis_url: str, quotas: Mapping[str, Quota],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quotas = dict(quotas)
        self._url = redis_url
        # Unknown (the node did not answer): plain until a MOVED says otherwise.
        self._connect(bool(detect_cluster(redis_url, REDIS_TIMEOUT_S)))
        self._clock = clock
        self._lock = threading.Lock()
        self._unchecked_until: float | None = None

    def _connect(self, cluster: bool) -> None:
        # Like the dispatcher's client (no retries behind our back), with shorter timeouts.
        self._client = make_client(self._url, socket_timeout=REDIS_TIMEOUT_S,
                                   connect_timeout=REDIS_TIMEOUT_S, cluster=cluster)
        script = resources.files("taskline").joinpath("lua", "quota_take.lua").read_text()
        self._take = self._client.register_script(script)
        self._cluster = cluster

    def close(self) -> None:
        self._client.close()

    def take(self, client: str | None, jobs: int) -> Decision:
        """Take `jobs` from `client`'s quota, or refuse them all; fails open without Redis."""
        quota = self.quotas.get(client or "")
        if quota is None or jobs <= 0:
            return NO_QUOTA
        decision = self._ask_redis(client or "", quota, jobs)
        label = "unchecked" if not decision.checked else "taken" if decision.taken else "refused"
        QUOTA_DECISIONS.labels(client=client, decision=label).inc()
        QUOTA_JOBS.labels(client=client, decision=label).inc(jobs)
        return decision

    def _ask_redis(self, client: str, quota: Quota, jobs: int) -> Decision:
        if self._skipping():
            return Decision(True, checked=False)
        try:
            taken, retry_us, now_us = self._take(
                keys=[quota_key(client)],
                args=[quota.jobs, int(quota.window_s * 1_000_000), jobs])
        except _REDIS_ERRORS as err:
            self._redis_failed(err)
            return Decision(True, checked=False)
        self._redis_back()
        at_s = now_us / 1_000_000
        if taken:
            return Decision(True, at_s=at_s)
        if retry_us < 0:
            return Decision(False, quota.window_s, too_large=True, at_s=at_s)
        return Decision(False, retry_us / 1_000_000, at_s=at_s)

    def _skipping(self) -> bool:
        with self._lock:
            return self._unchecked_until is not None and self._clock() < self._unchecked_until

    def _redis_failed(self, err: Exception) -> None:
        if isinstance(err, AskError) and not self._cluster:
            # A MOVED: REDIS_URL names a cluster node that could not be asked at start.
            with contextlib.suppress(redis.RedisError, RedisClusterException, ValueError):
                self._connect(True)
        with self._lock:
            first = self._unchecked_until is None
            self._unchecked_until = self._clock() + RETRY_REDIS_S
        if first:
            log.warning("enqueue quotas unchecked: Redis unavailable (%s); accepting without "
                        "quota until it answers", type(err).__name__,
                        extra={"action": "quota_unchecked"})

    def _redis_back(self) -> None:
        with self._lock:
            was_down, self._unchecked_until = self._unchecked_until is not None, None
        if was_down:
            log.info("enqueue quotas checked again: Redis answers",
                     extra={"action": "quota_checked"})
