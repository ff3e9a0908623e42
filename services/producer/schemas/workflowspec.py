"""Workflow specs: a parsed POST /api/v1/workflows body turned into steps, or field errors.

Invariant: a body is accepted only whole. Each step is `{"id", "job", "after", "when"}` with a
job body as POST /api/v1/jobs takes it (less the idempotency key: the workflow has one, and a
step's key could name a job outside the workflow), and the steps form a graph
`taskline.workflows` accepts (no repeated or unknown step id, no cycle, 1..1000 steps, a
`when` step with parents, nothing after an `any_failed` step). Every error names its step.
No I/O happens here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from taskline.jobspec import (
    KEY_CODE,
    MAX_KEY_CHARS,
    FieldError,
    InvalidKey,
    JobSpec,
    key_from_header,
    parse_job,
    request_hash,
)
from taskline.settings import Settings
from taskline.workflows import (
    MAX_STEP_ID_CHARS,
    MAX_STEPS,
    WHENS,
    StepError,
    StepJob,
    StepSpec,
    When,
    graph_errors,
)

FIELDS = frozenset({"name", "steps", "idempotency_key"})
STEP_FIELDS = frozenset({"id", "job", "after", "when"})
MAX_NAME_CHARS = 200
_KEY = re.compile(rf"[!-~]{{1,{MAX_KEY_CHARS}}}")


@dataclass(frozen=True)
class WorkflowSpec:
    """A validated request to submit one workflow."""

    name: str
    steps: list[StepSpec]
    idempotency_key: str | None
    request_hash: str | None


def parse_workflow(body: object, settings: Settings,
                   header_key: str | None = None) -> WorkflowSpec | list[FieldError]:
    """Validate a workflow request; `header_key` is the Idempotency-Key header, if sent."""
    if not isinstance(body, dict):
        return [FieldError("$", "the request body must be a JSON object")]
    errors = [FieldError(name, "unknown field") for name in body if name not in FIELDS]
    name = body.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS or "\x00" in name:
        errors.append(FieldError("name", f"must be a string of 1..{MAX_NAME_CHARS} characters"))
    key, key_errors = _key(body, header_key)
    errors += key_errors
    raw = body.get("steps")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_STEPS:
        return [*errors, FieldError("steps", f"must be an array of 1..{MAX_STEPS} steps")]
    steps: list[StepSpec] = []
    for index, item in enumerate(raw):
        parsed = _step(index, item, settings)
        if isinstance(parsed, StepSpec):
            steps.append(parsed)
        else:
            errors += parsed
    if not errors:
        errors = [FieldError(_field(e, steps), e.message) for e in graph_errors(steps)]
    if errors:
        return errors
    digest = request_hash(body) if key is not None else None
    return WorkflowSpec(str(name), steps, key, digest)


def _key(body: dict[str, Any], header_key: str | None) -> tuple[str | None, list[FieldError]]:
    """The workflow's idempotency key, from the header or the body (as for jobs: both may be
    given only when they agree)."""
    keys: dict[str, str] = {}
    errors: list[FieldError] = []
    given = [("Idempotency-Key", header_key, key_from_header)] if header_key is not None else []
    if "idempotency_key" in body:  # null is no key: refused like any other non-string
        given.append(("idempotency_key", body["idempotency_key"], _body_key))
    for where, raw, parse in given:
        try:
            keys[where] = parse(raw)
        except ValueError as err:
            errors.append(FieldError(where, str(err), KEY_CODE))
    if len(set(keys.values())) > 1:
        errors.append(FieldError("idempotency_key", "differs from the Idempotency-Key header"))
    return next(iter(keys.values()), None), errors


def _body_key(value: object) -> str:
    if not isinstance(value, str) or not _KEY.fullmatch(value):
        raise InvalidKey(f"must be 1..{MAX_KEY_CHARS} visible ASCII characters (! to ~)")
    return value


def _field(error: StepError, steps: list[StepSpec]) -> str:
    """The field a graph error names: its step, and the step's field when it names one."""
    where = _where(error.step, steps)
    return where if error.field == "steps" or where == "steps" else f"{where}.{error.field}"


def _where(step_id: str | None, steps: list[StepSpec]) -> str:
    """`steps[i]` of the step named `step_id` (its first occurrence), else `steps`."""
    for index, step in enumerate(steps):
        if step.id == step_id:
            return f"steps[{index}] ({step_id})"
    return "steps"


def _step(index: int, item: object, settings: Settings) -> StepSpec | list[FieldError]:
    where = f"steps[{index}]"
    if not isinstance(item, dict):
        return [FieldError(where, "must be an object with id, job and after")]
    errors = [FieldError(f"{where}.{name}", "unknown field") for name in item
              if name not in STEP_FIELDS]
    step_id = item.get("id")
    if not isinstance(step_id, str) or not 1 <= len(step_id) <= MAX_STEP_ID_CHARS or (
            "\x00" in step_id):
        return [*errors, FieldError(f"{where}.id",
                                    f"must be a string of 1..{MAX_STEP_ID_CHARS} characters")]
    where = f"steps[{index}] ({step_id})"
    after = item.get("after", [])
    if not isinstance(after, list) or not all(isinstance(p, str) for p in after):
        errors.append(FieldError(f"{where}.after", "must be an array of step ids"))
    when = item.get("when", When.ALL_SUCCEEDED)
    if when not in WHENS:
        errors.append(FieldError(f"{where}.when", f"must be one of {', '.join(WHENS)}"))
    if "job" not in item:
        return [*errors, FieldError(f"{where}.job", f"step {step_id!r} has no job")]
    job = _job(where, item["job"], settings, has_parents=bool(after))
    if isinstance(job, list):
        return errors + job
    return errors or StepSpec(step_id, job, tuple(after), when)


def _job(where: str, body: Any, settings: Settings, *,
         has_parents: bool) -> StepJob | list[FieldError]:
    if isinstance(body, dict) and "expires_at" in body:
        return [FieldError(f"{where}.job.expires_at",
                           "a step takes start_within_s (counted from its release), not "
                           "expires_at")]
    if isinstance(body, dict) and "idempotency_key" in body:
        return [FieldError(f"{where}.job.idempotency_key",
                           "a step takes no idempotency key (the workflow has one)")]
    if isinstance(body, dict) and ({"unique", "debounce"} & set(body)):
        field = "unique" if "unique" in body else "debounce"
        return [FieldError(f"{where}.job.{field}",
                           f"a workflow step takes no {field}: it runs once per workflow")]
    if has_parents and isinstance(body, dict) and ({"delay_s", "run_at"} & set(body)):
        return [FieldError(f"{where}.job", "a step with parents starts when they succeed: "
                                           "no delay_s or run_at")]
    parsed = parse_job(body, settings)
    if not isinstance(parsed, JobSpec):
        return [FieldError(f"{where}.job.{e.field}".replace(".$", ""), e.message)
                for e in parsed]
    return StepJob(type=parsed.type, payload=parsed.payload, queue=parsed.queue,
                   priority=parsed.priority, max_retries=parsed.max_retries,
                   timeout_s=parsed.timeout_s, delay_s=parsed.delay_s, run_at=parsed.run_at,
                   limit_key=parsed.limit_key, ordering_key=parsed.ordering_key,
                   tags=parsed.tags, start_within_s=parsed.start_within_s)
