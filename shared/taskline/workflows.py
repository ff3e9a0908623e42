"""Workflows: jobs that wait for other jobs, inserted whole, with their status derived.

A workflow is a set of steps, each a job with the ids of the steps it waits for (`after`). A
step without parents starts queued (or scheduled); a step with parents starts `waiting` with
`pending_parents` set to their number, and the transaction that records the success of its
last parent queues it (the store's `settle_releasing`, run by `Store.settle`). A step's
`when` (When) changes what it waits for: `any_failed` is queued by the first parent that ends
dead or cancelled and cancelled (cause `condition_unmet`) when all succeed; `always` is queued
once every parent finished, whatever the outcome. Such a step counts each parent's first
finish only (the edge records it), so a dead parent requeued later changes nothing for it.

Invariants: a workflow is inserted in one transaction, all steps and edges or none
(`insert_workflow` takes the caller's connection); an accepted graph names only its own
steps, once each, with no cycle and at most MAX_STEPS steps (`graph_errors`, pure); a
workflow's status is derived from its steps' states (`workflow_status`), never stored.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from taskline.errors import InvalidJob, QueueLimitReached
from taskline.jobs import TERMINAL, Job, Status, new_job_id
from taskline.store import caller
from taskline.store.params import FIRST_EVENTS, rows_json, uuid_array
from taskline.store.queries import DEFAULT_SCHEMA
from taskline.store.rows import CONDITION_UNMET

MAX_STEPS = 1000
MAX_QUEUES = 1000
"""TASKLINE_MAX_QUEUES's default, for a caller that passes no settings."""
MAX_STEP_ID_CHARS = 200


class When:
    """What a step waits for (strings, as the API takes them)."""

    ALL_SUCCEEDED = "all_succeeded"
    ANY_FAILED = "any_failed"
    ALWAYS = "always"


WHENS = (When.ALL_SUCCEEDED, When.ANY_FAILED, When.ALWAYS)
UNMET = CONDITION_UNMET
"""The cause of an `any_failed` step's cancellation when every parent succeeded."""


class WorkflowStatus:
    """The derived states of a workflow (strings, as the API returns them)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class StepJob:
    """The validated job of one step: the fields of POST /api/v1/jobs but the key."""

    type: str
    payload: Any = field(default_factory=dict)
    queue: str = "default"
    priority: int = 5
    max_retries: int = 3
    timeout_s: float = 300.0
    delay_s: float = 0.0
    run_at: datetime | None = None
    limit_key: str | None = None
    """The budget it draws from under a `per_key` flow limit."""
    ordering_key: str | None = None
    """Its key's jobs start one at a time; a step with parents takes its place when released."""
    tags: tuple[str, ...] | None = None
    start_within_s: float | None = None
    """Not started this long after its release (a root step: its submission), it lapses."""


@dataclass(frozen=True)
class StepSpec:
    """One step: its id within the workflow, its job and the step ids it waits for."""

    id: str
    job: StepJob
    after: tuple[str, ...] = ()
    when: str = When.ALL_SUCCEEDED


@dataclass(frozen=True)
class StepError:
    """What is wrong with one step (`step` is None for the workflow as a whole)."""

    step: str | None
    message: str
    field: str = "steps"

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "step": self.step, "message": self.message}


@dataclass(frozen=True)
class Submitted:
    """A workflow as inserted (or found by its idempotency key) and its steps' jobs."""

    id: uuid.UUID
    name: str
    created: bool
    jobs: Mapping[str, Job]
    """Step id -> its job; empty for a replay (read the workflow instead)."""
    created_at: datetime | None = None


def graph_errors(steps: Sequence[StepSpec]) -> list[StepError]:
    """Why `steps` is not a workflow: too many or none, a repeated step id, a parent that is
    no step, or a cycle (named by a step on it). Empty when it is one."""
    if not 1 <= len(steps) <= MAX_STEPS:
        return [StepError(None, f"a workflow has 1..{MAX_STEPS} steps, not {len(steps)}")]
    errors: list[StepError] = []
    seen: set[str] = set()
    for step in steps:
        if step.id in seen:
            errors.append(StepError(step.id, f"step id {step.id!r} is repeated"))
        seen.add(step.id)
    for step in steps:
        errors += [StepError(step.id, f"step {step.id!r} waits for unknown step {parent!r}")
                   for parent in step.after if parent not in seen]
        if step.id in step.after:
            errors.append(StepError(step.id, f"step {step.id!r} waits for itself"))
    errors += when_errors(steps)
    if errors:
        return errors
    cyclic = _on_cycle(steps)
    return [StepError(cyclic, f"step {cyclic!r} is on a cycle")] if cyclic else []


