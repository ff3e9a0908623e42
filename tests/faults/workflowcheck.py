"""The fault checker's model of workflows: every step runs only after all its parents
succeeded, and each is released exactly once.

Written from the contract, not from the product's SQL: a step with parents starts `waiting`
(its first event); it is released by one `unblocked` event, never two, and only once every
parent has a `succeeded` event no later than that release; it is claimed and executed only
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
    for row in query("SELECT parent_id, child_id FROM job_dependencies"):
        edges[str(row["child_id"])].append(str(row["parent_id"]))
    return edges


def workflow_violations(query: Query, snap: Snapshot) -> list[str]:
    """Every violation of the release model, over every step with parents."""
    problems: list[str] = []
    for child, parents in sorted(parents_of(query).items()):
        if child in snap.jobs:
            problems += [f"workflow step {child}: {p}"
                         for p in step_violations(child, parents, snap)]
    return problems


def _times(events: list[dict], name: str) -> list[Any]:
    return [e["created_at"] for e in events if e["event"] == name]


def step_violations(child: str, parents: list[str], snap: Snapshot) -> list[str]:
    events = snap.events.get(child, [])
    released = _times(events, "unblocked")
    problems = []
    if not events or events[0]["event"] != "waiting":
        problems.append(f"first event is {events[0]['event'] if events else None}, not waiting")
    if len(released) > 1:
        problems.append(f"released {len(released)} times")
    succeeded = {p: _times(snap.events.get(p, []), "succeeded") for p in parents}
    all_done = all(snap.jobs.get(p, {}).get("status") == "succeeded" for p in parents)
    if released:
        problems += _release_violations(released[0], succeeded)
    elif all_done and snap.jobs[child]["status"] == "waiting":
        problems.append("every parent succeeded but the step is still waiting (lost release)")
    problems += _run_violations(child, released, snap)
    return problems


def _release_violations(at: Any, succeeded: Mapping[str, list[Any]]) -> list[str]:
    """Released at `at`: every parent had succeeded by then."""
    return [f"released at {at} before parent {p} succeeded ({times or 'never'})"
            for p, times in sorted(succeeded.items()) if not times or min(times) > at]


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
