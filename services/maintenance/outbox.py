"""The outbox relay: hands Redis the jobs applications enqueued inside their own transactions.

`taskline.enqueue(conn, ...)` writes a job with an `enqueue_outbox` row, signals
`NOTIFY taskline_enqueued, '<queue>'` and announces the job on `taskline_enqueued_jobs` (its
id, priority, status, due time and queue), all effective only when the application commits.
This component LISTENs on both channels on a connection of its own. An announced job is pushed
to Redis at once (`Dispatcher.follow`, the step of the job's creating move), with no read of
the outbox on the way, and only then is its row deleted: the rows of the ids pushed within
`FORGET_AFTER_S` of the first go in one statement, so a stream of single enqueues costs the
database one delete per interval rather than one per signal. A drain first deletes the rows of
what was pushed, then reads the outbox (oldest first), pushes what it holds and deletes those
rows: at the start, after every (re)LISTEN, at least every `backstop_s`, and for a queue
signal no announcement explains. A job with an ordering key is pushed only when it is its
key's head (one read, for such jobs only), as the API pushes its own enqueues; the others are
forgotten, and the turn passing to them pushes them.

Invariant: no committed outbox row is lost and none waits for reconciliation. Push comes before
delete, so a crash between the two (or a failed turn, which forgets the ids awaiting their
delete) pushes an id twice, which the claim tolerates (one claimer wins, the other drops it),
and never drops one. Signals sent while nobody listened are gone but their rows are not, and
the drain after every LISTEN finds them, so a job waits at most about
`backstop_s` when the listener was down, restarting or taken over by another instance; a
transaction that stayed open for minutes is signalled at its commit like any other (rows, not a
created_at watermark, say what is owed). Only the active maintenance instance relays.

LISTEN needs a session of its own: behind a transaction-pooling PgBouncer without
TASKLINE_DATABASE_DIRECT_URL there is none (`database_url` None), and the relay drains every
`backstop_s` instead (a job then waits for Redis at most that long, not milliseconds).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg

from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import StoreUnavailable
from taskline.jobs import Status
from taskline.metrics import OUTBOX_RELAYED, LabelGuard
from taskline.mirror import Mirror
from taskline.service import IDLE_POLL_S, Periodic, always, guarded
from taskline.store import caller
from taskline.store.params import uuid_array
from taskline.store.queries import channel
from taskline.store.rows import Owed
from taskline.store.views import MaintenanceStore
from taskline.transitions import Committed

log = logging.getLogger(__name__)

BACKSTOP_S = 0.5
"""Longest time between two drains, seconds, signals or not."""
WAKE_S = 0.1
"""Longest wait for a signal before checking for stop, leadership and the backstop, seconds."""
RECONNECT_S = 1.0
"""Pause after a failed turn (PostgreSQL or Redis unreachable) before listening again."""
PAGE_SIZE = 1000
"""Outbox rows relayed per round; a drain pages until the outbox is empty."""
FORGET_AFTER_S = 0.05
"""Longest a pushed id's outbox row waits for its delete, seconds, unless a page's worth of ids
is waiting first."""


@dataclass(frozen=True)
class RelayResult:
    """Counts of one drain: ids pushed to Redis, rows forgotten (their jobs no longer wait)."""

    pushed: int = 0
    forgotten: int = 0

    @property
    def changed(self) -> bool:
        return self.pushed > 0 or self.forgotten > 0


class OutboxRelay(Periodic):
    """LISTENs for committed in-transaction enqueues and pushes their ids to Redis."""

    name = "outbox"

    def __init__(self, store: MaintenanceStore, dispatcher: Dispatcher, database_url: str | None, *,
                 backstop_s: float = BACKSTOP_S, page_size: int = PAGE_SIZE,
                 forget_after_s: float = FORGET_AFTER_S,
                 queues: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.queue_label = queues or LabelGuard()
        self.store = store
        # The installation's own channels: another schema's signals in one database are not ours.
        self._channel = channel(store.schema, "enqueued")
        self._jobs_channel = channel(store.schema, "enqueued_jobs")
        self.dispatcher = dispatcher
        self.mirror = Mirror.of(dispatcher, store)
        self.database_url = database_url
        """Where to LISTEN (a session of its own); None: drain every backstop_s instead."""
        self.backstop_s = backstop_s
        self.page_size = page_size
        self.forget_after_s = forget_after_s
        self.listens = 0
        """How many times this relay has (re)started listening: tests wait on it."""
        self._listener: psycopg.Connection | None = None
        self._last_drain = 0.0
        self._pushed: list[str] = []
        """Ids pushed (or found not waiting) whose outbox rows are still to be deleted."""
        self._forget_by = 0.0

    @property
    def interval_s(self) -> float:
        return self.backstop_s

    def run_once(self) -> RelayResult:
        """Drain the outbox: push every owed id, then forget its row."""
        self._forget_pushed()  # so the read below finds none of them to push again
        pushed = forgotten = 0
        while True:
            page = self._page()
            changes = self._owed_pushes(page)
            # Strict: an owed row is forgotten only once its id is in Redis.
            self.mirror.follow(changes, action="outbox_relay", strict=True)
            self._forget([owed.job_id for owed in page])
            self._count(changes)
            pushed, forgotten = pushed + len(changes), forgotten + len(page) - len(changes)
            if len(page) < self.page_size:
                break
        self._last_drain = time.monotonic()
        if pushed:
            log.info("relayed %d jobs enqueued in application transactions", pushed,
                     extra={"action": "outbox", "jobs": pushed})
        return RelayResult(pushed, forgotten)

    def _page(self) -> list[Owed]:
        """The next outbox rows: read on the listening connection when there is one (already
        open, its statements prepared: no pool round trip on the path to Redis)."""
        if self._listener is None:
            return self.store.outbox_page(self.page_size)
        with self._translated():
            return [Owed.from_row(r) for r in caller.run(self._listener, "outbox_page",
                                                         {"limit": self.page_size},
                                                         self.store.schema)]

    def _forget(self, ids: list[str]) -> None:
        if self._listener is None:
            self.store.delete_outbox(ids)
        elif ids:
            with self._translated():
                caller.run(self._listener, "delete_outbox", {"ids": uuid_array(ids)},
                           self.store.schema)

    def run(self, stop: threading.Event, active: Callable[[], bool] = always) -> None:
        """Listen while active, drain on each signal and backstop; stop listening when not."""
        if self.database_url is None:
            log.info("no session to LISTEN on (a transaction pooler and no direct URL): the "
                     "outbox is drained every %g s", self.backstop_s, extra={"action": "outbox"})
        try:
            while not stop.is_set():
                if not active():
                    self._forget_quietly()
                    self._close()
                    stop.wait(IDLE_POLL_S)
                    continue
                ok, result = guarded(self.name, self._turn)
                if not ok:
                    self._pushed.clear()  # their rows stay owed: the next drain pushes again
                    self._close()
                    self.passes.done(False, None)
                    stop.wait(RECONNECT_S)
                elif result is not None:
                    self.passes.done(True, result)
        finally:
            self._forget_quietly()
            self._close()

    def _turn(self) -> RelayResult | None:
        """One turn: listen if not yet (then drain), else wait briefly for signals and answer
        them, or drain when the backstop is due. None when there was nothing to do."""
        if self.database_url is None:
            return self._poll()
        if self._listener is None:
            self._listener = self._listen()
            return self.run_once()
        with self._translated():
            signals = list(self._listener.notifies(timeout=self._wait_s(), stop_after=1))
            if signals:  # signals already here as well are answered in this same turn
                signals += self._listener.notifies(timeout=0)
        result = self._answer(signals) if signals else None
        if self._pushed and (time.monotonic() >= self._forget_by
                             or len(self._pushed) >= self.page_size):
            self._forget_pushed()
        if result is not None:
            return result
        if time.monotonic() - self._last_drain >= self.backstop_s:
            return self.run_once()
        return None

    def _poll(self) -> RelayResult | None:
        """A turn without a listener: drain when the backstop is due, else sleep towards it
        (at most WAKE_S, so stop and leadership are noticed as promptly as when listening)."""
        wait_s = self.backstop_s - (time.monotonic() - self._last_drain)
        if wait_s > 0:
            time.sleep(min(wait_s, WAKE_S))
            return None
        return self.run_once()

    def _answer(self, signals: list[psycopg.Notify]) -> RelayResult:
        """Push the jobs the signals announce, then forget their rows: no outbox read on the
        way to Redis. A queue signal with no announced job of its queue among them (a writer
        that does not announce) drains the outbox instead."""
        announced = [owed for owed in (Owed.from_announcement(n.payload) for n in signals
                                       if n.channel == self._jobs_channel)
                     if owed is not None]
        queues = {owed.queue for owed in announced}
        if any(n.channel == self._channel and n.payload not in queues for n in signals):
            return self.run_once()
        changes = self._owed_pushes(announced)
        self.mirror.follow(changes, action="outbox_relay", strict=True)
        if announced and not self._pushed:
            self._forget_by = time.monotonic() + self.forget_after_s
        self._pushed += [owed.job_id for owed in announced]
        self._count(changes)
        return RelayResult(len(changes), len(announced) - len(changes))

    def _owed_pushes(self, owed: list[Owed]) -> list[Committed]:
        """What Redis is owed for these jobs: each one still waiting to start, except keyed
        jobs behind their key's head (judged now, after their commit, as the API judges its
        own enqueues): pushed, each would be fetched, refused and acked away; the turn's push
        brings it when its time comes, so its row is simply forgotten."""
        changes = {o.job_id: c for o in owed if (c := o.committed()) is not None}
        keyed = [o.job_id for o in owed if o.keyed and o.status is Status.QUEUED
                 and o.job_id in changes]
        if keyed:
            try:
                heads = self.store.keyed_heads_among(keyed)
            except StoreUnavailable:
                heads = set(keyed)  # pushed all: the claim refuses those behind their head
            for job_id in set(keyed) - heads:
                del changes[job_id]
        return list(changes.values())

    def _wait_s(self) -> float:
        """How long a turn may wait for a signal: until the pending deletes are due."""
        if not self._pushed:
            return WAKE_S
        return min(WAKE_S, max(0.0, self._forget_by - time.monotonic()))

    def _forget_pushed(self) -> None:
        """Delete the rows of every id pushed so far, in one statement."""
        if self._pushed:
            pushed, self._pushed = self._pushed, []
            self._forget(pushed)

    def _forget_quietly(self) -> None:
        """Delete the pushed ids' rows before the listener closes, if PostgreSQL still
        answers; if not, their rows stay owed and are pushed once more, which is harmless."""
        with contextlib.suppress(Exception):
            self._forget_pushed()
        self._pushed.clear()

    def _count(self, changes: list[Committed]) -> None:
        for queue, count in Counter(c.queue for c in changes).items():
            OUTBOX_RELAYED.labels(queue=self.queue_label(queue)).inc(count)

    def _listen(self) -> psycopg.Connection:
        assert self.database_url is not None
        with self._translated():
            conn = psycopg.connect(self.database_url, autocommit=True, connect_timeout=5,
                                   keepalives=1, keepalives_idle=5, keepalives_interval=2,
                                   keepalives_count=3, application_name="taskline-outbox")
            try:
                conn.execute(f"LISTEN {self._channel}")
                conn.execute(f"LISTEN {self._jobs_channel}")
            except BaseException:
                conn.close()
                raise
        self.listens += 1
        log.info("listening for in-transaction enqueues", extra={"action": "outbox"})
        return conn

    def _close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                listener.close()

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except psycopg.OperationalError as err:
            raise StoreUnavailable(f"PostgreSQL unavailable: {type(err).__name__}") from err
