"""The dispatcher: every Redis operation taskline performs, over one non-retrying client.

Redis moves ids only; PostgreSQL decides. The client never retries a command on its own:
a retried LMOVE whose first reply was lost would strand an id (reconciliation repairs that,
but we do not manufacture it). Connection errors surface as DispatchUnavailable.

On Redis Cluster (detected from the URL's node, taskline.dispatch.connection) every command
touches one slot: a Lua script runs per call (a cluster pipeline cannot carry EVALSHA), and a
worker waits on each of its queues apart (taskline.dispatch.waits), never on keys of several.
A plain client that meets a MOVED turns this dispatcher to cluster mode for the next call.

With TASKLINE_QUEUE_PARTITIONS = N > 1 a queue's keys are N partitions (taskline.dispatch.keys):
an id lives in its home partition (a hash of the id), a fetch takes from every partition in
turn, and counts and markers cover them all. An id fetched from a partition other than its
home (N changed while it waited) is remembered until its ack, so the ack finds its list.
With N = 1 every key and round trip is what it was without partitions.
"""

from __future__ import annotations

import contextlib
import itertools
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
    partition_of,
    split_partition,
    worker_key,
)
from taskline.dispatch.waits import QueueWaits
from taskline.errors import DispatchUnavailable
from taskline.transitions import Committed

__all__ = ["DISCARD_MARKER", "SIGNAL_MAX", "Dispatcher", "make_client", "translate_errors"]

SIGNAL_MAX = 64
HELD_MARKER_MS = 1000
_SCRIPTS = ("fetch", "push", "ack", "promote", "retry_later", "dead_letter", "requeue", "snapshot",
            "discard", "drop_dead", "renew_marker", "forget_holders")
PROBE_TIMEOUT_S = 1.0
"""Connect and reply timeout of the breaker's probe, seconds."""
# Stands in for an entry being discarded; job ids are UUIDs, so no id can equal it.
DISCARD_MARKER = "taskline:discarded"


