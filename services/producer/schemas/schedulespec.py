"""Schedule specs: a PUT /api/v1/schedules/{name} body turned into a validated spec or errors.

Invariant: a ScheduleSpec holds a cron expression and time zone taskline.schedules can read,
whose slots are at least TASKLINE_MIN_SCHEDULE_PERIOD_S apart (judged over its next slots),
`catch_up` latest or none, and a job body validated by taskline.schedules.schedule_job (the
rules of POST /api/v1/jobs minus what a slot decides for itself), which `@periodic`
declarations go through too. No I/O happens here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from taskline.jobspec import FieldError
from taskline.schedules import (
    CATCH_UP,
    NAME_RULE,
    Cron,
    InvalidSchedule,
    schedule_job,
    too_frequent,
    valid_name,
)
from taskline.settings import Settings

FIELDS = frozenset({"cron", "timezone", "job", "paused", "catch_up"})


@dataclass(frozen=True)
class ScheduleSpec:
    """A validated schedule definition, as the store writes it."""

    name: str
    cron: str
    timezone: str
    job: dict[str, Any]
    paused: bool
    catch_up: str


def parse_schedule(name: str, body: object, settings: Settings) -> ScheduleSpec | list[FieldError]:
    if not isinstance(body, dict):
        return [FieldError("$", "the request body must be a JSON object")]
    errors = [FieldError(field, "unknown field") for field in body if field not in FIELDS]
    if not valid_name(name):
        errors.append(FieldError("name", f"must be {NAME_RULE}"))
    cron, cron_errors = _cron(body)
    if cron is not None:
        gap = too_frequent(cron, datetime.now(UTC), settings.min_schedule_period_s)
        if gap is not None:
            cron_errors.append(FieldError("cron", (
                f"fires {gap:g} s apart at times; at least "
                f"{settings.min_schedule_period_s:g} s (TASKLINE_MIN_SCHEDULE_PERIOD_S)")))
    job, job_errors = schedule_job(body.get("job"), settings)
    errors += cron_errors + job_errors
    paused = body.get("paused", False)
    if not isinstance(paused, bool):
        errors.append(FieldError("paused", "must be a boolean"))
    catch_up = body.get("catch_up", "latest")
    if catch_up not in CATCH_UP:
        errors.append(FieldError("catch_up", "must be one of latest, none"))
    if errors or cron is None or job is None:
        return errors
    return ScheduleSpec(name, cron.expression, str(body.get("timezone", "UTC")), job, paused,
                        catch_up)


def _cron(body: dict[str, Any]) -> tuple[Cron | None, list[FieldError]]:
    zone = body.get("timezone", "UTC")
    if "cron" not in body:
        return None, [FieldError("cron", "required")]
    try:
        return Cron.parse(body["cron"], zone if isinstance(zone, str) else ""), []
    except InvalidSchedule as err:
        # Which of the two is wrong: the zone alone decides whether the zone is.
        try:
            Cron.parse("* * * * *", zone if isinstance(zone, str) else "")
        except InvalidSchedule as zone_err:
            return None, [FieldError("timezone", str(zone_err))]
        return None, [FieldError("cron", str(err))]
