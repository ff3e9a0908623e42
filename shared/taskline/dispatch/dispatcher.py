"""The dispatcher: every Redis operation taskline performs, over one non-retrying client.

Redis moves ids only; PostgreSQL decides. The client never retries a command on its own:
a retried LMOVE whose first reply was lost would strand an id (reconciliation repairs that,
but we do not manufacture it). Connection errors surface as DispatchUnavailable.

On Redis Cluster (detected from the URL's node, taskline.dispatch.connection) every command
touches one slot: a Lua script runs per call (a cluster pipeline cannot carry EVALSHA), and a
worker waits on each of its queues apart (taskline.dispatch.waits), never on keys of several.
A plain client that meets a MOVED turns this dispatcher to cluster mode for the next call.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException

from taskline.dispatch import follow
from taskline.dispatch.breaker import Breaker
from taskline.dispatch.connection import (
    Client,
    check_cluster_url,
    detect_cluster,
    make_client,
    translate_errors,
)
from taskline.dispatch.keys import (
    DISPATCH_MARKER,
    PREFIX,
    PROCESSING_PATTERN,
    QUEUES_SET,
    QueueKeys,
    worker_key,
)
from taskline.dispatch.waits import QueueWaits
from taskline.errors import DispatchUnavailable
from taskline.transitions import Committed

__all__ = ["DISCARD_MARKER", "SIGNAL_MAX", "Dispatcher", "make_client", "translate_errors"]

SIGNAL_MAX = 64
HELD_MARKER_MS = 1000
_SCRIPTS = ("fetch", "push", "promote", "retry_later", "dead_letter", "requeue", "snapshot",
            "discard", "drop_dead", "renew_marker", "forget_holders")
PROBE_TIMEOUT_S = 1.0
"""Connect and reply timeout of the breaker's probe, seconds."""
# Stands in for an entry being discarded; job ids are UUIDs, so no id can equal it.
DISCARD_MARKER = "taskline:discarded"


