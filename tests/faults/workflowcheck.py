"""The fault checker's model of workflows: every step runs only after all its parents
succeeded, and each is released exactly once.

Written from the contract, not from the product's SQL: a step with parents starts `waiting`
(its first event); it is released by one `unblocked` event, never two, and only once every
parent has a `succeeded` event no later than that release, or written by the very transaction
that wrote the release (the contract's "in the same transaction": the order of rows one
transaction writes says nothing, so that is judged by transaction id); it is claimed and
executed only
after its release; a step whose parents all succeeded is not left waiting (a lost release);
and one whose parents did not all succeed has not been released. Times are PostgreSQL's
(`job_events.created_at` and `fault_exec_log.started_at`, both `clock_timestamp()` of one
server), so they are comparable across processes.
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
        "'unblocked')")}


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


def step_violations(child: str, parents: list[str], snap: Snapshot,
                    xids: Mapping[int, str] | None = None) -> list[str]:
    events = snap.events.get(child, [])
    released = _times(events, "unblocked")
    problems = []
    if not events or events[0]["event"] != "waiting":
        problems.append(f"first event is {events[0]['event'] if events else None}, not waiting")
    if len(released) > 1:
        problems.append(f"released {len(released)} times")
    succeeded = {p: _named(snap.events.get(p, []), "succeeded") for p in parents}
    all_done = all(snap.jobs.get(p, {}).get("status") == "succeeded" for p in parents)
    if released:
        problems += _release_violations(_named(events, "unblocked")[0], succeeded, xids or {})
    elif all_done and snap.jobs[child]["status"] == "waiting":
        problems.append("every parent succeeded but the step is still waiting (lost release)")
    problems += _run_violations(child, released, snap)
    return problems


def _release_violations(release: Mapping[str, Any], succeeded: Mapping[str, list[dict]],
                        xids: Mapping[int, str]) -> list[str]:
    """Every parent had succeeded by the release, or succeeded in its transaction."""
    at, xid = release["created_at"], xids.get(release["id"])

    def before(success: Mapping[str, Any]) -> bool:
        return success["created_at"] <= at or (
            xid is not None and xids.get(success["id"]) == xid)

    return [f"released at {at} before parent {p} succeeded "
            f"({[e['created_at'] for e in events] or 'never'})"
            for p, events in sorted(succeeded.items()) if not any(before(e) for e in events)]


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