def when_errors(steps: Sequence[StepSpec]) -> list[StepError]:
    """A `when` other than all_succeeded needs parents; an `any_failed` step is a leaf (it is
    cancelled when its parents all succeed, which would strand a step waiting for it)."""
    errors = [StepError(s.id, f"`when` must be one of {', '.join(WHENS)}", "when")
              for s in steps if s.when not in WHENS]
    errors += [StepError(s.id, f"step {s.id!r} has `when` {s.when!r} but no parents", "when")
               for s in steps if s.when != When.ALL_SUCCEEDED and not s.after]
    leaves = {s.id for s in steps if s.when == When.ANY_FAILED}
    errors += [StepError(s.id, f"step {s.id!r} waits for {p!r}, an any_failed step: nothing "
                               "may wait for one", "after")
               for s in steps for p in s.after if p in leaves]
    return errors


def _on_cycle(steps: Sequence[StepSpec]) -> str | None:
    """A step on a cycle, or None: Kahn's algorithm leaves exactly the steps on or behind one."""
    order = topological(steps)
    if len(order) == len(steps):
        return None
    placed = set(order)
    return next(s.id for s in steps if s.id not in placed)


def topological(steps: Sequence[StepSpec]) -> list[str]:
    """Step ids parents first (stable: input order among equals); steps on a cycle left out."""
    children: dict[str, list[str]] = {s.id: [] for s in steps}
    pending = {s.id: len(set(s.after)) for s in steps}
    for step in steps:
        for parent in set(step.after):
            children.setdefault(parent, []).append(step.id)
    ready = [s.id for s in steps if pending[s.id] == 0]
    order: list[str] = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for child in children.get(current, []):
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    return order


def workflow_status(statuses: Iterable[Status | str], unmet: int = 0) -> str:
    """Failed while any step is dead; running while any step is unfinished; cancelled when
    all finished and some cancelled other than the `unmet` (any_failed steps cancelled as
    condition_unmet, whose workflow did not fail); succeeded otherwise. `statuses` is a
    status per step or, as a mapping, the number of steps in each status."""
    counts = Counter(statuses) if not isinstance(statuses, Mapping) else statuses
    states = {Status(s) for s, n in counts.items() if n}
    if Status.DEAD in states:
        return WorkflowStatus.FAILED
    if states - TERMINAL:
        return WorkflowStatus.RUNNING
    if counts.get(Status.CANCELLED, 0) > unmet:
        return WorkflowStatus.CANCELLED
    return WorkflowStatus.SUCCEEDED


def _initial_status(step: StepSpec, db_now: datetime | None) -> Status:
    if step.after:
        return Status.WAITING
    if step.job.run_at is not None and db_now is not None:
        return Status.SCHEDULED if step.job.run_at > db_now else Status.QUEUED
    return Status.SCHEDULED if step.job.delay_s > 0 else Status.QUEUED


def step_rows(steps: Sequence[StepSpec], db_now: datetime | None, *,
              trace_context: str | None = None, actor: str | None = None) -> list[dict]:
    """The insert rows of `steps`, parents first, each with a fresh job id."""
    by_id = {s.id: s for s in steps}
    rows = []
    for step_id in topological(steps):
        step = by_id[step_id]
        job = step.job
        rows.append({"id": new_job_id(), "type": job.type, "queue": job.queue,
                     "payload": job.payload, "priority": job.priority,
                     "status": _initial_status(step, db_now), "max_retries": job.max_retries,
                     "timeout_s": job.timeout_s, "run_at": job.run_at, "delay_s": job.delay_s,
                     "trace_context": trace_context, "actor": actor, "step": step.id,
                     "limit_key": job.limit_key, "ordering_key": job.ordering_key,
                     "tags": job.tags, "start_within_s": job.start_within_s,
                     "pending_parents": len(set(step.after)),
                     "run_when": None if step.when == When.ALL_SUCCEEDED else step.when})
    return rows


