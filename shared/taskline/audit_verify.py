"""The audit of a live installation: the invariants of a job's recorded history, as pure rules.

Invariant: a rule reads rows only (jobs, their events and leases, the edges of workflows, the
settings of flow limits in force over time) and returns `Violation`s naming the job; it never
writes, and it judges the lifecycle by the product's own table (`taskline.transitions`). The
rules are those the fault suite's checker proves on test histories: no job holds two
overlapping leases; every finished job has exactly one terminal event per life (a requeue of
a dead job starts a new one), and the attempt that ended it recorded that outcome on its lease;
every event sequence is legal and ends in the state the job holds; no workflow step is released
or claimed before its condition held (`when`: every parent succeeded; any_failed: a parent
ended dead or cancelled; always: every parent finished), nor cancelled as condition_unmet
before every parent succeeded, each no later than the parents' events that decided it (or in
their very transaction); no flow limit admitted a start beyond its concurrency or rate while
its setting was in force; no two jobs of one queue and ordering key ever held leases at once.

`verify(reader, ...)` walks the history a page at a time (each page one consistent snapshot,
paged by creation time and id), so its memory is a page's, plus the leases of jobs with an
ordering key (their key's other jobs may lie on any page) and at most CLEAN_SHAPES job shapes,
and its work linear in jobs. Most jobs of a history take one of a few paths: once the rules
about one job found nothing wrong with a job of some shape (`Page`), a job of the same shape is
neither judged nor are its events and leases read again, only summarised.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Container, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any, Protocol

from taskline.jobs import TERMINAL, Event, Status
from taskline.transitions import MOVES, TABLE, status_after

PAGE_JOBS = 1000
"""Jobs per page: one page's jobs, events and leases are held at once."""
CLEAN_SHAPES = 10_000
"""Job shapes (`Page`) remembered as judged clean: a history has a handful (the few paths a
job takes), and the bound keeps memory flat whatever the history holds."""
RULES = ("lease_overlap", "terminal_outcome", "illegal_sequence", "step_before_parents",
         "flow_limit", "ordering_overlap")


@dataclass(frozen=True)
class Violation:
    """One broken invariant, of one job where the rule is about one."""

    rule: str
    job_id: str | None
    message: str

    def line(self) -> str:
        return f"{self.rule}  job {self.job_id or '-'}  {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "job_id": self.job_id, "message": self.message}


