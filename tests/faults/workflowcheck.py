"""The fault checker's model of workflows: every step runs only once its condition held, and
each is released (or cancelled as condition_unmet) exactly once.

Written from the contract, not from the product's SQL: a step with parents starts `waiting`
(its first event); it is released by one `unblocked` event, never two, and only once its
condition held no later than that release, or in the very transaction that wrote the release
(the contract's "in the same transaction": the order of rows one transaction writes says
nothing, so that is judged by transaction id). The condition is the step's `when`
(`jobs.run_when`, what the submitter declared): every parent has a `succeeded` event (the
default); some parent ended dead or cancelled (`any_failed`); every parent ended, whatever
the outcome (`always`). A parent ends by `succeeded`, `dead_lettered`, `cancelled`, or a
`recovered` event whose detail says dead: this model names them itself. An `any_failed` step
cancelled with cause `condition_unmet` is so only once every parent succeeded, and is never
also released. A step is claimed and executed only after its release; one whose condition
held is not left waiting (a lost release), nor is an `any_failed` one whose parents all
succeeded (a lost cancellation). Times are PostgreSQL's (`job_events.created_at` and
`fault_exec_log.started_at`, both `clock_timestamp()` of one server), so they are comparable
across processes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.faults.checker import Snapshot

Query = Callable[..., list[dict]]


def parents_of(query: Query) -> dict[str, list[str]]:
    """Child job id -> its parents' job ids, from the edges table."""
    edges: dict[str, list[str]] = defaultdict(list)
    for row in query("SELECT parent_id, child_id FROM taskline.job_dependencies"):
        edges[str(row["child_id"])].append(str(row["parent_id"]))
    return edges


def transactions_of(query: Query) -> dict[int, str]:
    """Event id -> the transaction that wrote it, for successes and releases."""
    return {int(r["id"]): str(r["xid"]) for r in query(
        "SELECT id, xmin::text AS xid FROM taskline.job_events WHERE event IN ('succeeded', "
        "'unblocked', 'dead_lettered', 'cancelled', 'recovered')")}


def workflow_violations(query: Query, snap: Snapshot) -> list[str]:
    """Every violation of the release model, over every step with parents."""
    problems: list[str] = []
    xids = transactions_of(query)
    for child, parents in sorted(parents_of(query).items()):
        if child in snap.jobs:
            problems += [f"workflow step {child}: {p}"
                         for p in step_violations(child, parents, snap, xids)]
    return problems


def _times(events: list[dict], name: str) -> list[Any]:
    return [e["created_at"] for e in events if e["event"] == name]


def _named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


FAILED = frozenset({"dead", "cancelled"})
ENDS = frozenset({"succeeded", *FAILED})


def ended(event: Mapping[str, Any]) -> str | None:
    """The state a parent's event ends it in (succeeded, dead, cancelled), else None."""
    name = event["event"]
    if name == "recovered":
        return "dead" if (event.get("detail") or {}).get("status") == "dead" else None
    return {"succeeded": "succeeded", "dead_lettered": "dead", "cancelled": "cancelled",
            "lapsed": "cancelled"}.get(name)


def step_violations(child: str, parents: list[str], snap: Snapshot,
                    xids: Mapping[int, str] | None = None) -> list[str]:
    events = snap.events.get(child, [])
    when = snap.jobs.get(child, {}).get("run_when") or "all_succeeded"
    released = _named(events, "unblocked")
    unmet = [e for e in _named(events, "cancelled")
             if (e.get("detail") or {}).get("cause") == "condition_unmet"]
    ends = {p: [(e, ended(e)) for e in snap.events.get(p, []) if ended(e)] for p in parents}
    problems = []
    if not events or events[0]["event"] != "waiting":
        problems.append(f"first event is {events[0]['event'] if events else None}, not waiting")
    if len(released) > 1:
        problems.append(f"released {len(released)} times")
    if released and unmet:
        problems.append("both released and cancelled as condition_unmet")
    if released:
        problems += _release_violations(released[0], ends, when, xids or {})
    elif unmet:
        problems += _unmet_violations(unmet[0], ends, when, xids or {})
    elif snap.jobs[child]["status"] == "waiting":
        problems += _lost(ends, when)
    problems += _run_violations(child, [e["created_at"] for e in released], snap)
    return problems


def _by(mark: Mapping[str, Any], xids: Mapping[int, str]) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an event came no later than `mark`, or in its transaction."""
    at, xid = mark["created_at"], xids.get(mark["id"])
    return lambda e: e["created_at"] <= at or (xid is not None and xids.get(e["id"]) == xid)


def _release_violations(release: Mapping[str, Any],
                        ends: Mapping[str, list[tuple[dict, str | None]]], when: str,
                        xids: Mapping[int, str]) -> list[str]:
    """The step's condition held by the release, or in its transaction."""
    before, at = _by(release, xids), release["created_at"]
    if when == "any_failed":
        if any(end in FAILED and before(e) for found in ends.values() for e, end in found):
            return []
        return [f"released at {at} (any_failed) before any parent ended dead or cancelled"]
    wanted = ENDS if when == "always" else {"succeeded"}
    verb = "finished" if when == "always" else "succeeded"
    return [f"released at {at} before parent {p} {verb} "
            f"({[e['created_at'] for e, end in found if end in wanted] or 'never'})"
            for p, found in sorted(ends.items())
            if not any(end in wanted and before(e) for e, end in found)]


def _unmet_violations(cancel: Mapping[str, Any],
                      ends: Mapping[str, list[tuple[dict, str | None]]], when: str,
                      xids: Mapping[int, str]) -> list[str]:
    """Only an any_failed step, and only once every parent succeeded."""
    if when != "any_failed":
        return [f"a {when} step cancelled as condition_unmet"]
    before = _by(cancel, xids)
    return [f"cancelled as condition_unmet at {cancel['created_at']} before parent {p} "
            "succeeded" for p, found in sorted(ends.items())
            if not any(end == "succeeded" and before(e) for e, end in found)]


def _lost(ends: Mapping[str, list[tuple[dict, str | None]]], when: str) -> list[str]:
    """A waiting step whose condition was decided: a lost release or a lost cancellation."""
    done = {p: {end for _e, end in found} for p, found in ends.items()}
    all_succeeded = all("succeeded" in d for d in done.values())
    if when == "any_failed" and any(d & FAILED for d in done.values()):
        return ["a parent ended dead or cancelled but the any_failed step is still waiting "
                "(lost release)"]
    if when == "any_failed" and all_succeeded:
        return ["every parent succeeded but the any_failed step is still waiting "
                "(lost condition_unmet)"]
    if when == "always" and all(done.values()):
        return ["every parent finished but the always step is still waiting (lost release)"]
    if when == "all_succeeded" and all_succeeded:
        return ["every parent succeeded but the step is still waiting (lost release)"]
    return []


def _run_violations(child: str, released: list[Any], snap: Snapshot) -> list[str]:
    """Claimed and executed only after the release."""
    claims = _times(snap.events.get(child, []), "claimed")
    starts = [e["started_at"] for e in snap.execs.get(child, [])]
    if not claims and not starts:
        return []
    if not released:
        return [f"ran ({len(claims)} claims, {len(starts)} executions) without a release"]
    early = [t for t in claims + starts if t < released[0]]
    return [f"ran at {t} before its release at {released[0]}" for t in early]
