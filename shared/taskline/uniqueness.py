"""Writing jobs with `unique` or `debounce`: one job for many requests, decided under a lock.

Both the API (taskline_producer.operations.enqueuer) and the library (`taskline.enqueue`,
`aenqueue`, `enqueue_many`) write such jobs with this plan (taskline.store.caller: a generator of
statements, run sync or async), inside one transaction; a schedule whose job is unique fires
its slots under the same lock (Store.fire_unique_slot):

1. `lock_enqueue_keys` takes a transaction lock per unique key (queue, key) and per debounce
   group (queue, type, key), all the batch's at once in one global order: writers sharing a
   key queue up behind each other instead of deadlocking.
2. For each job, in its own statements (each a fresh READ COMMITTED snapshot, so it sees what
   the lock's previous holder committed): an idempotency key is looked up first (a replay
   returns its job); then a unique key's job in scope (`find_unique`) is returned or, with
   `on_conflict: replace`, rewritten while it has not started (`replace_unique`; else
   AlreadyStarted, 409 `already_started`); then a debounce arrival joins the newest waiting
   job of its group (`join_debounced`) unless that job holds MAX_COALESCED payloads or the
   payload size limit; otherwise the job is inserted (`insert_keyed_job`).

Invariant: no read-then-write race: the lookup and the write happen while the key's lock is
held, so simultaneous enqueues of one key, through any API process or the library, make one
job. A unique duplicate writes nothing and records no idempotency key. A debounce arrival
joins only a job still `scheduled` (the join re-tests the row under its lock, so a job the
promoter queued meanwhile takes nothing more): every payload that joined is in the job that
runs. Jobs without `unique` or `debounce` never come here (their inserts are unchanged), but a
batch holding one writes all its jobs here, so the batch stays all or none in one transaction.

The lookups run under READ COMMITTED, taskline's and PostgreSQL's default: an application
enqueueing in a REPEATABLE READ transaction sees only its snapshot's jobs (docs/unique.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from taskline import transitions
from taskline.errors import AlreadyStarted, IdempotencyConflict, QueueLimitReached
from taskline.jobs import Event, Job, Status, new_job_id, visible_key
from taskline.jobspec import JobSpec
from taskline.store.caller import Plan, Statement
from taskline.uniquespec import DEBOUNCE_SPAN, MAX_COALESCED, unique_lock

_FIRST = {"first_events": json.dumps(dict(transitions.FIRST_EVENTS)),
          "queued": Status.QUEUED.value, "scheduled": Status.SCHEDULED.value}


@dataclass(frozen=True)
class Written:
    """What one request got: a new job, or the job it was folded into, and how."""

    job: Job
    created: bool
    duplicate: bool = False
    replaced: bool = False
    debounced: bool = False
    replayed: bool = False  # an idempotency key's replay

    @property
    def move(self) -> transitions.Move | None:
        """The transition Redis follows after the commit, if this request made one."""
        if self.created:
            return transitions.CREATED[self.job.status]
        if self.debounced:
            return transitions.JOIN
        if self.replaced:
            return (transitions.REPLACE_QUEUED if self.job.status is Status.QUEUED
                    else transitions.REPLACE_SCHEDULED)
        return None


@dataclass(frozen=True)
class Context:
    """How the plan writes: the queue and payload bounds, whether to owe new jobs to the
    outbox (the library), and what the API stores beside them (trace context, who asked)."""

    max_queues: int
    max_bytes: int
    announce: bool  # the library: outbox rows and signals, as its plain insert writes them
    trace_context: str | None = None
    actor: str | None = None


def keyed(specs: Sequence[JobSpec]) -> bool:
    """Whether the batch goes through this plan (any job with unique or debounce)."""
    # JobSpec.keyed's test without its property call: once per job of every batch.
    return any(s.unique is not None or s.debounce is not None for s in specs)


def lock_text(spec: JobSpec) -> str | None:
    """The text whose hash is the lock of the spec's unique key or debounce group. Both keys arrive
    scoped to their principal already (taskline_producer.operations.replays), as they are stored."""
    if spec.unique is not None:
        return unique_lock(spec.queue, spec.unique.key)
    if spec.debounce is not None:
        return f"debounce\x1f{spec.queue}\x1f{spec.type}\x1f{spec.debounce.key}"
    return None


def write(specs: Sequence[JobSpec], ctx: Context) -> Plan[list[Written]]:
    """The plan writing `specs` (any mix) in the caller's transaction; one Written each."""
    locks = sorted({t for t in (lock_text(s) for s in specs) if t is not None})
    yield Statement("lock_enqueue_keys", {"locks": locks})
    refused = yield Statement("queue_limit_refused", {"queues": sorted({s.queue for s in specs}),
                                                      "max_queues": ctx.max_queues})
    if refused:
        raise QueueLimitReached(list(refused[0].refused), ctx.max_queues)
    written = []
    for spec in specs:
        written.append((yield from _one(spec, ctx)))
    return written


