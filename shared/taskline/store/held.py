"""The connection a thread keeps between its statements while it runs `Store.holding`.

A worker's fetch loops and its recorder each run a statement every few milliseconds straight
through psycopg (a claim, a settle). Taking a connection out of SQLAlchemy's pool and giving it
back around each one (the checkout, its events and bookkeeping, the reset on return) cost about
40 us of CPU a statement on a 2-vCPU VM, against about 2 us for the statement's own switch of
autocommit (docs/performance.md, change 135). Inside `holding`, a thread keeps the connection
its first statement took and runs the next ones on it.

Invariant: a held connection is used by its own thread, by one statement at a time: a statement
started while another runs on it (inside a transaction's block) takes a pooled connection of its
own, as outside `holding`. It is idle between statements, in no transaction; one found otherwise
is given back (the pool's reset rolls it back) and another taken. It is given back when the
block ends and after HOLD_S (so the pool's recycling still reaches it). One whose pool was
replaced (`engine.dispose`, after an outdated plan) is closed, as is one a statement raised on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from psycopg.pq import TransactionStatus
from sqlalchemy import Engine

HOLD_S = 60.0
"""How long a thread keeps one connection before it gives it back to the pool and takes one."""


class Held(threading.local):
    """Per thread: how deep in `Store.holding` it is, the connection it holds (a pooled one,
    checked out), since when, and whether a statement runs on it now. The class attributes are
    every thread's defaults."""

    depth = 0
    pooled: Any = None
    since = 0.0
    busy = False

    def usable(self, engine: Engine) -> Any:
        """The held connection, for a statement about to run on it; None when this thread holds
        none it may use (it then gives back one it must not use)."""
        pooled = self.pooled
        if pooled is None:
            return None
        if getattr(pooled, "_pool", None) is not engine.pool:
            pooled.invalidate()  # its pool was disposed: closed, not returned to it
            self.release()
            return None
        if time.monotonic() - self.since > HOLD_S \
                or pooled.driver_connection.info.transaction_status != TransactionStatus.IDLE:
            self.release()
            return None
        return pooled

    def keep(self, pooled: Any) -> None:
        self.pooled, self.since = pooled, time.monotonic()

    def drop(self) -> None:
        """Forget the held connection (the caller discards it)."""
        self.pooled = None

    def release(self) -> None:
        """Give the held connection back to the pool."""
        pooled, self.pooled = self.pooled, None
        if pooled is not None:
            pooled.close()
