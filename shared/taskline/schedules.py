"""Schedules: cron expressions in a time zone, and which slot of one is due. Pure: no I/O.

Invariant: a slot is an instant (UTC, whole seconds) computed only here, from the cron
expression read in the schedule's time zone, and it is the same instant on every process, so
PostgreSQL's unique key (schedule, slot) can refuse a second job for it. Daylight-saving time
is read as cron reads it: a slot whose wall time falls in a skipped hour is due at the first
instant after the gap (several such slots become that one instant); a wall time that occurs
twice in a repeated hour is a slot once, at its first occurrence. A slot at or before the
schedule's `since` (when its current definition was written, or its last fired slot) is never
due. Every later slot is due once, oldest first, while an instance leads (`due_slots`);
`catch_up` decides only about slots missed while none led (before the current leader began):
`latest` fires the newest of them however late, `none` only while it is at most
`MISSED_AFTER_S` old.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from taskline.jobspec import FieldError, JobSpec, parse_job
from taskline.settings import Settings
from taskline.uniquespec import as_json

MAX_NAME_CHARS = 200
NAME_RULE = f"1..{MAX_NAME_CHARS} characters of A-Z a-z 0-9 _ . : -"
_NAME = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_NAME_CHARS}}}")
_ZONE = re.compile(r"[A-Za-z0-9_+\-]{1,32}(?:/[A-Za-z0-9_+\-]{1,32}){0,3}")
MAX_CRON_CHARS = 200
CATCH_UP = ("latest", "none")
NEXT_RUNS = 5
MISSED_AFTER_S = 60.0
"""With `catch_up = none`, a slot missed while no maintenance instance led and found later
than this after its instant is skipped, never fired."""
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


MAX_SLOTS_PER_PASS = 1000
"""Most slots of one schedule fired by one pass; the rest are due at once in the next."""


@dataclass(frozen=True)
class Due:
    """What a schedule owes now: the slots to fire, oldest first, and how many missed slots
    were passed over (never fired)."""

    slots: list[datetime]
    skipped: int = 0


def due_slots(cron: Cron, since: datetime, now: datetime, led_from: datetime, catch_up: str,
              limit: int = MAX_SLOTS_PER_PASS) -> Due:
    """The slots in (since, now] to fire now, oldest first (at most `limit`).

    Every slot at or after `led_from` (when this instance began leading, PostgreSQL's clock)
    passed while it led and is fired, whatever `catch_up` says. The slots before it were
    missed (no instance led, or another one did not fire them): `latest` fires the newest of
    them however old, `none` only while it is at most MISSED_AFTER_S old; the others are
    skipped.
    """
    slots: list[datetime] = []
    skipped = 0
    if since < led_from:
        newest = cron.latest(min(led_from - timedelta(microseconds=1), now))
        if newest is not None and newest > since:
            skipped = missed(cron, since, newest)
            if catch_up == "latest" or (now - newest).total_seconds() <= MISSED_AFTER_S:
                slots.append(newest)
            else:
                skipped += 1
            since = newest
    for slot in cron.after(since):
        if slot > now or len(slots) >= limit:
            break
        slots.append(slot)
    return Due(slots, skipped)


def missed(cron: Cron, since: datetime, fired: datetime) -> int:
    """How many slots in (since, fired) were passed over when `fired` was fired (catch-up)."""
    count = 0
    for slot in cron.after(since):
        if slot >= fired or count >= 10_000:
            return count
        count += 1
    return count


PERIOD_SAMPLE = 200
"""Slots read to judge a cron expression's shortest period (TASKLINE_MIN_SCHEDULE_PERIOD_S)."""


def too_frequent(cron: Cron, after: datetime, min_period_s: float) -> float | None:
    """The shortest gap, in seconds, between two of the PERIOD_SAMPLE slots after `after` when
    it is shorter than `min_period_s`; None when none is (slots are whole seconds apart, so a
    minimum of 1 s holds for every expression and nothing is read)."""
    if min_period_s <= 1:
        return None
    slots = cron.after(after)
    try:
        previous = next(slots)
        for _ in range(PERIOD_SAMPLE - 1):
            slot = next(slots)
            gap = (slot - previous).total_seconds()
            if gap < min_period_s:
                return gap
            previous = slot
    except NO_SLOT:  # slots years apart: croniter gives up before it finds the next one
        return None
    return None


QUOTA_CLIENT = "quota_client"
"""The key of a schedule's stored job naming the client whose enqueue quota its slots' jobs
count against: the principal that created or last replaced it through the API. Declarations
in code (`@periodic`) have none, and their jobs count against no quota."""


def next_due(cron: Cron, since: datetime, now: datetime) -> datetime:
    """The first slot after both `since` and `now`: nothing is due before it."""
    return next(cron.after(max(since, now)))


NOT_IN_A_SCHEDULE = ("delay_s", "run_at", "idempotency_key", "debounce")
"""Job fields a slot decides for itself: each slot runs at its instant, once (so its job joins
no other job). `unique` is kept: a slot whose key a job still holds in scope fires no job."""


def schedule_job(body: object, settings: Settings) -> tuple[dict[str, Any] | None,
                                                          list[FieldError]]:
    """A schedule's job body, validated by the rules of POST /api/v1/jobs (taskline.jobspec)
    minus NOT_IN_A_SCHEDULE, with the defaults filled in (so every slot's job is the same
    whatever the settings are when it fires); or the field errors, named `job.<field>`."""
    if body is None:
        return None, [FieldError("job", "required")]
    if not isinstance(body, dict):
        return None, [FieldError("job", "must be a JSON object (a job body as POST /jobs takes)")]
    errors = [FieldError(f"job.{k}", "not allowed in a schedule's job: each slot runs at its "
                         "instant, once") for k in NOT_IN_A_SCHEDULE if k in body]
    parsed = parse_job({k: v for k, v in body.items() if k not in NOT_IN_A_SCHEDULE}, settings)
    if not isinstance(parsed, JobSpec):
        errors += [FieldError(f"job.{e.field}".replace(".$", ""), e.message) for e in parsed]
    if isinstance(parsed, JobSpec) and parsed.unique is not None and parsed.unique.replace:
        errors.append(FieldError("job.unique.on_conflict", "a slot whose key a job holds fires "
                                 "no job: a schedule takes only \"return\""))
    if errors or not isinstance(parsed, JobSpec):
        return None, errors
    job = {"type": parsed.type, "payload": parsed.payload, "queue": parsed.queue,
           "priority": parsed.priority, "max_retries": parsed.max_retries,
           "timeout_s": parsed.timeout_s}
    if parsed.limit_key is not None:
        job["limit_key"] = parsed.limit_key
    if parsed.unique is not None:  # stored with its key, the default one computed once
        job["unique"] = as_json(parsed.unique)
    return job, []


def declared(name: str, spec: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """A schedule declared in code (`@periodic`) as `Store.upsert_schedule` takes it, its job
    checked by the same rules as the API's (schedule_job); InvalidSchedule naming what is
    wrong."""
    if not valid_name(name):
        raise InvalidSchedule(f"schedule name {name!r}: must be {NAME_RULE}")
    cron = Cron.parse(spec["cron"], spec["timezone"])
    gap = too_frequent(cron, datetime.now(UTC), settings.min_schedule_period_s)
    if gap is not None:
        raise InvalidSchedule(f"schedule {name}: slots {gap:g} s apart, less than "
                              f"TASKLINE_MIN_SCHEDULE_PERIOD_S={settings.min_schedule_period_s:g}")
    if spec["catch_up"] not in CATCH_UP:
        raise InvalidSchedule(f"schedule {name}: catch_up must be latest or none")
    job, errors = schedule_job(spec["job"], settings)
    if job is None:
        raise InvalidSchedule(f"schedule {name}: " + "; ".join(
            f"{e.field}: {e.message}" for e in errors))
    return {"cron": spec["cron"], "timezone": spec["timezone"], "catch_up": spec["catch_up"],
            "paused": bool(spec["paused"]), "job": job}
