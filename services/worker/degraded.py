"""Dispatch from PostgreSQL: where a worker takes its jobs from while Redis is unreachable.

Invariant: a worker is in one of two modes. In `redis` mode it fetches ids from Redis and
claims them (the normal path, untouched). The first Redis failure its fetch loop sees switches
it to `postgres` mode: it claims due jobs straight from PostgreSQL (`Store.claim_due_jobs`, the
same claim rule), and an idle loop sleeps on a PostgreSQL LISTEN (`taskline_enqueued`) instead
of Redis, claiming once after every (re)LISTEN and at least every `BACKSTOP_S`, so a lost
notification delays a job by at most that. It returns to `redis` mode only once Redis holds
a rebuild marker at least as new as the instant it left (PostgreSQL's clock): a Redis that came
back empty, or restored from an old snapshot, lacks one, so no job queued meanwhile is left
behind in PostgreSQL while the worker waits on empty ready lists. Either way PostgreSQL's
claim admits one winner per job, so an id claimed here and still present in a rebuilt list is
refused when it is fetched.

LISTEN needs a session of its own: behind a transaction-pooling PgBouncer without
TASKLINE_DATABASE_DIRECT_URL there is none (`database_url` None), and an idle loop in postgres
mode claims every `BACKSTOP_S` instead.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence

import psycopg

from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import dispatch_marker_ms
from taskline.errors import DispatchUnavailable, StoreUnavailable
from taskline.metrics import DISPATCH_DEGRADED, DISPATCH_SWITCHES
from taskline.readiness import CHANNEL
from taskline.store.queries import channel
from taskline.store.views import WorkerStore

log = logging.getLogger(__name__)

BACKSTOP_S = 0.5
"""Longest sleep of an idle loop in postgres mode, seconds: bounds a lost notification."""
RETURN_PROBE_S = 0.2
"""Pause between looks at the rebuild marker while in postgres mode, seconds."""
RELISTEN_S = 0.5
"""Pause before listening again after the LISTEN connection failed, seconds."""


class Mode(enum.StrEnum):
    REDIS = "redis"
    POSTGRES = "postgres"


class Waker:
    """A generation counter: a sleeper wakes when it moved past the value it last saw."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def poke(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Sleep until the generation passes `seen` or `timeout` ends; whether it passed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._generation != seen, timeout)


class Listener:
    """LISTEN on the installation's `<schema>_enqueued` channel in its own thread; pokes the
    waker for this worker's queues' notifications and after every (re)LISTEN (what was sent
    before is not replayed)."""

    def __init__(self, database_url: str, queues: Sequence[str], waker: Waker,
                 channel: str = CHANNEL) -> None:
        self._url = database_url
        self._channel = channel
        self._queues = frozenset(queues)
        self._waker = waker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskline-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except psycopg.Error as err:
                log.warning("LISTEN connection failed; listening again",
                            extra={"action": "listen", "error": f"{type(err).__name__}: {err}"})
            self._waker.poke()
            self._stop.wait(RELISTEN_S)

    def _listen(self) -> None:
        with psycopg.connect(self._url, autocommit=True, connect_timeout=5, keepalives=1,
                             keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                             application_name="taskline-worker-listen") as conn:
            conn.execute(f"LISTEN {self._channel}")
            self._waker.poke()
            while not self._stop.is_set():
                for note in conn.notifies(timeout=BACKSTOP_S):
                    if note.payload in self._queues:
                        self._waker.poke()


class DispatchMode:
    """The worker's dispatch mode, switched by its fetch loops and its return probe."""

    def __init__(self, *, store: WorkerStore, dispatcher: Dispatcher, database_url: str | None,
                 worker_id: str, queues: Sequence[str], on_return: Callable[[], object],
                 stop: threading.Event) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._url = database_url
        self._worker_id = worker_id
        self._queues = list(queues)
        self._on_return = on_return
        self._stop = stop
        self._lock = threading.Lock()
        self.mode = Mode.REDIS
        self.waker = Waker()
        self._since_ms = 0
        self._listener: Listener | None = None
        DISPATCH_DEGRADED.labels(worker_id).set(0)
        for mode in Mode:  # rare: exported as 0 from the start, not "no data"
            DISPATCH_SWITCHES.labels(to=mode.value)

    @property
    def degraded(self) -> bool:
        return self.mode is Mode.POSTGRES

    def lost(self, reason: object) -> None:
        """Redis failed a fetch: claim from PostgreSQL until Redis is rebuilt."""
        with self._lock:
            if self.mode is Mode.POSTGRES or self._stop.is_set():
                return
            self._since_ms = self._now_ms()
            self.mode = Mode.POSTGRES
            if self._url is not None:  # else the idle loops' sleeps end at BACKSTOP_S
                self._listener = Listener(self._url, self._queues, self.waker,
                                          channel(self._store.schema, "enqueued"))
                self._listener.start()
        self._switched(Mode.POSTGRES, f"Redis unreachable ({reason})")
        threading.Thread(target=self._watch_return, name="taskline-dispatch-return",
                         daemon=True).start()

    def wait(self, seen: int, timeout: float = BACKSTOP_S) -> None:
        """An idle loop's sleep in postgres mode: until a notification, a (re)LISTEN, the
        return to Redis, the worker's stop, or `timeout`."""
        self.waker.wait(seen, timeout)

    def close(self) -> None:
        with self._lock:
            if self._listener is not None:
                self._listener.stop()
        self.waker.poke()

    def _now_ms(self) -> int:
        """PostgreSQL's clock, which the rebuild marker is written in; this host's clock when
        PostgreSQL is out too (claims wait for it anyway)."""
        try:
            return int(self._store.now().timestamp() * 1000)
        except StoreUnavailable:
            return int(time.time() * 1000)

    def _watch_return(self) -> None:
        while not self._stop.wait(RETURN_PROBE_S):
            try:
                marker = self._dispatcher.dispatch_marker()
            except DispatchUnavailable:
                continue
            if dispatch_marker_ms(marker) >= self._since_ms and self._back_to_redis():
                return

    def _back_to_redis(self) -> bool:
        try:
            self._on_return()  # ids left in this worker's processing lists go back first
        except DispatchUnavailable:
            return False
        except StoreUnavailable as err:
            log.warning("processing list not swept on the return to Redis; reconciliation "
                        "will", extra={"action": "dispatch_mode", "error": str(err)})
        with self._lock:
            self.mode = Mode.REDIS
            if self._listener is not None:
                self._listener.stop()
                self._listener = None
        self._switched(Mode.REDIS, "Redis rebuilt")
        self.waker.poke()
        return True

    def _switched(self, mode: Mode, reason: str) -> None:
        DISPATCH_DEGRADED.labels(self._worker_id).set(1 if mode is Mode.POSTGRES else 0)
        DISPATCH_SWITCHES.labels(to=mode.value).inc()
        level = logging.WARNING if mode is Mode.POSTGRES else logging.INFO
        log.log(level, "dispatch switched to %s: %s", mode.value, reason,
                    extra={"action": "dispatch_mode", "worker": self._worker_id,
                           "mode": mode.value, "reason": reason})

