"""After a commit, mirror it in Redis: the one owner of that step for every service.

Invariant: Redis follows PostgreSQL. Every service hands its committed changes to the Mirror of
its dispatcher, which performs each move's Redis step (taskline.dispatch.follow, chosen by the
move's Step; where each state's id lives is taskline.jobs.REDIS_HOME). When Redis is
unreachable, the changes that made jobs queued are announced on the PostgreSQL channel
(taskline.readiness.notify), so workers claiming from PostgreSQL take them at once instead of
at their backstop poll, whichever service committed them. An outage is logged once per process
with the breaker's state, and its end once, not once per call. Nothing is raised to the caller
(what was committed is durable, and reconciliation puts Redis right) unless it asks with
`strict`: the outbox relay keeps its rows until their ids are pushed.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable

from taskline.dispatch.dispatcher import Dispatcher
from taskline.errors import DispatchUnavailable
from taskline.jobs import REDIS_HOME
from taskline.readiness import notify
from taskline.store.views import ReadyNotifier
from taskline.transitions import Committed

log = logging.getLogger(__name__)

__all__ = ["REDIS_HOME", "Mirror"]

_MIRRORS: weakref.WeakKeyDictionary[Dispatcher, Mirror] = weakref.WeakKeyDictionary()
_MIRRORS_LOCK = threading.Lock()


class Mirror:
    """The Redis step after each commit, with the PostgreSQL announcement as its fallback."""

    homes = REDIS_HOME

    def __init__(self, dispatcher: Dispatcher, store: ReadyNotifier) -> None:
        # Held weakly: the registry below is keyed by the dispatcher, and a strong reference
        # from its value would keep every dispatcher ever mirrored alive.
        self._dispatcher = weakref.ref(dispatcher)
        self.store = store
        self._down = False
        self._lock = threading.Lock()

    @property
    def dispatcher(self) -> Dispatcher:
        dispatcher = self._dispatcher()
        if dispatcher is None:
            raise RuntimeError("the dispatcher of this Mirror was closed and collected")
        return dispatcher

    @classmethod
    def of(cls, dispatcher: Dispatcher, store: ReadyNotifier) -> Mirror:
        """The process's one Mirror of `dispatcher`, so an outage is logged once."""
        with _MIRRORS_LOCK:
            mirror = _MIRRORS.get(dispatcher)
            if mirror is None:
                mirror = _MIRRORS[dispatcher] = cls(dispatcher, store)
            return mirror

    def follow(self, changes: Iterable[Committed], *, action: str,
               strict: bool = False) -> bool:
        """Perform the Redis step of every change; True when Redis took them all.

        Redis unreachable: the queues of jobs made queued are notified through PostgreSQL;
        `strict` then re-raises DispatchUnavailable. Any other error is logged with its
        traceback (a bug, not an outage) and, with `strict`, re-raised.
        """
        changes = list(changes)
        if not changes:
            return True
        try:
            self.dispatcher.follow(changes)
        except DispatchUnavailable as err:
            notify(self.store, changes)
            self._outage(action, len(changes), err)
            if strict:
                raise
            return False
        except Exception:
            log.exception("Redis not updated after a committed change; reconciliation will "
                          "repair it", extra={"action": action, "jobs": len(changes)})
            if strict:
                raise
            return False
        self._recovered(action)
        return True

    def write(self, redis_write: Callable[[], object], *, action: str, jobs: int) -> bool:
        """A Redis write that follows a commit but moves no job (a stale id acked away): True
        when Redis took it. Redis unreachable counts toward the same outage as `follow`, logged
        once; nothing needs announcing, as no job was made queued."""
        try:
            redis_write()
        except DispatchUnavailable as err:
            self._outage(action, jobs, err)
            return False
        self._recovered(action)
        return True

    def _outage(self, action: str, jobs: int, err: DispatchUnavailable) -> None:
        with self._lock:
            first, self._down = not self._down, True
        breaker = self.dispatcher.breaker
        state = "none" if breaker is None else ("open" if breaker.open else "closed")
        extra = {"action": action, "jobs": jobs, "breaker": state, "error": str(err)}
        if first:
            log.warning("Redis unreachable: committed changes are not mirrored; workers claim "
                        "from PostgreSQL and reconciliation rebuilds Redis when it returns",
                        extra=extra)
        else:
            log.debug("committed changes not mirrored: Redis still unreachable", extra=extra)

    def _recovered(self, action: str) -> None:
        if not self._down:
            return
        with self._lock:
            was_down, self._down = self._down, False
        if was_down:
            log.info("Redis reachable again: committed changes are mirrored",
                     extra={"action": action})