@dataclass
class Page:
    """One snapshot of a page of jobs: their rows, events and leases (each in id order), the
    parents of the workflow steps among them, and those parents' events that may end them
    (success, death, cancellation, a recovery into dead).

    A job row may carry a `shape`: a value equal for two jobs only when the rules about one
    job alone read the same of both (status, attempts, each event's name and recorded state
    and each lease's attempt, outcome and openness, in order), so of a job with at most one
    lease (with two, those rules also compare the leases' times; its shape is None). A job
    whose shape the caller already judged clean comes without its events and leases, unless
    it is a workflow step or has an ordering key (whose rules read more)."""

    jobs: list[Mapping[str, Any]]
    events: Mapping[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    leases: Mapping[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    parents: Mapping[str, list[str]] = field(default_factory=dict)
    finishes: Mapping[str, list[Mapping[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """A flow limit as it was in force from `start` until `end` (None: still in force)."""

    scope: str
    concurrency: int | None
    rate_limit: int | None
    period_s: float | None
    per_key: bool
    start: datetime
    end: datetime | None


class Reader(Protocol):
    """What the audit reads (taskline.store.history.HistoryReader over PostgreSQL)."""

    def pages(self, since: datetime | None, size: int,
              known: Container[Hashable] = ...) -> Iterator[Page]: ...

    def limit_settings(self, since: datetime | None) -> list[Setting]: ...

    def scope_leases(self, setting: Setting) -> Iterator[Mapping[str, Any]]: ...


# --- one job -------------------------------------------------------------------------------

def job_violations(job: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
                   leases: Sequence[Mapping[str, Any]]) -> list[Violation]:
    """Every rule about one job alone."""
    job_id = str(job["id"])
    found = [Violation("lease_overlap", job_id, m) for m in lease_overlaps(leases)]
    found += [Violation("illegal_sequence", job_id, m) for m in sequence_problems(job, events)]
    found += [Violation("terminal_outcome", job_id, m)
              for m in terminal_problems(job, events, leases)]
    return found


def lease_overlaps(leases: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each lease begins only once the one before it was released."""
    return [f"lease {nxt['id']} (attempt {nxt['attempt']}) began at {nxt['leased_at']} while "
            f"lease {prev['id']} was held (released {prev['released_at']})"
            for prev, nxt in pairwise(leases)
            if prev["released_at"] is None or nxt["leased_at"] < prev["released_at"]]


def sequence_problems(job: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Replayed from nothing by the transitions table, every event is a legal move from the
    state the ones before it left, and the last leaves the job in the state its row holds."""
    state: str | None = None
    for event in events:
        allowed = TABLE.get((state, event["event"]))  # type: ignore[call-overload]
        if allowed is None:
            return [f"event {event['id']} {event['event']} is not a move from {state}"]
        after = _after(event)
        if after is None and state is not None and state in allowed:
            after = state  # a move that leaves the state as it was (cancel_requested)
        if after not in allowed:
            return [f"event {event['id']} {event['event']} records state {after}, not one of "
                    f"{sorted(allowed)}"]
        state = after
    if state != job["status"]:
        return [f"history ends in state {state} but the job is {job['status']}"]
    return []


def _recorded(event: Mapping[str, Any]) -> str | None:
    """The state the event's row names: `recorded` as the reader selects it, else its detail."""
    if "recorded" in event:
        return event["recorded"]
    return (event.get("detail") or {}).get("status")


@functools.lru_cache(maxsize=256)
def _status_after(event: str, recorded: str | None) -> str | None:
    return status_after(event, recorded)


def _after(event: Mapping[str, Any]) -> str | None:
    """The job's state right after `event` (None: a move to nowhere, or no move)."""
    return _status_after(event["event"], _recorded(event))


def _is_terminal(event: Mapping[str, Any]) -> bool:
    return _after(event) in TERMINAL


def terminal_problems(job: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
                      leases: Sequence[Mapping[str, Any]]) -> list[str]:
    """One terminal event per life, the last life's only if the job is finished; a finished
    job holds no open lease, and the lease of the attempt that finished it recorded that end."""
    lives = [0]
    for event in events:
        if event["event"] == Event.REQUEUED:
            lives.append(0)
        elif _is_terminal(event):
            lives[-1] += 1
    expected = [1] * (len(lives) - 1) + [1 if job["status"] in TERMINAL else 0]
    problems = []
    if lives != expected:
        problems.append(f"terminal events per life {lives}, expected {expected}")
    problems += _lease_outcome_problems(job, leases)
    return problems


@functools.cache
def _outcomes_into(status: str) -> frozenset[str]:
    """How an attempt's lease may end when its move takes the job to `status` (asked once per
    finished job: cached, as the moves never change)."""
    return frozenset(o.value for m in MOVES.values() if m.target == status for o in m.outcomes)


def _lease_outcome_problems(job: Mapping[str, Any],
                            leases: Sequence[Mapping[str, Any]]) -> list[str]:
    status = job["status"]
    won = [lease for lease in leases if lease["outcome"] == "succeeded"]
    problems = [f"{len(won)} leases recorded a success"] if len(won) > 1 else []
    if won and status != Status.SUCCEEDED:
        problems.append(f"lease {won[-1]['id']} recorded a success but the job is {status}")
    if status not in TERMINAL or not leases:
        return problems
    newest = leases[-1]
    if newest["released_at"] is None:
        problems.append(f"the job is {status} but lease {newest['id']} is still open")
    elif status in (Status.SUCCEEDED, Status.DEAD) and (
            newest["outcome"] not in _outcomes_into(status)):
        problems.append(f"the job is {status} but its last lease {newest['id']} recorded "
                        f"{newest['outcome']}")
    if status == Status.SUCCEEDED and newest["attempt"] != job["attempts"]:
        problems.append(f"attempt {newest['attempt']} succeeded but the job is at attempt "
                        f"{job['attempts']}")
    return problems


# --- workflow steps ------------------------------------------------------------------------

def step_problems(events: Sequence[Mapping[str, Any]], parents: Sequence[str],
                  finishes: Mapping[str, Sequence[Mapping[str, Any]]],
                  when: str | None = None) -> list[str]:
    """A step is released once, only when its condition held (`when`, None for all_succeeded:
    every parent had succeeded; any_failed: some parent had ended dead or cancelled; always:
    every parent had finished), each no later than the release or in its very transaction
    (the order of one transaction's rows says nothing), and claimed only after its release;
    an any_failed step cancelled as condition_unmet was so only once every parent succeeded,
    and never released."""
    ends = {p: [(e, _end(e)) for e in finishes.get(p, ())] for p in parents}
    releases = [e for e in events if e["event"] == Event.UNBLOCKED]
    claims = [e for e in events if e["event"] == Event.CLAIMED]
    problems = _unmet_problems(events, ends, bool(releases))
    if len(releases) > 1:
        return [*problems, f"released {len(releases)} times"]
    if not releases:
        return problems + ([f"claimed {len(claims)} times without a release"] if claims else [])
    release = releases[0]
    problems += _release_problems(release, ends, when)
    problems += [f"claimed at {c['created_at']} before its release at {release['created_at']}"
                 for c in claims if not _no_later(release, c)]
    return problems


_FAILED_ENDS = frozenset({Status.DEAD.value, Status.CANCELLED.value})


def _end(event: Mapping[str, Any]) -> str | None:
    """The state a parent's event ended it in (succeeded, dead, cancelled), else None."""
    after = status_after(str(event["event"]), event.get("recorded"))
    return after if after in TERMINAL else None


def _release_problems(release: Mapping[str, Any],
                      ends: Mapping[str, list[tuple[Mapping[str, Any], str | None]]],
                      when: str | None) -> list[str]:
    def by_release(p: str, wanted: Iterable[str]) -> bool:
        return any(end in wanted and _no_later(e, release) for e, end in ends[p])

    at = release["created_at"]
    if when == "any_failed":
        if any(by_release(p, _FAILED_ENDS) for p in ends):
            return []
        return [f"released at {at} (any_failed) before any parent ended dead or cancelled"]
    wanted = TERMINAL if when == "always" else {Status.SUCCEEDED.value}
    verb = "finished" if when == "always" else "succeeded"
    return [f"released at {at} before parent {p} {verb}"
            for p in sorted(ends) if not by_release(p, wanted)]


def _unmet_problems(events: Sequence[Mapping[str, Any]],
                    ends: Mapping[str, list[tuple[Mapping[str, Any], str | None]]],
                    released: bool) -> list[str]:
    unmet = [e for e in events if e["event"] == Event.CANCELLED
             and e.get("cause") == "condition_unmet"]
    if not unmet:
        return []
    if released:
        return ["both released and cancelled as condition_unmet"]
    at = unmet[0]
    return [f"cancelled as condition_unmet at {at['created_at']} before parent {p} succeeded"
            for p in sorted(ends)
            if not any(end == Status.SUCCEEDED.value and _no_later(e, at) for e, end in ends[p])]


def _no_later(first: Mapping[str, Any], then: Mapping[str, Any]) -> bool:
    return first["created_at"] <= then["created_at"] or (
        first.get("xid") is not None and first.get("xid") == then.get("xid"))


def page_violations(page: Page, clean: set[Hashable] | None = None) -> list[Violation]:
    """Every rule about the jobs of one page. With `clean`, a job whose shape is in it is not
    judged again by the rules about one job (they would read the same and find nothing), and
    the shape of each job they find nothing wrong with is added (up to CLEAN_SHAPES)."""
    found: list[Violation] = []
    for job in page.jobs:
        job_id = str(job["id"])
        events = page.events.get(job_id, [])
        if job_id in page.parents:
            found += [Violation("step_before_parents", job_id, m) for m in step_problems(
                events, page.parents[job_id], page.finishes, job.get("run_when"))]
        shape = job.get("shape")
        if clean is not None and shape is not None and shape in clean:
            continue
        mine = job_violations(job, events, page.leases.get(job_id, []))
        found += mine
        if clean is not None and shape is not None and not mine and len(clean) < CLEAN_SHAPES:
            clean.add(shape)
    return found


# --- flow limits ---------------------------------------------------------------------------

def settings_over_time(changes: Iterable[Mapping[str, Any]],
                       current: Iterable[Mapping[str, Any]]) -> list[Setting]:
    """The settings each scope had and when, from the audit trail's `limit.set` and
    `limit.delete` records (oldest first) and the limits in force now (each from its
    `updated_at`, which covers a limit whose records retention has deleted)."""
    steps: dict[str, list[tuple[datetime, Mapping[str, Any] | None]]] = defaultdict(list)
    for change in changes:
        detail = change.get("detail") or {}
        scope = str(change.get("target") or detail.get("scope"))
        steps[scope].append((change["at"], _limit_values(detail)
                             if change["action"] == "limit.set" else None))
    for timeline in steps.values():
        timeline.sort(key=lambda step: step[0])
    for row in current:
        timeline = steps[row["scope"]]
        if not timeline or _values(timeline[-1][1]) != _values(row):
            timeline.append((row["updated_at"], row))  # set where the trail does not say
    out = []
    for scope, timeline in steps.items():
        timeline.sort(key=lambda step: step[0])
        ends: list[datetime | None] = [at for at, _ in timeline[1:]] + [None]
        out += [Setting(scope, v["concurrency"], v["rate_limit"], v["period_s"],
                        bool(v["per_key"]), at, end)
                for (at, v), end in zip(timeline, ends, strict=True) if v is not None]
    return out


def _values(setting: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    if setting is None:
        return None
    return tuple(setting[k] for k in ("concurrency", "rate_limit", "period_s", "per_key"))


def _limit_values(detail: Mapping[str, Any]) -> dict[str, Any]:
    rate = detail.get("rate") or {}
    return {"concurrency": detail.get("concurrency"), "rate_limit": rate.get("limit"),
            "period_s": rate.get("period_s"), "per_key": detail.get("per_key", False)}


def flow_violations(setting: Setting, leases: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """Every start the setting should have refused: one that found `concurrency` leases of its
    budget already open, or the `rate_limit`-th + 1 start within `period_s`. Only starts while
    the setting was in force are judged (a lowered limit does not stop what already runs)."""
    budgets: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for lease in leases:
        budgets[lease["limit_key"] if setting.per_key else ""].append(lease)
    found = []
    for key, mine in budgets.items():
        name = setting.scope + (f" key {key!r}" if setting.per_key else "")
        if setting.concurrency is not None:
            found += [Violation("flow_limit", str(lease["job_id"]),
                                f"{name}: started as lease {n} of {setting.concurrency}")
                      for lease, n in crowded_starts(mine, setting)]
        if setting.rate_limit is not None and setting.period_s:
            found += [Violation("flow_limit", str(lease["job_id"]),
                                f"{name}: start {n} within {setting.period_s:g} s "
                                f"(rate {setting.rate_limit})")
                      for lease, n in hasty_starts(mine, setting)]
    return found


def _in_force(setting: Setting, at: datetime) -> bool:
    return at >= setting.start and (setting.end is None or at < setting.end)


def crowded_starts(leases: Sequence[Mapping[str, Any]],
                   setting: Setting) -> list[tuple[Mapping[str, Any], int]]:
    """(lease, leases open counting it) for each start in force beyond the concurrency; a lease
    is open from leased_at until released_at, and one released as another starts is not."""
    edges = []
    for lease in leases:
        edges.append((lease["leased_at"], 1, lease))
        if lease["released_at"] is not None:
            edges.append((lease["released_at"], -1, lease))
    edges.sort(key=lambda edge: (edge[0], edge[1]))
    found, open_now = [], 0
    for at, step, lease in edges:
        open_now += step
        if step > 0 and open_now > (setting.concurrency or 0) and _in_force(setting, at):
            found.append((lease, open_now))
    return found


def hasty_starts(leases: Sequence[Mapping[str, Any]],
                 setting: Setting) -> list[tuple[Mapping[str, Any], int]]:
    """(lease, starts in its window) for each start in force that was more than `rate_limit`
    inside a half-open window (t - period_s, t] of starts also in force."""
    starts = sorted((lease for lease in leases if _in_force(setting, lease["leased_at"])),
                    key=lambda lease: lease["leased_at"])
    found, first = [], 0
    for last, lease in enumerate(starts):
        while (lease["leased_at"] - starts[first]["leased_at"]).total_seconds() >= (
                setting.period_s or 0):
            first += 1
        if last - first + 1 > (setting.rate_limit or 0):
            found.append((lease, last - first + 1))
    return found


# --- ordering keys -------------------------------------------------------------------------

def ordering_overlaps(leases: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """Each lease of a key's jobs (`job_id` on each) begins only once every earlier one of the
    key was released; a lease released as the next begins does not overlap it."""
    found = []
    held: Mapping[str, Any] | None = None  # of the leases so far, the one released last
    for lease in sorted(leases, key=lambda x: (x["leased_at"], x["id"])):
        if held is not None and (held["released_at"] is None
                                 or lease["leased_at"] < held["released_at"]):
            found.append(Violation("ordering_overlap", str(lease["job_id"]), (
                f"lease {lease['id']} began at {lease['leased_at']} while job {held['job_id']} "
                f"of its ordering key held lease {held['id']} (released {held['released_at']})")))
        if held is None or (held["released_at"] is not None and (
                lease["released_at"] is None or lease["released_at"] > held["released_at"])):
            held = lease
    return found


def _keyed_leases(page: Page, into: dict[tuple[str, str], list[Mapping[str, Any]]]) -> None:
    for job in page.jobs:
        if job.get("ordering_key") is not None:
            into[(job["queue"], job["ordering_key"])] += page.leases.get(str(job["id"]), [])


# --- the whole history ---------------------------------------------------------------------

def verify(reader: Reader, since: datetime | None = None, page_size: int = PAGE_JOBS,
           stats: dict[str, int] | None = None) -> Iterator[Violation]:
    """Every violation in the history of jobs created since `since` (all when None), page by
    page, then of every flow limit setting in force since then; `stats` counts what was
    judged (`jobs`, `limit_settings`)."""
    stats = {} if stats is None else stats
    stats.update(jobs=0, limit_settings=0)
    keyed: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    clean: set[Hashable] = set()  # shapes judged clean, whose jobs' rows need no reading
    for page in reader.pages(since, page_size, clean):
        stats["jobs"] += len(page.jobs)
        yield from page_violations(page, clean)
        _keyed_leases(page, keyed)
    for leases in keyed.values():
        yield from ordering_overlaps(leases)
    for setting in reader.limit_settings(since):
        stats["limit_settings"] += 1
        yield from flow_violations(setting, list(reader.scope_leases(setting)))