def _one(spec: JobSpec, ctx: Context) -> Plan[Written]:
    if spec.idempotency_key is not None:
        replay = yield from _replay(spec)
        if replay is not None:
            return replay
    if spec.unique is not None:
        found = yield Statement("find_unique", {
            "queue": spec.queue, "unique_key": spec.unique.key,
            "states": list(spec.unique.states), "period_s": spec.unique.period_s})
        if found:
            return (yield from _duplicate(spec, Job.from_row(found[0]), ctx))
    if spec.debounce is not None:
        joined = yield Statement("join_debounced", {
            "queue": spec.queue, "type": spec.type, "debounce_key": spec.debounce.key,
            "payload": _json(spec.payload), "delay_s": spec.debounce.delay_s,
            "span": DEBOUNCE_SPAN, "max_joined": MAX_COALESCED, "max_bytes": ctx.max_bytes,
            "event": Event.JOINED.value, "actor": ctx.actor})
        if joined:
            return Written(Job.from_row(joined[0]), created=False, debounced=True)
    inserted = yield Statement("insert_keyed_job", _row(spec, ctx))
    if inserted:
        return Written(Job.from_row(inserted[0]), created=True)
    # The idempotency key was taken meanwhile by a writer of another unique key (or none).
    replay = yield from _replay(spec)
    if replay is None:
        raise RuntimeError(f"idempotency key {spec.idempotency_key!r} conflicted but no job "
                           "holds it")
    return replay


def _replay(spec: JobSpec) -> Plan[Written | None]:
    """The job the idempotency key names: the same request gets it, another one fails."""
    found = yield Statement("get_job_by_key", {"queue": spec.queue,
                                               "idempotency_key": spec.idempotency_key})
    if not found:
        return None
    if found[0].request_hash != spec.request_hash:
        raise IdempotencyConflict(
            f"idempotency key {visible_key(spec.idempotency_key)!r} was used for job "
            f"{found[0].id} with a different body")
    return Written(Job.from_row(found[0]), created=False, replayed=True)


def _duplicate(spec: JobSpec, job: Job, ctx: Context) -> Plan[Written]:
    """The key's job in scope is the answer; with replace, rewritten unless started."""
    assert spec.unique is not None
    if not spec.unique.replace:
        return Written(job, created=False, duplicate=True)
    replaced = yield Statement("replace_unique", {
        "id": job.id, "payload": _json(spec.payload), "priority": spec.priority,
        "run_at": spec.run_at, "delay_s": spec.delay_s, "event": Event.REPLACED.value,
        "actor": ctx.actor, "announce": ctx.announce})
    if not replaced:
        raise AlreadyStarted(str(job.id), job.status.value, visible_key(job.unique_key))
    return Written(Job.from_row(replaced[0]), created=False, duplicate=True, replaced=True)


def _row(spec: JobSpec, ctx: Context) -> dict[str, Any]:
    return {"id": new_job_id(), "type": spec.type, "queue": spec.queue,
            "payload": _json(spec.payload), "priority": spec.priority,
            "max_retries": spec.max_retries, "timeout_s": spec.timeout_s,
            "run_at": spec.run_at, "delay_s": spec.delay_s,
            "idempotency_key": spec.idempotency_key, "request_hash": spec.request_hash,
            "trace_context": ctx.trace_context, "limit_key": spec.limit_key,
            "unique_key": None if spec.unique is None else spec.unique.key,
            "debounce_key": None if spec.debounce is None else spec.debounce.key,
            "ordering_key": spec.ordering_key,
            "tags": None if spec.tags is None else list(spec.tags),
            "expires_at": spec.expires_at, "start_within_s": spec.start_within_s,
            "actor": ctx.actor, "announce": ctx.announce, **_FIRST}


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
