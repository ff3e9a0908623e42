"""One PostgreSQL LISTEN connection: committed job events, as migration 0002's trigger sends them.

Invariant: a payload is yielded only after the transaction that wrote its event committed
(PostgreSQL delivers NOTIFY at commit, in commit order). While the connection is down nothing
is heard and nothing is queued for it, so a caller that loses the connection must assume it
missed events and replay them from job_events (`Store.events_after`).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
from psycopg import sql

from taskline.errors import StoreUnavailable
from taskline.events import CHANNEL

# As make_engine's: a dead link is noticed within seconds, not at the next TCP timeout.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
               "keepalives_count": 3}


class Listener:
    """LISTENs on `channel`; `payloads` yields what arrives, errors become StoreUnavailable."""

    def __init__(self, database_url: str, channel: str = CHANNEL,
                 application_name: str = "taskline-events") -> None:
        self._url = database_url
        self._channel = channel
        self._application_name = application_name
        self._conn: psycopg.Connection | None = None

    def open(self) -> None:
        """Connect and LISTEN; from now on every committed event is heard."""
        self.close()
        try:
            conn = psycopg.connect(self._url, autocommit=True, connect_timeout=5,
                                   application_name=self._application_name, **_KEEPALIVES)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        except psycopg.Error as err:
            raise StoreUnavailable(f"PostgreSQL unavailable: {type(err).__name__}") from err
        self._conn = conn

    def payloads(self, timeout_s: float) -> Iterator[str]:
        """The payloads heard within `timeout_s` seconds, each as soon as it arrives."""
        if self._conn is None:
            raise StoreUnavailable("the LISTEN connection is not open")
        try:
            for notify in self._conn.notifies(timeout=timeout_s):
                yield notify.payload
        except psycopg.Error as err:
            raise StoreUnavailable(f"PostgreSQL unavailable: {type(err).__name__}") from err

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