class Dispatcher:
    """Redis side of taskline: pushes, fetches, acks and moves job ids between structures."""

    def __init__(self, url: str, block_timeout_s: float = 1.0, *, timeout_s: float = 5.0,
                 breaker: bool = False) -> None:
        """`timeout_s` bounds every reply (a blocked wait: its block plus this), so a silent
        link is noticed within it. With `breaker`, a failure makes every call of this
        dispatcher fail at once until Redis answers a probe again (taskline.dispatch.breaker).
        """
        self._url = url
        self._timeout_s = timeout_s
        self.block_timeout_s = block_timeout_s
        self._switch = threading.Lock()
        self.breaker = Breaker(self._probe) if breaker else None
        cluster = bool(detect_cluster(url, PROBE_TIMEOUT_S))
        if cluster:
            check_cluster_url(url)  # a clear error at start, not a failure per call
        try:
            self._build(cluster)
        except RedisClusterException:
            # No node answers now (a redis+cluster:// URL while the cluster is down): plain
            # until Redis answers, and a MOVED then turns this dispatcher to cluster mode.
            self._build(False)

    def _build(self, cluster: bool) -> None:
        """(Re)build this dispatcher's clients; cluster clients need a node that answers."""
        connect = min(self._timeout_s, 5.0)
        self._probe_client: Client | None = None if self.breaker is None else make_client(
            self._url, socket_timeout=PROBE_TIMEOUT_S, connect_timeout=PROBE_TIMEOUT_S,
            cluster=cluster)
        # In cluster mode the breaker guards each call instead (_cluster_guard): the cluster
        # client reads the slot map again after a failure, which guarded connections would
        # refuse while the breaker is open, leaving it with a dead master for good.
        guard = None if cluster else self.breaker
        self.client: Client = make_client(self._url, socket_timeout=self._timeout_s,
                                          breaker=guard, connect_timeout=connect,
                                          cluster=cluster)
        # Blocking waits need a socket timeout longer than the block itself.
        self.blocking_client: Client = make_client(
            self._url, socket_timeout=self.block_timeout_s + self._timeout_s,
            breaker=guard, connect_timeout=connect, cluster=cluster)
        self._scripts = {name: self.client.register_script(_lua(name)) for name in _SCRIPTS}
        self._waits = QueueWaits(self._blpop) if cluster else None
        self.cluster = cluster

    def _became_cluster(self) -> None:
        """A MOVED reached a plain client: REDIS_URL names a cluster node that could not be
        asked at start. The call that met it fails (counted unavailable); the next goes to
        the cluster client built here."""
        with self._switch:
            if self.cluster:
                return
            try:
                self._build(True)
            except (redis.RedisError, RedisClusterException, ValueError):
                return  # the next MOVED tries again (ValueError: a database other than 0)

    def _guard(self) -> contextlib.AbstractContextManager[None]:
        if self.cluster:
            return self._cluster_guard()
        return translate_errors(self._became_cluster)

    @contextlib.contextmanager
    def _cluster_guard(self) -> Iterator[None]:
        """translate_errors, asking the breaker first and telling it of every failure."""
        with translate_errors():
            try:
                if self.breaker is not None:
                    self.breaker.check()
                yield
            except (redis.ConnectionError, redis.TimeoutError, RedisClusterException):
                if self.breaker is not None:
                    self.breaker.failed()
                raise

    def _probe(self) -> object:
        probe = self._probe_client
        if probe is None:
            return None
        if isinstance(probe, RedisCluster):
            # Every master must answer; a dead one is dropped from the slot map by the
            # failed ping (the client reads the map again), so the next probe sees the
            # promoted replica. No node known at all is an unanswered probe too.
            try:
                return probe.execute_command("PING", target_nodes=RedisCluster.PRIMARIES)
            except RedisClusterException as err:
                raise redis.ConnectionError(str(err)) from err
        return probe.ping()

    @property
    def redis_down(self) -> bool:
        """Whether the breaker is open: the last call found Redis unreachable and no probe
        has had an answer since (always False without a breaker)."""
        return self.breaker is not None and self.breaker.open

    def close(self) -> None:
        if self.breaker is not None:
            self.breaker.close()
        if self._waits is not None:
            self._waits.close()
        if self._probe_client is not None:
            self._probe_client.close()
        self.client.close()
        self.blocking_client.close()

    def _script(self, name: str, keys: Sequence[str], args: Sequence[object]) -> object:
        with self._guard():
            return self._scripts[name](keys=list(keys), args=list(args))

    def _blpop(self, key: str, timeout_s: float) -> object:
        return self.blocking_client.blpop([key], timeout=timeout_s)

    def follow(self, changes: Iterable[Committed]) -> None:
        """Mirror committed transitions: each move's Redis step (taskline.dispatch.follow)."""
        follow.follow(self, changes)

    # --- producer and promoter -----------------------------------------------------------

    def push(self, jobs: Iterable[tuple[str, int, str]]) -> int:
        """Make (queue, priority, id) dispatchable, in order, in one pipelined round trip.

        The push script goes by EVALSHA straight into the pipeline: handing redis-py the
        Script object would make it send SCRIPT EXISTS first, a second round trip per push.
        A group Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH) did not run at all,
        so exactly those groups are sent again once the script is loaded.
        """
        groups: dict[tuple[str, int], list[str]] = defaultdict(list)
        for queue, priority, job_id in jobs:
            groups[(queue, priority)].append(str(job_id))
        if not groups:
            return 0
        if self.cluster:
            return self._push_per_group(groups)
        with self._guard():
            missed = self._push_groups(list(groups.items()), register=True)
            if missed:
                self.client.script_load(self._scripts["push"].script)
                if self._push_groups(missed, register=False):
                    raise DispatchUnavailable("Redis lost the push script while pushing")
        return sum(len(ids) for ids in groups.values())

    def _push_per_group(self, groups: dict[tuple[str, int], list[str]]) -> int:
        """Cluster mode: one script call per group (each group is one slot), in order, then
        the queues' registration (the Script object reloads a script a node lacks)."""
        for (queue, priority), ids in groups.items():
            keys = QueueKeys(queue)
            self._script("push", [keys.ready(priority), keys.signal], [SIGNAL_MAX, *ids])
        with self._guard():
            self.client.sadd(QUEUES_SET, *{queue for queue, _ in groups})
        return sum(len(ids) for ids in groups.values())

    def _push_groups(self, groups: list[tuple[tuple[str, int], list[str]]], *,
                     register: bool) -> list[tuple[tuple[str, int], list[str]]]:
        """Run the push script for each group (and register the queues) in one round trip;
        the groups answered NOSCRIPT. Any other error reply is raised."""
        sha = self._scripts["push"].sha
        with self.client.pipeline(transaction=False) as pipe:
            for (queue, priority), ids in groups:
                keys = QueueKeys(queue)
                pipe.evalsha(sha, 2, keys.ready(priority), keys.signal, SIGNAL_MAX, *ids)
            if register:
                pipe.sadd(QUEUES_SET, *{queue for (queue, _), _ in groups})
            replies = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, redis.ResponseError) and not isinstance(reply, NoScriptError):
                raise reply
        # The SADD reply, when sent, is the one extra reply at the end.
        return [group for group, reply in zip(groups, replies, strict=False)
                if isinstance(reply, NoScriptError)]

    def schedule(self, queue: str, job_id: str, due_ms: int, *, retry: bool = False) -> None:
        """Hold a job in the scheduled (delayed first run) or retry set until it is due."""
        keys = QueueKeys(queue)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.retry if retry else keys.scheduled, {str(job_id): due_ms})
            pipe.sadd(QUEUES_SET, queue)
            pipe.execute()

    def promote(self, queue: str, priority: int, ids: Sequence[str]) -> int:
        keys = QueueKeys(queue)
        return int(self._script("promote", [keys.ready(priority), keys.retry, keys.scheduled,
                                            keys.signal], [SIGNAL_MAX, *map(str, ids)]))

    def unschedule(self, queue: str, job_id: str) -> None:
        """Forget a cancelled job's delayed or retry entry (ready-list copies die at claim)."""
        keys = QueueKeys(queue)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.retry, str(job_id))
            pipe.zrem(keys.scheduled, str(job_id))
            pipe.execute()

    def remove_from_dlq(self, queue: str, job_id: str) -> None:
        with self._guard():
            self.client.lrem(QueueKeys(queue).dlq, 0, str(job_id))

    def drop_dead(self, queue: str, ids: Sequence[str]) -> int:
        """Remove deleted dead jobs' ids from the queue's DLQ list, reading from its tail
        (where the oldest are) only as far as needed; returns the entries removed."""
        if not ids:
            return 0
        return int(self._script("drop_dead", [QueueKeys(queue).dlq],
                                [DISCARD_MARKER, *map(str, ids)]))

    # --- worker --------------------------------------------------------------------------

    def fetch(self, queue: str, worker_id: str, count: int) -> list[str]:
        """Move up to `count` ids, most urgent first, into this worker's processing list."""
        return list(self._script("fetch", *_fetch_call(queue, worker_id, count)))

    def wait_and_fetch(self, queues: Sequence[str], worker_id: str, count: int,
                       timeout_s: float | None = None) -> list[str]:
        """Block inside Redis until a queue is signalled or the wait times out (no polling), then
        `fetch` from the first queue, in the same round trip.

        Both go down the connection together: Redis runs the fetch the moment the wait ends,
        sparing an idle worker the round trip that `fetch` would add after its wake (about a
        third of a millisecond on a VM whose cores have gone idle). The other queues' ids are
        left to the next `fetch`.
        """
        wait = self.block_timeout_s if timeout_s is None else max(timeout_s, 0.01)
        if self._waits is not None:
            # Cluster mode: each queue's signal is waited on apart (their slots differ), and
            # the fetch follows the wake in a call of its own.
            with self._guard():
                self._waits.wait([QueueKeys(q).signal for q in queues], wait)
            return self.fetch(queues[0], worker_id, count)
        keys, args = _fetch_call(queues[0], worker_id, count)
        with self._guard(), self.blocking_client.pipeline(transaction=False) as pipe:
            pipe.blpop([QueueKeys(q).signal for q in queues], timeout=wait)
            pipe.evalsha(self._scripts["fetch"].sha, len(keys), *keys, *args)
            woken, moved = pipe.execute(raise_on_error=False)
            if isinstance(moved, NoScriptError):
                # Redis lost its scripts (a restart, SCRIPT FLUSH): the fetch did not run, but
                # the wait may have taken a push's signal, so the next wait would sleep through
                # that job. Fetch now; the Script object loads the script again.
                return self.fetch(queues[0], worker_id, count)
            for reply in (woken, moved):
                if isinstance(reply, Exception):
                    raise reply
        return list(moved)

    def ack(self, items: Iterable[tuple[str, str]], worker_id: str) -> None:
        """Drop (queue, id) pairs from this worker's processing lists in one round trip.

        Each LREM searches from the tail: fetches push at the head, so the jobs that finish
        first, the oldest fetched, sit at the tail of a list holding up to the lease cap.
        """
        items = list(items)
        if not items:
            return
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for queue, job_id in items:
                pipe.lrem(QueueKeys(queue).processing(worker_id), -1, str(job_id))
            pipe.execute()

    def retry_later(self, queue: str, worker_id: str, job_id: str, due_ms: int) -> None:
        keys = QueueKeys(queue)
        self._script("retry_later", [keys.processing(worker_id), keys.retry], [job_id, due_ms])

    def dead_letter(self, queue: str, worker_id: str, job_id: str) -> None:
        keys = QueueKeys(queue)
        self._script("dead_letter", [keys.processing(worker_id), keys.dlq], [job_id])

    def requeue(self, queue: str, priority: int, job_id: str, from_worker: str, *,
                always: bool) -> bool:
        """Move an id from a worker's processing list back to ready (next to be taken)."""
        keys = QueueKeys(queue)
        pushed = self._script("requeue", [keys.processing(from_worker), keys.ready(priority),
                                          keys.signal],
                              [job_id, "always" if always else "if_present", SIGNAL_MAX])
        return bool(pushed)

    def hold_back(self, held: Sequence[tuple[str, int, str]], worker_id: str) -> None:
        """Put ids a claim refused because their queue is paused back where they were fetched
        from, in the order given (most urgent first), and mark their queues paused, so no
        worker fetches them again until the queue resumes."""
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for queue in {queue for queue, _, _ in held}:
                # Expiring and never replacing an operator's marker: a resume racing this
                # claim is at most HELD_MARKER_MS late, and maintenance restores the lasting one.
                pipe.set(QueueKeys(queue).paused, "1", px=HELD_MARKER_MS, nx=True)
            pipe.execute()
        for queue, priority, job_id in reversed(held):
            self.requeue(queue, priority, job_id, worker_id, always=False)

    def mark_paused(self, queue: str, paused: bool) -> None:
        """Set or clear a queue's pause marker; clearing also wakes the queue's idle workers."""
        keys = QueueKeys(queue)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            if paused:
                pipe.set(keys.paused, "1")
            else:
                pipe.delete(keys.paused)
                pipe.lpush(keys.signal, "1")
                pipe.ltrim(keys.signal, 0, SIGNAL_MAX - 1)
            pipe.execute()

    def wake(self, queues: Iterable[str]) -> None:
        """Signal each queue once, waking a worker blocked on it (budget freed for held work)."""
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for queue in queues:
                keys = QueueKeys(queue)
                pipe.lpush(keys.signal, "1")
                pipe.ltrim(keys.signal, 0, SIGNAL_MAX - 1)
            pipe.execute()

    def paused_markers(self, queues: Iterable[str]) -> set[str]:
        """The queues among `queues` whose pause marker is set."""
        queues = list(queues)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.exists(QueueKeys(queue).paused)
            return {q for q, present in zip(queues, pipe.execute(), strict=True) if present}

    def heartbeat(self, worker_id: str, ttl_s: float) -> None:
        with self._guard():
            self.client.set(worker_key(worker_id), "1", px=max(int(ttl_s * 1000), 1))

    def forget_worker(self, worker_id: str) -> None:
        with self._guard():
            self.client.delete(worker_key(worker_id))

    # --- maintenance and queries ---------------------------------------------------------

    def known_queues(self) -> set[str]:
        with self._guard():
            return set(self.client.smembers(QUEUES_SET))

    def processing_lists(self, queue: str) -> list[str]:
        """Every processing list of `queue`: on a single Redis those SCAN finds (as before
        workers registered themselves), on a cluster those of its registered holders."""
        keys = QueueKeys(queue)
        with self._guard():
            if not self.cluster:  # SCAN finds the registered lists too, and older ones
                return sorted(set(self.client.scan_iter(match=keys.processing_pattern,
                                                        count=1000)))
            return sorted({keys.processing(w) for w in self.client.smembers(keys.holders)})

    def forget_holders(self, queue: str, worker_ids: Sequence[str]) -> int:
        """Unregister those of `worker_ids` whose processing list of `queue` is gone."""
        if not worker_ids:
            return 0
        keys = QueueKeys(queue)
        return int(self._script("forget_holders",
                                [keys.holders, *(keys.processing(w) for w in worker_ids)],
                                list(worker_ids)))

    def list_range(self, key: str, start: int, stop: int) -> list[str]:
        with self._guard():
            return self.client.lrange(key, start, stop)

    def snapshot(self, dest: str, sources: Sequence[str], ttl_s: int) -> int:
        return int(self._script("snapshot", [dest, *sources], [ttl_s]))

    def scan_set(self, key: str, count: int = 5000) -> Iterator[list[str]]:
        """Yield a set's members in chunks (SSCAN), so memory stays bounded."""
        cursor = 0
        while True:
            with self._guard():
                cursor, members = self.client.sscan(key, cursor, count=count)
            if members:
                yield list(members)
            if cursor == 0:
                return

    def members(self, key: str, ids: Sequence[str]) -> list[bool]:
        if not ids:
            return []
        with self._guard():
            return [bool(x) for x in self.client.smismember(key, list(ids))]

    def take(self, key: str, ids: Sequence[str]) -> list[bool]:
        """Which of `ids` the set `key` holds, removing them from it, in one round trip."""
        if not ids:
            return []
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.smismember(key, list(ids))
            pipe.srem(key, *ids)
            present, _ = pipe.execute()
        return [bool(x) for x in present]

    def schedule_many(self, queue: str, entries: Sequence[tuple[str, int]], *,
                      retry: bool = False) -> None:
        """Hold (id, due_ms) entries in the retry or scheduled set, in one round trip."""
        if not entries:
            return
        keys = QueueKeys(queue)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.retry if retry else keys.scheduled,
                      {str(job_id): due_ms for job_id, due_ms in entries})
            pipe.sadd(QUEUES_SET, queue)
            pipe.execute()

    def restore_dead(self, queue: str, ids: Sequence[str]) -> None:
        """Put dead jobs' ids back in the queue's DLQ list (after Redis lost them)."""
        if not ids:
            return
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.lpush(QueueKeys(queue).dlq, *map(str, ids))
            pipe.sadd(QUEUES_SET, queue)
            pipe.execute()

    def unschedule_many(self, queue: str, ids: Sequence[str]) -> tuple[int, int]:
        """Drop ids from the retry and scheduled sets; returns (removed from retry, scheduled)."""
        if not ids:
            return 0, 0
        keys = QueueKeys(queue)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.retry, *map(str, ids))
            pipe.zrem(keys.scheduled, *map(str, ids))
            retry, scheduled = pipe.execute()
        return int(retry), int(scheduled)

    def collect(self, key: str, ids: Sequence[str], ttl_s: int) -> None:
        """Add ids to a temporary working set that expires after ttl_s seconds."""
        if not ids:
            return
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.sadd(key, *map(str, ids))
            pipe.expire(key, ttl_s)
            pipe.execute()

    def discard(self, drop_key: str, lists: Sequence[str]) -> int:
        """Remove every id of the set `drop_key` from `lists`, one pass per list; returns the
        number of entries removed."""
        if not lists:
            return 0
        return int(self._script("discard", [drop_key, *lists], [DISCARD_MARKER]))

    def remove_all(self, key: str, ids: Sequence[str]) -> int:
        """Remove every copy of `ids` from one short list (a processing list); returns the count."""
        if not ids:
            return 0
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.lrem(key, 0, str(job_id))
            return sum(int(n) for n in pipe.execute())

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            with self._guard():
                self.client.delete(*keys)

    def depths(self, queue: str) -> dict[str, object]:
        """Lengths of a queue's ready (per priority), processing, retry, scheduled and DLQ."""
        keys = QueueKeys(queue)
        processing = self.processing_lists(queue)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for key in keys.ready_by_urgency:
                pipe.llen(key)
            for key in processing:
                pipe.llen(key)
            pipe.zcard(keys.retry)
            pipe.zcard(keys.scheduled)
            pipe.llen(keys.dlq)
            values = pipe.execute()
        ready = dict(zip(range(9, -1, -1), values[:10], strict=True))
        return {"ready": ready, "processing": sum(values[10:10 + len(processing)]),
                "retry": values[-3], "scheduled": values[-2], "dlq": values[-1]}

    def processing_lists_of(self, queues: Sequence[str]) -> dict[str, list[str]]:
        """`processing_lists` of many queues at once: their holders in one pipeline and, on a
        single Redis, one SCAN for all of them, so the cost grows with the keys, not with
        the queues times the keys."""
        found: dict[str, set[str]] = {}
        with self._guard():
            with self.client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.smembers(QueueKeys(queue).holders)
                for queue, holders in zip(queues, pipe.execute(), strict=True):
                    found[queue] = {QueueKeys(queue).processing(w) for w in holders}
            if not self.cluster:
                for key in self.client.scan_iter(match=PROCESSING_PATTERN, count=1000):
                    queue = key[len(PREFIX) + 2:key.find("}:processing:")]
                    if queue in found:
                        found[queue].add(key)
        return {queue: sorted(keys) for queue, keys in found.items()}

    def depths_of(self, queues: Sequence[str], lists: dict[str, list[str]] | None = None
                  ) -> dict[str, dict[str, object]]:
        """`depths` of many queues in a few round trips, whatever their number (`lists`: their
        processing_lists_of, when the caller has them)."""
        queues = list(queues)
        lists = self.processing_lists_of(queues) if lists is None else lists
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for queue in queues:
                keys = QueueKeys(queue)
                for key in [*keys.ready_by_urgency, *lists[queue]]:
                    pipe.llen(key)
                pipe.zcard(keys.retry)
                pipe.zcard(keys.scheduled)
                pipe.llen(keys.dlq)
            values = iter(pipe.execute())
        out: dict[str, dict[str, object]] = {}
        for queue in queues:
            ready = {p: next(values) for p in range(9, -1, -1)}
            processing = sum(next(values) for _ in lists[queue])
            out[queue] = {"ready": ready, "processing": processing, "retry": next(values),
                          "scheduled": next(values), "dlq": next(values)}
        return out

    def ping(self) -> None:
        with self._guard():
            if isinstance(self.client, RedisCluster):
                self.client.execute_command("PING", target_nodes=RedisCluster.PRIMARIES)
            else:
                self.client.ping()

    # --- the rebuild marker (dispatch from PostgreSQL ends when it is fresh) ---------------

    def dispatch_marker(self) -> str | None:
        """The rebuild marker, `<writer token>:<epoch ms>`, or None when Redis lacks it."""
        with self._guard():
            return self.client.get(DISPATCH_MARKER)

    def set_dispatch_marker(self, value: str) -> None:
        with self._guard():
            self.client.set(DISPATCH_MARKER, value)

    def renew_dispatch_marker(self, expected: str, value: str) -> bool:
        """Replace the marker by `value` only while it holds `expected`; whether it did."""
        return bool(self._script("renew_marker", [DISPATCH_MARKER], [expected, value]))


def _fetch_call(queue: str, worker_id: str, count: int) -> tuple[list[str], list[object]]:
    """KEYS and ARGV of the fetch script for `count` ids of `queue` (see lua/fetch.lua)."""
    keys = QueueKeys(queue)
    return ([keys.processing(worker_id), keys.signal, keys.paused, keys.holders,
             *keys.ready_by_urgency], [count, SIGNAL_MAX, worker_id])


def _lua(name: str) -> str:
    return resources.files("taskline.dispatch").joinpath(f"lua/{name}.lua").read_text()
