"""The workflows' statements: insert a workflow, its steps and edges; cancel a step or a whole
workflow with the dependents that wait for it; read steps, counts and parents' results.

Every cancel takes its move from the lifecycle's table (CANCEL, REQUEST_CANCEL; the cascade
through `params.cascade`), so waiting dependents are cancelled by the same move as a job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from taskline import transitions
from taskline.jobs import Job, Status
from taskline.store.aggregate import Aggregate
from taskline.store.params import FIRST_EVENTS, cascade, move_params, rows_json, uuid_array
from taskline.store.rows import StepCounts


class Workflows(Aggregate):
    def insert_workflow(self, conn: Connection, *, id: uuid.UUID, name: str,
                        idempotency_key: str | None, request_hash: str | None) -> dict | None:
        """Insert a workflow row; None when its idempotency key already exists."""
        rows = self._run("insert_workflow", {"id": id, "name": name,
                                             "idempotency_key": idempotency_key,
                                             "request_hash": request_hash}, conn)
        return dict(rows[0]._mapping) if rows else None

    def get_workflow_by_key(self, key: str, conn: Connection | None = None) -> dict | None:
        rows = self._run("get_workflow_by_key", {"idempotency_key": key}, conn)
        return dict(rows[0]._mapping) if rows else None

    def insert_steps(self, conn: Connection, workflow_id: uuid.UUID,
                     jobs: Sequence[dict[str, Any]]) -> list[Job]:
        """Insert a workflow's steps (insert_job's fields with `step` and `pending_parents`),
        each with its first event; returns them as stored."""
        rows = self._refusing(self._run("insert_steps", {
            "jobs": rows_json(list(jobs)), "workflow_id": workflow_id,
            "first_events": FIRST_EVENTS, "max_queues": self.max_queues}, conn))
        return [Job.from_row(r) for r in rows]

    def insert_dependencies(self, conn: Connection,
                            edges: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> None:
        """Insert (parent id, child id) edges."""
        if edges:
            self._run("insert_dependencies", {"edges": rows_json(
                [{"parent_id": p, "child_id": c} for p, c in edges])}, conn)

    def cancel_waiting_dependents(self, job_ids: Sequence[uuid.UUID], actor: str | None = None,
                                  conn: Connection | None = None, *,
                                  ended: Sequence[uuid.UUID] = ()) -> list[Job]:
        """Cancel what waits for the success of `job_ids` (transitively); returns the jobs
        cancelled, then the `when` steps those cancellations queued (status queued). `ended`
        lists those of `job_ids` cancelled in this transaction: their `when` children count
        them now (a running job asked to stop is counted when its attempt ends)."""
        rows = self._run("cancel_waiting_dependents", {
            "ids": uuid_array(job_ids), "ended": uuid_array(ended), "actor": actor,
            **cascade("parent_cancelled")}, conn)
        return [Job.from_row(r) for r in rows]

    def cancel_step(self, job_id: uuid.UUID, actor: str | None = None) -> tuple[Job | None,
                                                                                 list[Job]]:
        """Cancel a pending or waiting job and, when it is a workflow step, its waiting
        dependents, in one transaction: (the job or None, the dependents cancelled and the
        `when` steps queued, as cancel_waiting_dependents)."""
        with self.transaction() as conn:
            rows = self._run("cancel_pending_job", {"id": job_id, "actor": actor,
                                                    **move_params(transitions.CANCEL)}, conn)
            job = Job.from_row(rows[0]) if rows else None
            if job is None or job.workflow_id is None:
                return job, []
            return job, self.cancel_waiting_dependents([job.id], actor, conn, ended=[job.id])

    def request_cancel_step(self, job_id: uuid.UUID,
                            actor: str | None = None) -> tuple[Job | None, list[Job]]:
        """Ask a running job to stop and, when it is a workflow step, cancel its waiting
        dependents (they can no longer count on it), in one transaction."""
        with self.transaction() as conn:
            rows = self._run("cancel_running_job", {
                "id": job_id, "actor": actor, **move_params(transitions.REQUEST_CANCEL)}, conn)
            job = Job.from_row(rows[0]) if rows else None
            if job is None or job.workflow_id is None:
                return job, []
            return job, self.cancel_waiting_dependents([job.id], actor, conn)

    def cancel_workflow(self, workflow_id: uuid.UUID,
                        actor: str | None = None) -> tuple[list[Job], list[Job]]:
        """Cancel every unfinished step of a workflow in one transaction: (cancelled, asked to
        stop). Running steps are locked first, as a settling worker locks a parent before its
        children, so the two cannot deadlock."""
        with self.transaction() as conn:
            stop = move_params(transitions.REQUEST_CANCEL)
            asked = self._run("stop_workflow_steps", {"workflow_id": workflow_id,
                                                      "actor": actor, **stop}, conn)
            cancelled = self._run("cancel_workflow_steps", {
                "workflow_id": workflow_id, "actor": actor,
                **move_params(transitions.CANCEL)}, conn)
        return [Job.from_row(r) for r in cancelled], [Job.from_row(r) for r in asked]

    def get_workflow(self, workflow_id: uuid.UUID) -> dict | None:
        rows = self._run("get_workflow", {"id": workflow_id})
        return dict(rows[0]._mapping) if rows else None

    def workflow_steps(self, workflow_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict]]:
        """{workflow id: its steps (with `after`, the step ids of their parents)}."""
        steps: dict[uuid.UUID, list[dict]] = {w: [] for w in workflow_ids}
        if workflow_ids:
            for r in self._run("workflow_steps", {"ids": uuid_array(workflow_ids)}):
                steps.setdefault(r.workflow_id, []).append(dict(r._mapping))
        return steps

    def workflow_steps_page(self, workflow_id: uuid.UUID, after: uuid.UUID | None,
                            limit: int) -> list[dict]:
        """Up to `limit` steps of a workflow after job id `after`, in job id order, each with
        `after` (the step ids of its parents)."""
        return [dict(r._mapping) for r in self._run("workflow_steps_page", {
            "id": workflow_id, "after": after, "limit": limit})]

    def workflow_step_counts(self, workflow_ids: Sequence[uuid.UUID]
                             ) -> dict[uuid.UUID, StepCounts]:
        """{workflow id: how many of its steps are in each status, and how many of the
        cancelled ones are any_failed steps cancelled as condition_unmet}."""
        counts: dict[uuid.UUID, StepCounts] = {w: StepCounts({}, 0) for w in workflow_ids}
        if workflow_ids:
            for r in self._run("workflow_step_counts", {"ids": uuid_array(workflow_ids)}):
                found = counts.setdefault(r.workflow_id, StepCounts({}, 0))
                found.by_status[r.status] = int(r.n)
                counts[r.workflow_id] = StepCounts(found.by_status, found.unmet + int(r.unmet))
        return counts

    def list_workflows(self, *, after: tuple[datetime, uuid.UUID] | None,
                       limit: int) -> list[dict]:
        params = {"limit": limit, "after_created": after[0] if after else None,
                  "after_id": after[1] if after else None}
        return [dict(r._mapping) for r in self._run("list_workflows", params)]

    def parent_results(self, job_id: uuid.UUID) -> dict[str, Any]:
        """{parent step id: its stored result} of a workflow step; a parent that did not
        succeed (what a `when` step reads) gives {"status", "error", "attempts"} instead."""
        return {r.step: r.result if r.status == Status.SUCCEEDED.value
                else {"status": r.status, "error": r.last_error, "attempts": r.attempts}
                for r in self._run("parent_results", {"id": job_id})}

    def cancel_dependents_of_expired_dead(self, retain_s: float, limit: int) -> list[Job]:
        """Cancel what waits for the success of workflow steps dead longer than `retain_s`;
        the jobs cancelled, then the `when` steps that queued (as cancel_waiting_dependents)."""
        return [Job.from_row(r) for r in self._run("cancel_dependents_of_expired_dead", {
            "retain_s": retain_s, "limit": limit, "actor": None,
            **cascade("parent_expired")})]

    def announce_steps(self, conn: Connection, job_ids: Sequence[uuid.UUID]) -> None:
        """Owe new workflow steps to Redis through the enqueue outbox, on the caller's
        transaction: the relay pushes them once it commits (taskline.enqueuing)."""
        if job_ids:
            self._run("announce_steps", {"ids": uuid_array(job_ids)}, conn)

    def waiting_counts(self) -> dict[str, int]:
        """{queue: workflow steps waiting for their parents}."""
        return {r.queue: int(r.n) for r in self._run("waiting_counts", {})}

    def delete_empty_workflows(self, retain_s: float, limit: int) -> int:
        """Delete workflows older than `retain_s` whose steps retention has all deleted."""
        return len(self._run("delete_empty_workflows", {"retain_s": retain_s, "limit": limit}))
