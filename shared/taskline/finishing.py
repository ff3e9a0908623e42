"""Waking at the commit that finishes a job: the `<schema>_finished` channel and its listeners.

Migration 0017's trigger sends a job's id (and its workflow's, for a step) on the channel when an
UPDATE moves it into succeeded, dead or cancelled, if the job is flagged as watched (migration
0028: an unwatched job's finish sends nothing); PostgreSQL delivers it at that commit. One
FinishListener per process holds a LISTEN connection and calls back the watches of that id, so
any number of waiters share one connection and none holds a pooled one. `wait` does the same on
a connection of its own for one job: `taskline.wait(conn, id, timeout)`, no API needed.

Invariant: a waiter flags the jobs it waits for (taskline.store.watching) and registers its
watch before it reads their state, so a finish committed after the read's snapshot signals, and
wakes it; a waiter waits (briefly) for the listener to be live first, and when the listener
reconnects it wakes every watch, because what was sent while it was away is lost (a woken waiter
reads the state again).
Without a session connection (a transaction-pooling PgBouncer and no direct URL) there is no
LISTEN: the listener wakes every watch once a second instead.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg import sql

from taskline.results import finished, outcome
from taskline.store import caller, watching
from taskline.store.queries import DEFAULT_SCHEMA, channel

log = logging.getLogger(__name__)

FINISHED = "finished"
POLL_S = 1.0
"""The period of the wake-ups without LISTEN, and of a listener's checks of its stop flag."""
RECONNECT_S = (0.1, 5.0)


class Watch:
    """Interest in the finish of any of `ids`: `callback()` runs once (on the listener's
    thread), at the first finish of one of them or at a reconnection."""

    __slots__ = ("callback", "fired", "ids")

    def __init__(self, ids: Iterable[str], callback: Callable[[], None]) -> None:
        self.ids = tuple(ids)
        self.callback = callback
        self.fired = False


class FinishListener:
    """One LISTEN connection of a process, shared by every watch."""

    def __init__(self, url: str | None, schema: str = DEFAULT_SCHEMA) -> None:
        self._url = url
        self._channel = channel(schema, FINISHED)
        self._lock = threading.Lock()
        self._watches: dict[str, set[Watch]] = {}
        self._stop = threading.Event()
        self.live = threading.Event()
        """Set while LISTEN is active (or, without a session URL, once polling runs)."""
        self._thread: threading.Thread | None = None
        self._listened = False
        """LISTEN was active before: a reconnection wakes every watch."""

    @property
    def listens(self) -> bool:
        """Whether signals reach this listener (False: without a session URL it polls, and
        flagging a job as watched would be a write for nothing)."""
        return self._url is not None

    @property
    def watching(self) -> int:
        with self._lock:
            return len({w for ws in self._watches.values() for w in ws})

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="taskline-finish-listener")
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def watch(self, ids: Iterable[str], callback: Callable[[], None]) -> Watch:
        watch = Watch((str(i) for i in ids), callback)
        with self._lock:
            for job_id in watch.ids:
                self._watches.setdefault(job_id, set()).add(watch)
        self.start()
        return watch

    def unwatch(self, watch: Watch) -> None:
        with self._lock:
            self._forget(watch)

    def _forget(self, watch: Watch) -> None:
        for job_id in watch.ids:
            watches = self._watches.get(job_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[job_id]

    def fire(self, job_id: str | None = None) -> None:
        """Run the callbacks of the watches of `job_id` (of every watch if None), once."""
        with self._lock:
            if job_id is None:
                due = {w for ws in self._watches.values() for w in ws}
            else:
                due = set(self._watches.get(job_id, ()))
            for watch in due:
                self._forget(watch)
                watch.fired = True
        for watch in due:
            try:
                watch.callback()
            except Exception:
                log.exception("a finish watch's callback failed")

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self._url is None:
                    self._poll()
                else:
                    self._listen()
                failures = 0
            except psycopg.Error as err:
                self.live.clear()
                failures += 1
                low, cap = RECONNECT_S
                log.warning("finish listener lost PostgreSQL; reconnecting",
                            extra={"action": "finish_listener", "error": str(err)})
                self._stop.wait(min(low * 2 ** (failures - 1), cap))

    def _poll(self) -> None:
        self.live.set()
        while not self._stop.wait(POLL_S):
            self.fire()

    def _listen(self) -> None:
        assert self._url is not None
        with psycopg.connect(self._url, autocommit=True,
                             application_name="taskline-finish-listener") as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self.live.set()
            if self._listened:
                self.fire()  # what finished while no LISTEN was active is unknown: look again
            self._listened = True
            while not self._stop.is_set():
                for note in conn.notifies(timeout=POLL_S):
                    self.fire(note.payload)
                    if self._stop.is_set():
                        break
        self.live.clear()


def wait(conn: Any, job_id: uuid.UUID | str, timeout: float | None = None, *,
         raise_on_failure: bool = True, schema: str = DEFAULT_SCHEMA) -> Any:
    """Block until job `job_id` finishes and return its result (see `outcome`); TimeoutError
    after `timeout` seconds (None: no limit), LookupError for an unknown job.

    `conn` names the database (a URL, a SQLAlchemy Engine, Connection or Session, a psycopg
    Connection): the wait LISTENs on a connection of its own to it, so the caller's transaction
    is left alone; it sees the finishing commit, not a timer."""
    url = caller.database_url(conn)
    deadline = None if timeout is None else time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as listen:
        listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema, FINISHED))))
        watching.watch_finish(lambda name, params: caller.run(listen, name, params, schema),
                              [job_id])
        while True:
            job = _job(listen, str(job_id), schema)
            if finished(job):
                return outcome(job, raise_on_failure)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout} s")
            _until_signalled(listen, str(job_id), remaining)


def _until_signalled(conn: psycopg.Connection, job_id: str, remaining: float | None) -> None:
    """Return at the first finish signal of `job_id`, or after `remaining` (None: a while)."""
    for note in conn.notifies(timeout=POLL_S * 30 if remaining is None else remaining):
        if note.payload == job_id:
            return


def _job(conn: psycopg.Connection, job_id: str, schema: str) -> dict[str, Any]:
    rows = caller.run(conn, "job_outcome", {"id": job_id}, schema)
    if not rows:
        raise LookupError(f"no job has the id {job_id}")
    row = rows[0]
    return {"id": job_id, "status": row.status, "result": row.result,
            "last_error": row.last_error, "attempts": row.attempts}