class Dispatcher:
    """Redis side of taskline: pushes, fetches, acks and moves job ids between structures."""

    def __init__(self, url: str, block_timeout_s: float = 1.0, *, timeout_s: float = 5.0,
                 breaker: bool = False, partitions: int = 1) -> None:
        """`timeout_s` bounds every reply (a blocked wait: its block plus this), so a silent
        link is noticed within it. With `breaker`, a failure makes every call of this
        dispatcher fail at once until Redis answers a probe again (taskline.dispatch.breaker).
        `partitions`: TASKLINE_QUEUE_PARTITIONS.
        """
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.partitions = partitions
        self._away: dict[str, int] = {}
        """Ids fetched from a partition other than their home, until acked: that partition."""
        self._known: dict[str, set[int]] = {}
        """Partitions above N-1 found in the queues set by the last known_queues()."""
        self._turn = itertools.count()
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
        """Run script `name` by its SHA. Straight through `evalsha`, not the Script object's
        call, which checks the client's class against redis-py's pipelines on every call (a
        share of a fetch's Python); a Redis that lost its scripts (restarted, failed over)
        answers NOSCRIPT, and the Script object then loads it and runs it again."""
        script = self._scripts[name]
        with self._guard():
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                return script(keys=list(keys), args=list(args))

    def _blpop(self, key: str, timeout_s: float) -> object:
        return self.blocking_client.blpop([key], timeout=timeout_s)

    def follow(self, changes: Iterable[Committed]) -> None:
        """Mirror committed transitions: each move's Redis step (taskline.dispatch.follow)."""
        follow.follow(self, changes)

    # --- partitions ----------------------------------------------------------------------

    def _part(self, job_id: str) -> int:
        """The partition holding `job_id` as far as this process knows: where it fetched it
        from, else the id's home."""
        if self.partitions == 1 and not self._away:
            return 0
        return self._away.get(str(job_id), partition_of(job_id, self.partitions))

    def _keys(self, queue: str, job_id: str, partition: int | None = None) -> QueueKeys:
        return QueueKeys(queue, self._part(job_id) if partition is None else partition)

    def _settled(self, job_id: str) -> None:
        """The id left this process's processing list: forget where it was fetched from."""
        if self._away:
            self._away.pop(str(job_id), None)

    def partitions_of(self, queue: str) -> list[int]:
        """The partitions of `queue` to look at: 0..N-1 and any higher one the queues set
        named at the last known_queues() (left by a larger N, until reconciliation empties
        them)."""
        extra = self._known.get(queue)
        if not extra:
            return list(range(self.partitions))
        return sorted(set(range(self.partitions)) | extra)

    def _lanes(self, queue: str) -> list[QueueKeys]:
        return [QueueKeys(queue, p) for p in self.partitions_of(queue)]

    # --- producer and promoter -----------------------------------------------------------

    def push(self, jobs: Iterable[tuple[str, int, str]]) -> int:
        """Make (queue, priority, id) dispatchable, in order, in one pipelined round trip
        (the push script per queue, partition and priority, then the queues' registration)."""
        groups: dict[tuple[str, int, int], list[str]] = defaultdict(list)
        n = self.partitions
        for queue, priority, job_id in jobs:
            groups[(queue, partition_of(job_id, n) if n > 1 else 0, priority)].append(
                str(job_id))
        if not groups:
            return 0
        if self.cluster:
            return self._push_per_group(groups)
        calls, names = [], set()
        for (queue, partition, priority), ids in groups.items():
            keys = QueueKeys(queue, partition)
            calls.append(([keys.ready(priority), keys.signal], [SIGNAL_MAX, *ids]))
            names.add(keys.name)
        self._pipelined("push", calls, [("SADD", QUEUES_SET, *names)])
        return sum(len(ids) for ids in groups.values())

    def _push_per_group(self, groups: dict[tuple[str, int, int], list[str]]) -> int:
        """Cluster mode: one script call per group (each group is one slot), in order, then
        the queues' registration (the Script object reloads a script a node lacks)."""
        for (queue, partition, priority), ids in groups.items():
            keys = QueueKeys(queue, partition)
            self._script("push", [keys.ready(priority), keys.signal], [SIGNAL_MAX, *ids])
        with self._guard():
            self.client.sadd(QUEUES_SET, *{QueueKeys(q, p).name for q, p, _ in groups})
        return sum(len(ids) for ids in groups.values())

    def _pipelined(self, name: str, calls: Sequence[tuple[list[str], Sequence[object]]],
                   after: Sequence[tuple[object, ...]] = ()) -> None:
        """Script `name` once per (keys, args) call, in order, then the commands `after` (sent
        the first time only), in one round trip; a single Redis only (cluster mode sends each
        call to its slot's node through `_script`).

        The script goes by EVALSHA straight into the pipeline: handing redis-py the Script
        object would make it send SCRIPT EXISTS first, a second round trip per call. A call
        Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH) did not run at all, so
        exactly those calls are sent again once the script is loaded.
        """
        with self._guard():
            missed = self._pipeline_once(name, calls, after)
            if missed:
                self.client.script_load(self._scripts[name].script)
                if self._pipeline_once(name, missed, ()):
                    raise DispatchUnavailable(f"Redis lost the {name} script while running it")

    def _pipeline_once(self, name: str, calls: Sequence[tuple[list[str], Sequence[object]]],
                       after: Sequence[tuple[object, ...]]
                       ) -> list[tuple[list[str], Sequence[object]]]:
        """One round trip of `_pipelined`; the calls answered NOSCRIPT. Any other error reply
        is raised."""
        sha = self._scripts[name].sha
        with self.client.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(sha, len(keys), *keys, *args)
            for command in after:
                pipe.execute_command(*command)
            replies = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, redis.ResponseError) and not isinstance(reply, NoScriptError):
                raise reply
        # The replies of `after`, when sent, are the extra ones at the end.
        return [call for call, reply in zip(calls, replies, strict=False)
                if isinstance(reply, NoScriptError)]

    def schedule(self, queue: str, job_id: str, due_ms: int, *, retry: bool = False) -> None:
        """Hold a job in the scheduled (delayed first run) or retry set until it is due."""
        keys = QueueKeys(queue, partition_of(job_id, self.partitions))
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.retry if retry else keys.scheduled, {str(job_id): due_ms})
            pipe.sadd(QUEUES_SET, keys.name)
            pipe.execute()

    def _by_home(self, queue: str, ids: Iterable[str]) -> dict[QueueKeys, list[str]]:
        """`ids` grouped by their home partition's keys, in their order."""
        groups: dict[QueueKeys, list[str]] = defaultdict(list)
        for job_id in ids:
            groups[QueueKeys(queue, partition_of(job_id, self.partitions))].append(str(job_id))
        return groups

    def promote(self, queue: str, priority: int, ids: Sequence[str]) -> int:
        """Move due ids from their home partition's retry and scheduled sets to its ready
        list (an entry left in another partition by a change of N is dropped by
        reconciliation: the job is no longer waiting)."""
        pushed = 0
        for keys, group in self._by_home(queue, ids).items():
            pushed += int(self._script("promote", [keys.ready(priority), keys.retry,
                                                   keys.scheduled, keys.signal],
                                       [SIGNAL_MAX, *group]))
        return pushed

    def unschedule(self, queue: str, job_id: str) -> None:
        """Forget a cancelled job's delayed or retry entry (ready-list copies die at claim)."""
        keys = QueueKeys(queue, partition_of(job_id, self.partitions))
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.retry, str(job_id))
            pipe.zrem(keys.scheduled, str(job_id))
            pipe.execute()

    def remove_from_dlq(self, queue: str, job_id: str) -> None:
        with self._guard():
            self.client.lrem(QueueKeys(queue, partition_of(job_id, self.partitions)).dlq, 0,
                             str(job_id))

    def drop_dead(self, queue: str, ids: Sequence[str]) -> int:
        """Remove deleted dead jobs' ids from the queue's DLQ list, reading from its tail
        (where the oldest are) only as far as needed; returns the entries removed."""
        if not ids:
            return 0
        return sum(int(self._script("drop_dead", [keys.dlq], [DISCARD_MARKER, *group]))
                   for keys, group in self._by_home(queue, ids).items())

    # --- worker --------------------------------------------------------------------------

    def fetch(self, queue: str, worker_id: str, count: int) -> list[str]:
        """Move up to `count` ids, most urgent first, into this worker's processing list (with
        partitions: from each partition in turn, starting at the next one each call, so no
        partition waits behind a busy one)."""
        if self.partitions == 1 and not self._known:
            return list(self._script("fetch", *_fetch_call(QueueKeys(queue), worker_id, count)))
        lanes = self._lanes(queue)
        start = next(self._turn) % len(lanes)
        fetched: list[str] = []
        for keys in lanes[start:] + lanes[:start]:
            ids = list(self._script("fetch", *_fetch_call(keys, worker_id,
                                                          count - len(fetched))))
            for job_id in ids:
                if partition_of(job_id, self.partitions) != keys.partition:
                    self._away[job_id] = keys.partition
                elif self._away:
                    self._away.pop(job_id, None)  # fetched at home again
            fetched += ids
            if len(fetched) >= count:
                break
        return fetched

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
                self._waits.wait([k.signal for q in queues for k in self._lanes(q)], wait)
            return self.fetch(queues[0], worker_id, count)
        if self.partitions > 1 or self._known:
            # A signal taken may be any partition's: fetch from all of them after the wake.
            with self._guard():
                self.blocking_client.blpop([k.signal for q in queues for k in self._lanes(q)],
                                           timeout=wait)
            return self.fetch(queues[0], worker_id, count)
        keys, args = _fetch_call(QueueKeys(queues[0]), worker_id, count)
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

    def ack(self, items: Iterable[tuple[str, str]], worker_id: str, *,
            partition: int | None = None) -> None:
        """Drop (queue, id) pairs from this worker's processing lists in one round trip
        (`partition`: the lists of that partition, else each id's, see _part).

        Each LREM searches from the tail: fetches push at the head, so the jobs that finish
        first, the oldest fetched, sit at the tail of a list holding up to the lease cap.
        """
        items = list(items)
        if not items:
            return
        # One script call per processing list: a settled batch is mostly one queue's, and a
        # call costs redis-py a command's work however many ids it carries.
        lists: dict[str, list[str]] = defaultdict(list)
        for queue, job_id in items:
            lists[self._keys(queue, job_id, partition).processing(worker_id)].append(str(job_id))
        if self.cluster or len(lists) == 1:
            for key, ids in lists.items():
                self._script("ack", [key], ids)
        else:
            self._pipelined("ack", [([key], ids) for key, ids in lists.items()])
        if self._away:
            for _, job_id in items:
                self._settled(job_id)

    def retry_later(self, queue: str, worker_id: str, job_id: str, due_ms: int) -> None:
        """Move an id from this worker's processing list to its partition's retry set (a
        script keeps both in one slot; a retry is due in its fetched partition, where every
        worker serving the queue finds it)."""
        keys = self._keys(queue, job_id)
        self._script("retry_later", [keys.processing(worker_id), keys.retry], [job_id, due_ms])
        self._settled(job_id)

    def dead_letter(self, queue: str, worker_id: str, job_id: str) -> None:
        keys = self._keys(queue, job_id)
        self._script("dead_letter", [keys.processing(worker_id), keys.dlq], [job_id])
        self._settled(job_id)

    def requeue(self, queue: str, priority: int, job_id: str, from_worker: str, *,
                always: bool, partition: int | None = None) -> bool:
        """Move an id from a worker's processing list back to ready (next to be taken), both
        of `partition` (default: the id's, see _part)."""
        keys = self._keys(queue, job_id, partition)
        self._settled(job_id)
        pushed = self._script("requeue", [keys.processing(from_worker), keys.ready(priority),
                                          keys.signal],
                              [job_id, "always" if always else "if_present", SIGNAL_MAX])
        return bool(pushed)

    def hold_back(self, held: Sequence[tuple[str, int, str]], worker_id: str) -> None:
        """Put ids a claim refused because their queue is paused back where they were fetched
        from, in the order given (most urgent first), and mark their queues paused, so no
        worker fetches them again until the queue resumes."""
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for keys in {self._keys(queue, job_id) for queue, _, job_id in held}:
                # Expiring and never replacing an operator's marker: a resume racing this
                # claim is at most HELD_MARKER_MS late, and maintenance restores the lasting one.
                pipe.set(keys.paused, "1", px=HELD_MARKER_MS, nx=True)
            pipe.execute()
        for queue, priority, job_id in reversed(held):
            self.requeue(queue, priority, job_id, worker_id, always=False)

    def mark_paused(self, queue: str, paused: bool) -> None:
        """Set or clear a queue's pause marker (one per partition); clearing also wakes the
        queue's idle workers."""
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for keys in self._lanes(queue):
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
                for keys in self._lanes(queue):
                    pipe.lpush(keys.signal, "1")
                    pipe.ltrim(keys.signal, 0, SIGNAL_MAX - 1)
            pipe.execute()

    def paused_markers(self, queues: Iterable[str]) -> set[str]:
        """The queues among `queues` whose pause marker is set (in every partition: one
        lacking it counts as unmarked, so maintenance writes them all again)."""
        lanes = [(q, keys) for q in queues for keys in self._lanes(q)]
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for _, keys in lanes:
                pipe.exists(keys.paused)
            present = pipe.execute()
        unmarked = {q for (q, _), here in zip(lanes, present, strict=True) if not here}
        return {q for q, _ in lanes} - unmarked

    def heartbeat(self, worker_id: str, ttl_s: float) -> None:
        with self._guard():
            self.client.set(worker_key(worker_id), "1", px=max(int(ttl_s * 1000), 1))

    def forget_worker(self, worker_id: str) -> None:
        with self._guard():
            self.client.delete(worker_key(worker_id))

    # --- maintenance and queries ---------------------------------------------------------

    def known_queues(self) -> set[str]:
        """The queues the queues set names; partitions above N-1 it names are remembered for
        partitions_of."""
        with self._guard():
            names = self.client.smembers(QUEUES_SET)
        queues: set[str] = set()
        known: dict[str, set[int]] = defaultdict(set)
        for name in names:
            queue, partition = split_partition(name)
            queues.add(queue)
            if partition >= self.partitions:
                known[queue].add(partition)
        self._known = dict(known)
        return queues

    def forget_partition(self, queue: str, partition: int) -> None:
        """Take an emptied partition above N-1 out of the queues set (a push there by a
        process with a larger N adds it back)."""
        with self._guard():
            self.client.srem(QUEUES_SET, QueueKeys(queue, partition).name)
        self._known.get(queue, set()).discard(partition)

    def processing_lists(self, queue: str) -> list[str]:
        """Every processing list of `queue`: on a single Redis those SCAN finds (as before
        workers registered themselves), on a cluster those of its registered holders."""
        found: set[str] = set()
        with self._guard():
            for keys in self._lanes(queue):
                if not self.cluster:  # SCAN finds the registered lists too, and older ones
                    found.update(self.client.scan_iter(match=keys.processing_pattern,
                                                       count=1000))
                else:
                    found.update(keys.processing(w)
                                 for w in self.client.smembers(keys.holders))
        return sorted(found)

    def forget_holders(self, queue: str, worker_ids: Sequence[str], partition: int = 0) -> int:
        """Unregister those of `worker_ids` whose processing list of `queue` is gone."""
        if not worker_ids:
            return 0
        keys = QueueKeys(queue, partition)
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
        homes = self._by_home(queue, [job_id for job_id, _ in entries])
        due = {str(job_id): due_ms for job_id, due_ms in entries}
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for keys, ids in homes.items():
                pipe.zadd(keys.retry if retry else keys.scheduled, {i: due[i] for i in ids})
                pipe.sadd(QUEUES_SET, keys.name)
            pipe.execute()

    def restore_dead(self, queue: str, ids: Sequence[str]) -> None:
        """Put dead jobs' ids back in the queue's DLQ list (after Redis lost them)."""
        if not ids:
            return
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for keys, group in self._by_home(queue, ids).items():
                pipe.lpush(keys.dlq, *group)
                pipe.sadd(QUEUES_SET, keys.name)
            pipe.execute()

    def unschedule_many(self, queue: str, ids: Sequence[str], partition: int | None = None
                        ) -> tuple[int, int]:
        """Drop ids from the retry and scheduled sets (of `partition`, else of each id's
        home); returns (removed from retry, scheduled)."""
        if not ids:
            return 0, 0
        groups = ({QueueKeys(queue, partition): list(map(str, ids))} if partition is not None
                  else self._by_home(queue, ids))
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for keys, group in groups.items():
                pipe.zrem(keys.retry, *group)
                pipe.zrem(keys.scheduled, *group)
            replies = pipe.execute()
        return sum(int(n) for n in replies[0::2]), sum(int(n) for n in replies[1::2])

    def delayed_entries(self, queue: str, partition: int) -> list[tuple[str, int, bool]]:
        """(id, due ms, is a retry) of every entry of one partition's retry and scheduled
        sets: what a retired partition still holds."""
        keys = QueueKeys(queue, partition)
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            pipe.zrange(keys.retry, 0, -1, withscores=True)
            pipe.zrange(keys.scheduled, 0, -1, withscores=True)
            retry, scheduled = pipe.execute()
        return ([(i, int(due), True) for i, due in retry]
                + [(i, int(due), False) for i, due in scheduled])

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
        """Lengths of a queue's ready (per priority), processing, retry, scheduled and DLQ,
        summed over its partitions."""
        return self.depths_of([queue], {queue: self.processing_lists(queue)})[queue]

    def depths_in(self, keys: QueueKeys, processing: Sequence[str] = ()) -> dict[str, object]:
        """`depths` of one partition, counting the processing lists given."""
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for key in [*keys.ready_by_urgency, *processing]:
                pipe.llen(key)
            pipe.zcard(keys.retry)
            pipe.zcard(keys.scheduled)
            pipe.llen(keys.dlq)
            values = pipe.execute()
        return {"ready": dict(zip(range(9, -1, -1), values[:10], strict=True)),
                "processing": sum(values[10:-3]), "retry": values[-3], "scheduled": values[-2],
                "dlq": values[-1]}

    def processing_lists_of(self, queues: Sequence[str]) -> dict[str, list[str]]:
        """`processing_lists` of many queues at once: their holders in one pipeline and, on a
        single Redis, one SCAN for all of them, so the cost grows with the keys, not with
        the queues times the keys."""
        found: dict[str, set[str]] = {queue: set() for queue in queues}
        lanes = [keys for queue in queues for keys in self._lanes(queue)]
        with self._guard():
            with self.client.pipeline(transaction=False) as pipe:
                for keys in lanes:
                    pipe.smembers(keys.holders)
                for keys, holders in zip(lanes, pipe.execute(), strict=True):
                    found[keys.queue].update(keys.processing(w) for w in holders)
            if not self.cluster:
                for key in self.client.scan_iter(match=PROCESSING_PATTERN, count=1000):
                    queue, _ = split_partition(key[len(PREFIX) + 2:key.find("}:processing:")])
                    if queue in found:
                        found[queue].add(key)
        return {queue: sorted(keys) for queue, keys in found.items()}

    def depths_of(self, queues: Sequence[str], lists: dict[str, list[str]] | None = None
                  ) -> dict[str, dict[str, object]]:
        """`depths` of many queues in a few round trips, whatever their number (`lists`: their
        processing_lists_of, when the caller has them)."""
        queues = list(queues)
        lists = self.processing_lists_of(queues) if lists is None else lists
        lanes = {queue: self._lanes(queue) for queue in queues}
        with self._guard(), self.client.pipeline(transaction=False) as pipe:
            for queue in queues:
                for key in lists[queue]:
                    pipe.llen(key)
                for keys in lanes[queue]:
                    for key in keys.ready_by_urgency:
                        pipe.llen(key)
                    pipe.zcard(keys.retry)
                    pipe.zcard(keys.scheduled)
                    pipe.llen(keys.dlq)
            values = iter(pipe.execute())
        out: dict[str, dict[str, object]] = {}
        for queue in queues:
            depth: dict[str, object] = {"processing": sum(next(values) for _ in lists[queue])}
            ready = dict.fromkeys(range(9, -1, -1), 0)
            retry = scheduled = dlq = 0
            for _ in lanes[queue]:
                for p in range(9, -1, -1):
                    ready[p] += next(values)
                retry += next(values)
                scheduled += next(values)
                dlq += next(values)
            out[queue] = {"ready": ready, **depth, "retry": retry, "scheduled": scheduled,
                          "dlq": dlq}
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


def _fetch_call(keys: QueueKeys, worker_id: str, count: int) -> tuple[list[str], list[object]]:
    """KEYS and ARGV of the fetch script for `count` ids of one partition (lua/fetch.lua)."""
    return ([keys.processing(worker_id), keys.signal, keys.paused, keys.holders,
             *keys.ready_by_urgency], [count, SIGNAL_MAX, worker_id])


def _lua(name: str) -> str:
    return resources.files("taskline.dispatch").joinpath(f"lua/{name}.lua").read_text()
