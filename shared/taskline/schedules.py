"""Schedules: cron expressions in a time zone, and which slot of one is due. Pure: no I/O.

Invariant: a slot is an instant (UTC, whole seconds) computed only here, from the cron
expression read in the schedule's time zone, and it is the same instant on every process, so
PostgreSQL's unique key (schedule, slot) can refuse a second job for it. Daylight-saving time
is read as cron reads it: a slot whose wall time falls in a skipped hour is due at the first
instant after the gap (several such slots become that one instant); a wall time that occurs
twice in a repeated hour is a slot once, at its first occurrence. A slot at or before the
schedule's `since` (when its current definition was written, or its last fired slot) is never
due; with `catch_up = latest` the newest slot due is fired however late it is found, with
`none` only while it is at most `MISSED_AFTER_S` old (older ones were missed and are skipped).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from taskline.dispatch.keys import valid_queue_name
from taskline.jobs import DEFAULT_PRIORITY, parse_priority

MAX_NAME_CHARS = 200
NAME_RULE = f"1..{MAX_NAME_CHARS} characters of A-Z a-z 0-9 _ . : -"
_NAME = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_NAME_CHARS}}}")
_ZONE = re.compile(r"[A-Za-z0-9_+\-]{1,32}(?:/[A-Za-z0-9_+\-]{1,32}){0,3}")
MAX_CRON_CHARS = 200
CATCH_UP = ("latest", "none")
NEXT_RUNS = 5
MISSED_AFTER_S = 60.0
"""With `catch_up = none`, a slot found later than this after its instant was missed (no
maintenance instance was leading at the time) and is skipped, never fired."""
_LOOKAHEAD = 4
"""Candidates read past a skipped wall time before giving up on an expression."""


NO_SLOT: tuple[type[Exception], ...] = (CroniterError, StopIteration)
"""What computing a slot raises for an expression that finds none for years (croniter gives
up): such a schedule has no next run, and costs only its own slot."""


class InvalidSchedule(ValueError):
    """A cron expression, time zone or schedule name that cannot be used."""


def valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def parse_zone(name: object) -> ZoneInfo:
    """The IANA time zone `name` (e.g. Europe/Berlin); InvalidSchedule when unknown."""
    if not isinstance(name, str) or not _ZONE.fullmatch(name):
        raise InvalidSchedule("must be an IANA time zone name, e.g. UTC or Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(f"unknown time zone {name!r}") from None


@dataclass(frozen=True)
class Cron:
    """A cron expression in a time zone: 5 fields (minute hour day month weekday), or 6 with
    a seconds field last (`*/10 * * * * *`: every ten seconds)."""

    expression: str
    zone: ZoneInfo

    @classmethod
    def parse(cls, expression: object, zone: str = "UTC") -> Cron:
        tz = parse_zone(zone)
        if not isinstance(expression, str) or not 1 <= len(expression) <= MAX_CRON_CHARS:
            raise InvalidSchedule(f"must be a cron expression of 1..{MAX_CRON_CHARS} characters")
        fields = expression.split()
        if len(fields) not in (5, 6):
            raise InvalidSchedule("must have 5 fields (minute hour day month weekday), or 6 "
                                  "with seconds last")
        cron = cls(" ".join(fields), tz)
        try:
            next(cron.after(datetime(2000, 1, 1, tzinfo=UTC)))
        except (CroniterError, ValueError, KeyError, StopIteration) as err:
            raise InvalidSchedule(f"invalid cron expression: {err}") from None
        return cron

    def _local(self, when: datetime) -> datetime:
        return when.astimezone(self.zone)

    def after(self, when: datetime) -> Iterator[datetime]:
        """The slots strictly after `when`, oldest first, as UTC instants."""
        it = croniter(self.expression, self._local(when))
        last: datetime | None = None
        while True:
            slot = _slot(it.get_next(datetime))
            if slot is None or (last is not None and slot <= last):
                continue  # a repeated wall time, or a gap's slots folded into one instant
            last = slot
            yield slot

    def latest(self, now: datetime) -> datetime | None:
        """The newest slot at or before `now`; None when there is none (for a long while)."""
        it = croniter(self.expression, self._local(now))
        for _ in range(_LOOKAHEAD + 1):
            slot = _slot(it.get_prev(datetime))
            if slot is not None:
                break
        else:
            return None
        following = next(self.after(slot))
        return following if following <= now else slot

    def next_runs(self, after: datetime, count: int = NEXT_RUNS) -> list[datetime]:
        runs = self.after(after)
        return [next(runs) for _ in range(count)]


def _slot(local: datetime) -> datetime | None:
    """The UTC instant of one candidate croniter produced; None for the second occurrence of a
    wall time the zone repeats (fall back), which already was a slot at its first."""
    if _repeated(local):
        return None
    return local.astimezone(UTC).replace(microsecond=0)


def _repeated(local: datetime) -> bool:
    """Whether `local` is the later of two instants sharing one wall time."""
    settled = local.astimezone(local.tzinfo)
    if settled.fold == 0:
        return False
    earlier = settled.replace(fold=0)
    return earlier.utcoffset() != settled.utcoffset()


def due_slot(cron: Cron, since: datetime, now: datetime, catch_up: str) -> datetime | None:
    """The slot to fire now: the newest slot in (since, now], or None. Under `none` a slot
    older than MISSED_AFTER_S was missed: None (the caller records nothing; the slot stays
    unfired and every later one is judged on its own)."""
    slot = cron.latest(now)
    if slot is None or slot <= since:
        return None
    if catch_up == "none" and (now - slot).total_seconds() > MISSED_AFTER_S:
        return None
    return slot


def missed(cron: Cron, since: datetime, fired: datetime) -> int:
    """How many slots in (since, fired) were passed over when `fired` was fired (catch-up)."""
    count = 0
    for slot in cron.after(since):
        if slot >= fired or count >= 10_000:
            return count
        count += 1
    return count


def next_due(cron: Cron, since: datetime, now: datetime) -> datetime:
    """The first slot after both `since` and `now`: nothing is due before it."""
    return next(cron.after(max(since, now)))


_DECLARED_JOB_FIELDS = frozenset({"type", "payload", "queue", "priority", "max_retries",
                                  "timeout_s"})


def declared(name: str, spec: dict[str, Any], max_retries: int,
             timeout_s: float) -> dict[str, Any]:
    """A schedule declared in code (`@periodic`) as `Store.upsert_schedule` takes it, the job
    filled with the defaults the API would give it; InvalidSchedule naming what is wrong.
    (The API validates its bodies with the producer's job rules; these are the same bounds.)"""
    if not valid_name(name):
        raise InvalidSchedule(f"schedule name {name!r}: must be {NAME_RULE}")
    Cron.parse(spec["cron"], spec["timezone"])
    if spec["catch_up"] not in CATCH_UP:
        raise InvalidSchedule(f"schedule {name}: catch_up must be latest or none")
    job = spec["job"]
    unknown = set(job) - _DECLARED_JOB_FIELDS
    if unknown or not isinstance(job.get("type"), str) or not 1 <= len(job["type"]) <= 200:
        raise InvalidSchedule(f"schedule {name}: job needs a type (1..200 characters) and "
                              f"only {sorted(_DECLARED_JOB_FIELDS)}")
    queue = job.get("queue", "default")
    if not valid_queue_name(queue):
        raise InvalidSchedule(f"schedule {name}: invalid queue {queue!r}")
    try:
        priority = parse_priority(job.get("priority", DEFAULT_PRIORITY))
    except ValueError as err:
        raise InvalidSchedule(f"schedule {name}: {err}") from None
    retries = job.get("max_retries", max_retries)
    timeout = job.get("timeout_s", timeout_s)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise InvalidSchedule(f"schedule {name}: max_retries must be an integer 0..100")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            0 < timeout <= 86_400):
        raise InvalidSchedule(f"schedule {name}: timeout_s must be a number in (0, 86400]")
    return {"cron": spec["cron"], "timezone": spec["timezone"], "catch_up": spec["catch_up"],
            "paused": bool(spec["paused"]),
            "job": {"type": job["type"], "payload": job.get("payload", {}), "queue": queue,
                    "priority": priority, "max_retries": retries, "timeout_s": float(timeout)}}
