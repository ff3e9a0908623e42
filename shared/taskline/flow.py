"""Flow limits: what a limit is, and which held jobs a claim may start under the limits.

Pure (no I/O): the store reads the limits, their use and the held candidates under a lock, and
`admit` decides. A job starts only when every limit that applies to it (its type's and its
queue's) has budget for it, taken from all of them at once; candidates come most urgent first,
FIFO within a priority, and a job that does not fit is skipped, not waited for, so a full
budget of one tenant (`per_key`) or one type never holds back another's. Under `per_key` each
`limit_key` has its own budget; jobs without a key share the budget of the key ''.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

SCOPE_KINDS = ("type", "queue")
MAX_LIMIT_KEY_CHARS = 200
MAX_NUMBER = 1_000_000
MAX_PERIOD_S = 86_400.0 * 30
_QUEUE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
Budget = tuple[str, str]
"""(scope, key): one budget; key '' for a scope without per_key, or a job without limit_key."""


@dataclass(frozen=True)
class Limit:
    """One scope's limits: concurrency, a rate (`rate_limit` starts per `period_s`), or both."""

    scope: str
    concurrency: int | None = None
    rate_limit: int | None = None
    period_s: float | None = None
    per_key: bool = False

    @classmethod
    def from_row(cls, row: Any) -> Limit:
        return cls(scope=row.scope, concurrency=row.concurrency, rate_limit=row.rate_limit,
                   period_s=None if row.period_s is None else float(row.period_s),
                   per_key=bool(row.per_key))

    def key_of(self, limit_key: str | None) -> str:
        return (limit_key or "") if self.per_key else ""

    def budget(self, limit_key: str | None) -> Budget:
        """The budget a job with `limit_key` draws from under this limit."""
        return self.scope, self.key_of(limit_key)


@dataclass(frozen=True)
class Candidate:
    """A held job a claim may start."""

    id: str
    type: str
    queue: str
    limit_key: str | None


@dataclass(frozen=True)
class Usage:
    """What each budget holds now: open leases, and starts inside the window (with the oldest)."""

    running: Mapping[Budget, int]
    started: Mapping[Budget, int]
    oldest_start: Mapping[Budget, datetime]


@dataclass(frozen=True)
class Admission:
    picked: list[str]
    """Ids to claim, in candidate order."""
    usage: Usage
    """The use once they start."""
    full: list[Budget]
    """Budgets with nothing left after this admission."""
    frees_at: datetime | None
    """When a full rate budget gets room again (its oldest start leaves the window)."""


def scopes_of(job_type: str, queue: str) -> tuple[str, str]:
    return f"type:{job_type}", f"queue:{queue}"


def parse_scope(scope: object) -> tuple[str, str]:
    """(kind, name) of a scope `type:<type>` or `queue:<queue>`; ValueError otherwise."""
    if not isinstance(scope, str) or ":" not in scope:
        raise ValueError("scope must be type:<type> or queue:<queue>")
    kind, name = scope.split(":", 1)
    if kind not in SCOPE_KINDS:
        raise ValueError(f"unknown scope kind {kind!r}: use type:<type> or queue:<queue>")
    if kind == "queue" and not _QUEUE.fullmatch(name):
        raise ValueError("queue must be 1..64 characters of A-Z a-z 0-9 _ . : -")
    if kind == "type" and not (1 <= len(name) <= 200 and name.isprintable()):
        raise ValueError("type must be 1..200 printable characters")
    return kind, name


def admit(candidates: Sequence[Candidate], limits: Mapping[str, Limit], usage: Usage,
          slots: int, now: datetime) -> Admission:
    """The candidates to start now, at most `slots`, greedily in their order."""
    running, started = Counter(usage.running), Counter(usage.started)
    oldest = dict(usage.oldest_start)
    picked: list[str] = []
    for job in candidates:
        if len(picked) >= slots:
            break
        applying = [lim for scope in scopes_of(job.type, job.queue)
                    if (lim := limits.get(scope)) is not None]
        if all(_room(lim, lim.budget(job.limit_key), running, started) for lim in applying):
            for lim in applying:
                budget = lim.budget(job.limit_key)
                running[budget] += lim.concurrency is not None
                if lim.rate_limit is not None:
                    started[budget] += 1
                    oldest.setdefault(budget, now)  # starts now: leaves the window a period on
            picked.append(job.id)
    full = full_budgets(limits.values(), running, started)
    return Admission(picked, Usage(running, started, oldest), full,
                     frees_at(limits, full, oldest, now))


def full_budgets(limits: Iterable[Limit], running: Mapping[Budget, int],
                 started: Mapping[Budget, int]) -> list[Budget]:
    """Budgets with no room left: the candidates query skips their jobs."""
    by_scope = {lim.scope: lim for lim in limits}
    seen = set(running) | set(started)
    return sorted(b for b in seen if b[0] in by_scope
                  and not _room(by_scope[b[0]], b, running, started))


def frees_at(limits: Mapping[str, Limit], full: Iterable[Budget],
             oldest: Mapping[Budget, datetime], now: datetime) -> datetime | None:
    """The earliest instant a full rate budget has room again; None if none is rate-bound."""
    instants = []
    for budget in full:
        lim = limits.get(budget[0])
        if lim is not None and lim.period_s is not None and budget in oldest:
            instants.append(oldest[budget] + timedelta(seconds=lim.period_s))
    return max(min(instants), now) if instants else None


def _room(lim: Limit, budget: Budget, running: Mapping[Budget, int],
          started: Mapping[Budget, int]) -> bool:
    if lim.concurrency is not None and running.get(budget, 0) >= lim.concurrency:
        return False
    return lim.rate_limit is None or started.get(budget, 0) < lim.rate_limit
