"""Schedule specs: a PUT /api/v1/schedules/{name} body turned into a validated spec or errors.

Invariant: a ScheduleSpec holds a cron expression and time zone taskline.schedules can read,
`catch_up` latest or none, and a job body validated by the very rules of POST /api/v1/jobs
(taskline.jobspec.parse_job) minus `delay_s`, `run_at` and `idempotency_key`, which
a slot decides for itself. Its job is stored with the defaults filled in, so every slot's job
is the same whatever the API's settings are when it fires. No I/O happens here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taskline.jobspec import FieldError, JobSpec, parse_job
from taskline.schedules import CATCH_UP, NAME_RULE, Cron, InvalidSchedule, valid_name
from taskline.settings import Settings

FIELDS = frozenset({"cron", "timezone", "job", "paused", "catch_up"})
NOT_IN_A_SCHEDULE = ("delay_s", "run_at", "idempotency_key")


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
    job, job_errors = _job(body.get("job"), settings)
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


def _job(body: object, settings: Settings) -> tuple[dict[str, Any] | None, list[FieldError]]:
    if body is None:
        return None, [FieldError("job", "required")]
    if not isinstance(body, dict):
        return None, [FieldError("job", "must be a JSON object (a job body as POST /jobs takes)")]
    errors = [FieldError(f"job.{k}", "not allowed in a schedule's job: each slot runs at its "
                         "instant, once") for k in NOT_IN_A_SCHEDULE if k in body]
    parsed = parse_job({k: v for k, v in body.items() if k not in NOT_IN_A_SCHEDULE}, settings)
    if not isinstance(parsed, JobSpec):
        errors += [FieldError(f"job.{e.field}".replace(".$", ""), e.message) for e in parsed]
    if errors or not isinstance(parsed, JobSpec):
        return None, errors
    return stored_job(parsed), []


def stored_job(spec: JobSpec) -> dict[str, Any]:
    """The job fields a slot's job is inserted with."""
    return {"type": spec.type, "payload": spec.payload, "queue": spec.queue,
            "priority": spec.priority, "max_retries": spec.max_retries,
            "timeout_s": spec.timeout_s}
