"""How many jobs a drain has finished, read cheaply while the drain's CPU is being measured.

A drain polls for its end ten times a second inside the window whose CPU it reports. A count of
the finished rows reads every one of them on each poll (no visibility map before a vacuum):
11 - 17 us of PostgreSQL's CPU per job for taskline's jobs table at 2,000 jobs/s, and 31 - 47
us for pgqueuer's queue table counted every 5 ms (docs/performance.md, change 129). Here each
poll reads only the log rows written since the last one, by the primary key's range, on a
connection of its own that may not scan the whole table: a young table has no statistics, and
the planner's guess for an open range reads every row, as the count did. A row committed after
a later id was read is missed by that range, so the cheap figure may lag by a few jobs; the
exact count answers once the cheap one is within `slack` of the target, and on every
`EXACT_EVERY`th poll, so a missed row can delay the end by at most that many polls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg
from stack import in_schema

if TYPE_CHECKING:
    from stack import Stack

EXACT_EVERY = 20
"""Polls between exact counts while the cheap one is far from the target (2 s at 0.1 s)."""

Since = Callable[[int], tuple[int, int | None]]
"""(finished rows with an id above the argument, the highest id seen), in one statement."""


class Finished:
    """Callable: the jobs finished so far, exact once near `target`, cheap before that."""

    def __init__(self, since: Since, exact: Callable[[], int], target: int,
                 slack: int | None = None) -> None:
        self._since, self._exact, self._target = since, exact, target
        self._slack = max(20, target // 100) if slack is None else slack
        self._after = 0
        self._seen = 0
        self._polls = 0

    def __call__(self) -> int:
        self._polls += 1
        count, last = self._since(self._after)
        self._seen += count
        self._after = last if last is not None else self._after
        if self._seen >= self._target - self._slack or self._polls % EXACT_EVERY == 0:
            self._seen = self._exact()  # also puts back what the range missed
            # Later polls count from here on: rows below `_after` committed later were just
            # counted by the exact figure, and rows above it are read by the next range.
        return self._seen


def by_index(url: str) -> psycopg.Connection:
    """An autocommit connection whose plans read a range through its index, never the table."""
    return psycopg.connect(url, autocommit=True,
                           options="-c enable_seqscan=off -c enable_bitmapscan=off")


def reads_since(conn: psycopg.Connection, query: str) -> Since:
    """`Since` by `query`, which takes the last id seen as its one parameter."""
    def read(after: int) -> tuple[int, int | None]:
        row = conn.execute(query, (after,)).fetchone()
        assert row is not None
        return row[0], row[1]
    return read


@contextmanager
def taskline(stack: Stack, target: int) -> Iterator[Finished]:
    """Jobs of `stack` that succeeded or went to the dead-letter queue, from their events."""
    with by_index(stack.url) as conn:
        yield Finished(reads_since(conn, in_schema(
            "SELECT count(*) FILTER (WHERE event IN ('succeeded', 'dead_lettered')), max(id) "
            "FROM taskline.job_events WHERE id > %s", stack.schema)),
            lambda: stack.count("succeeded", "dead"), target)