def insert_workflow(conn: Connection, name: str, steps: Sequence[StepSpec], *,
                    idempotency_key: str | None = None, request_hash: str | None = None,
                    trace_context: str | None = None, actor: str | None = None,
                    announce: bool = False, schema: str = DEFAULT_SCHEMA,
                    max_queues: int = MAX_QUEUES) -> Submitted:
    """Insert a workflow, its steps and their edges on `conn`, inside its transaction: all of
    it commits with the caller's transaction or none of it does. ValueError when `steps` is
    not a workflow (graph_errors). A workflow whose idempotency key exists is returned as
    found (`created` False); the caller compares `request_hash`. `announce` owes the steps that
    start now to Redis through the enqueue outbox (for a caller that cannot push after its
    commit, as `taskline.submit_workflow`); the API pushes them itself. `conn` is anything
    taskline.store.caller runs on; `ainsert_workflow` is the same on an async connection.
    Steps for a queue past `max_queues` (TASKLINE_MAX_QUEUES) raise QueueLimitReached: no step
    is written, and the caller's rollback undoes the workflow's row."""
    plan = insert_plan(name, steps, idempotency_key=idempotency_key, request_hash=request_hash,
                       trace_context=trace_context, actor=actor, announce=announce,
                       max_queues=max_queues)
    return caller.drive(conn, plan, schema)


async def ainsert_workflow(conn: Any, name: str, steps: Sequence[StepSpec], *,
                           idempotency_key: str | None = None, announce: bool = False,
                           schema: str = DEFAULT_SCHEMA,
                           max_queues: int = MAX_QUEUES) -> Submitted:
    """`insert_workflow` on an async connection (taskline.store.caller.adrive)."""
    plan = insert_plan(name, steps, idempotency_key=idempotency_key, announce=announce,
                       max_queues=max_queues)
    return await caller.adrive(conn, plan, schema)


def insert_plan(name: str, steps: Sequence[StepSpec], *, idempotency_key: str | None = None,
                request_hash: str | None = None, trace_context: str | None = None,
                actor: str | None = None, announce: bool = False,
                max_queues: int = MAX_QUEUES) -> caller.Plan[Submitted]:
    """The statements of insert_workflow, prepared without I/O (taskline.store.caller)."""
    errors = graph_errors(steps)
    if errors:
        raise ValueError("; ".join(e.message for e in errors))
    workflow_id = new_job_id()
    inserted = yield caller.Statement("insert_workflow", {
        "id": workflow_id, "name": name, "idempotency_key": idempotency_key,
        "request_hash": request_hash})
    if not inserted:
        found = yield caller.Statement("get_workflow_by_key",
                                       {"idempotency_key": idempotency_key or ""})
        if not found:
            raise RuntimeError(f"workflow key {idempotency_key!r} conflicted but none holds it")
        return Submitted(found[0].id, found[0].name, False, {}, found[0].created_at)
    db_now = ((yield caller.Statement("database_now", {}))[0].now
              if any(s.job.run_at is not None for s in steps) else None)
    rows = step_rows(steps, db_now, trace_context=trace_context, actor=actor)
    stored = yield caller.Statement("insert_steps", {
        "jobs": rows_json(rows), "workflow_id": workflow_id, "first_events": FIRST_EVENTS,
        "max_queues": max_queues})
    if stored and stored[0].refused is not None:
        raise QueueLimitReached(list(stored[0].refused), max_queues)
    jobs = {job.step or "": job for job in (Job.from_row(r) for r in stored)}
    edges = [{"parent_id": jobs[parent].id, "child_id": jobs[step.id].id}
             for step in steps for parent in sorted(set(step.after))]
    if edges:
        yield caller.Statement("insert_dependencies", {"edges": rows_json(edges)})
    starting = [j.id for j in jobs.values() if j.status is not Status.WAITING]
    if announce and starting:
        yield caller.Statement("announce_steps", {"ids": uuid_array(starting)})
    return Submitted(workflow_id, name, True, jobs, inserted[0].created_at)


def step_from_dict(data: Mapping[str, Any]) -> StepSpec:
    """A StepSpec from the JSON shape of one step (`{"id", "job", "after", "when"}`), for in-process
    callers (`taskline.submit_workflow`); the API validates its input field by field first."""
    job = dict(data["job"])
    for name in ("unique", "debounce"):
        if name in job:
            raise InvalidJob([{"field": f"steps.{data.get('id')}.job.{name}",
                               "message": f"a workflow step takes no {name}: it runs once "
                                          "per workflow"}])
    job_fields = {k: job[k] for k in ("payload", "queue", "priority", "max_retries",
                                      "timeout_s", "delay_s", "run_at", "limit_key",
                                      "ordering_key", "tags", "start_within_s")
                  if k in job}
    return StepSpec(str(data["id"]), StepJob(type=str(job["type"]), **job_fields),
                    tuple(str(p) for p in data.get("after", ())),
                    str(data.get("when", When.ALL_SUCCEEDED)))
