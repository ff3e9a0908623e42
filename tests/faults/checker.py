"""The offline checker: reads a scenario's history, PostgreSQL and Redis after healing, and judges.

Invariant: it decides from recorded facts only (the client's history, the append-only
`job_events`, the `job_leases` audit, the handlers' `fault_exec_log` and `fault_effects`, the
Redis keys, the services' JSON logs), never from what the test believes happened. Every job the
API acknowledged (2xx) is classified as exactly one of:
- ok: terminal in an expected state, with one committed effect if it succeeded, first try;
- recovered: the same, but it needed more than one execution or a repair;
- lost: absent, or still not terminal after the bounded wait;
- duplicated: two or more committed effects;
- unexpected: terminal, but in a state or with effects the scenario did not allow.
Then every job in the database must satisfy: its history is a sequence of legal transitions
(the checker's own model, `LEGAL`) ending in its current state; one terminal event per life
(a dead job's requeue starts a new life); only the newest attempt completes; a snooze consumes
no attempt (the lease after a `snoozed` one runs the same attempt number); no lease begins
after the job's `expires_at`; no two leases
overlap (each starts after the previous one was released); two executions overlap only after
the earlier one's lease had ended (expired, or released with an outcome such as a timeout);
each lost lease was recovered once; the DLQ (status dead, dead_letter_jobs, the DLQ list)
holds exactly the jobs that exhausted their attempts or failed permanently; Redis converges to
PostgreSQL; every API answer was JSON and the only 5xx was 503 with Retry-After. For every flow
limit in `flow_limits` (scope `type:<t>` or `queue:<q>`, per `limit_key` when `per_key`), judged
from `job_leases` alone: at no instant were more leases of the scope open (from `leased_at`
until `released_at`) than its `concurrency`, and no sliding window of `period_s` holds more
`leased_at` than its `rate_limit`. For every queue and `ordering_key`, from `job_leases` alone:
at no instant was more than one lease of the key's jobs open, and the key's jobs began (first
lease) in enqueue order (`created_at`, id), a job requeued from the DLQ aside (it takes a new
place). Last, the product's own audit (`taskline audit verify`,
taskline.audit_verify, which judges the lifecycle by the product's table) must find nothing
either: a false alarm of the audit fails a scenario as a real violation does.

Retention deletes finished jobs, so an acknowledged job may be absent. It counts as `expired`
(an ok outcome) only when maintenance's log records its deletion (`action: expired`, with the
state the deleted row held) in a state `LEGAL` lets expire and the scenario allows, no sooner
than that state's retention after it finished. Whatever the logs say, no job may be half gone:
an id with a DLQ row but no job row is a violation, and so is one with events or leases but no
job row unless its deletion was recorded (a deleted job's history stays, read by nothing,
until its partition expires: migration 0021); Redis must hold no id of an absent job.

Waiting reads (`GET /api/v1/jobs/{id}?wait_s=`, `wait_violations`): one that answered a
finished state answered the job's committed end (the state it is in, or dead before a requeue).
And the commit that finishes a job wakes its waiters (`wake_violations`): a waiting read sent
before the job's finish and answered with it came back within WAKE_SLACK_S of that finish, not
at the end of its `wait_s` (a finish nobody signalled is only seen at the next look).

Schedules: each schedule slot enqueues at most one job (`slot_violations`, its own model: a
slot is a (schedule, instant) pair, and it maps to at most one job). Judged from the jobs'
`schedule` / `scheduled_for`, the `schedule_slots` record and maintenance's `schedule_fired`
log records: no two jobs for one slot, every slot's job carries that slot, every job of a
slot is the one its record names, and no two log records claim to have fired one slot.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import psycopg
from psycopg.rows import dict_row

from taskline.audit_verify import verify
from taskline.dispatch.keys import QUEUES_SET, QueueKeys, split_partition
from taskline.store.history import HistoryReader
from taskline.store.store import make_engine
from tests.faults.cluster import Cluster
from tests.faults.history import History
from tests.faults.uniquecheck import debounce_violations, unique_violations
from tests.faults.workflowcheck import workflow_violations

TERMINAL = frozenset({"succeeded", "dead", "cancelled"})
TERMINAL_EVENTS = frozenset({"succeeded", "dead_lettered", "cancelled", "lapsed"})
REPAIR_EVENTS = frozenset({"recovered", "released", "requeued"})
EFFECT_TYPES = frozenset({"fault.work", "fault.work_async", "fault.crash_before_commit",
                          "fault.crash_before_commit_async"})
DEFAULT_EXPECT: Mapping[str, frozenset[str]] = {
    "fault.kill_worker": frozenset({"dead"}), "fault.hang": frozenset({"dead"}),
    "fault.hang_async": frozenset({"dead"})}
SUCCEEDED = frozenset({"succeeded"})
STALE_ACTIONS = frozenset({"stale_outcome", "self_fence", "outcome_given_up"})
CLASSES = ("ok", "recovered", "expired", "lost", "duplicated", "unexpected")
OK_CLASSES = frozenset({"ok", "recovered", "expired"})
EXPIRED_ACTION = "expired"
FIRED_ACTION = "schedule_fired"
CLOCK_SLACK_S = 1.0
"""How far the deleting process's log clock may trail PostgreSQL's, judging early deletions."""
_PENDING = ("queued", "scheduled", "retrying")
ACKING_OPS = frozenset({"enqueue", "workflow"})
"""Requests whose 2xx answer acknowledges jobs: enqueues, and workflows (all their steps)."""
LEGAL: Mapping[tuple[str | None, str], frozenset[str]] = {
    (None, "enqueued"): frozenset({"queued"}),
    (None, "scheduled"): frozenset({"scheduled"}),
    ("scheduled", "promoted"): frozenset({"queued"}),
    ("retrying", "promoted"): frozenset({"queued"}),
    ("queued", "claimed"): frozenset({"running"}),
    ("running", "succeeded"): frozenset({"succeeded"}),
    ("running", "retry_scheduled"): frozenset({"retrying"}),
    ("running", "dead_lettered"): frozenset({"dead"}),
    ("running", "recovered"): frozenset({"queued", "dead"}),
    ("running", "released"): frozenset({"queued"}),
    ("running", "snoozed"): frozenset({"scheduled"}),
    ("running", "cancelled"): frozenset({"cancelled"}),
    ("running", "cancel_requested"): frozenset({"running"}),
    ("running", "progress"): frozenset({"running"}),
    **{(state, "cancelled"): frozenset({"cancelled"}) for state in _PENDING},
    **{(state, "lapsed"): frozenset({"cancelled"}) for state in _PENDING},
    (None, "waiting"): frozenset({"waiting"}),
    ("waiting", "unblocked"): frozenset({"queued"}),
    ("waiting", "cancelled"): frozenset({"cancelled"}),
    ("dead", "requeued"): frozenset({"queued"}),
    **{(state, "expired"): frozenset({"deleted"}) for state in TERMINAL},
    ("dead", "purged"): frozenset({"deleted"}),
    ("scheduled", "joined"): frozenset({"scheduled"}),
    ("scheduled", "replaced"): frozenset({"scheduled"}),
    ("queued", "replaced"): frozenset({"queued"}),
}
"""The checker's own model of the job lifecycle, written from the contract and not read from
taskline.transitions, so a wrong product table is caught rather than shared: (state before,
event) -> the states allowed after it; `recovered` ends in the state its row records;
`expired` (retention) leaves no row: `deleted` is where a finished job goes last; `purged`
(an operator's bulk purge of the DLQ) takes only a dead job there; `joined` (a debounce
arrival) and `replaced` (a unique enqueue's replace) change a job that has not started and
leave its state as it was."""
CONVERGE_S = 20.0
"""Reconciliation ignores jobs changed in the last 5 s and runs every 2 s here: 20 s is ample."""


@dataclass
class CheckResult:
    """Counts and violations of one scenario run; `row()` is its line in the final table."""

    scenario: str
    runs: int
    faults: int
    acknowledged: int
    classes: dict[str, str] = field(default_factory=dict)
    stale: int = 0
    recover_s: float | None = None
    violations: list[str] = field(default_factory=list)

    def count(self, cls: str) -> int:
        return sum(1 for c in self.classes.values() if c == cls)

    def row(self) -> dict[str, Any]:
        counts = {c: self.count(c) for c in CLASSES}
        return {"scenario": self.scenario, "runs": self.runs, "faults": self.faults,
                "acknowledged": self.acknowledged, **counts,
                "ok": counts["ok"] + counts["recovered"] + counts["expired"],
                "ok_first_try": counts["ok"],
                "stale_rejected": self.stale, "recover_s": self.recover_s,
                "violations": len(self.violations)}


@dataclass
class Snapshot:
    """What PostgreSQL holds about every job, grouped by job id."""

    jobs: dict[str, dict]
    events: dict[str, list[dict]]
    leases: dict[str, list[dict]]
    execs: dict[str, list[dict]]
    effects: dict[str, list[dict]]
    dead_letters: dict[str, dict]
    limits: list[dict] = field(default_factory=list)
    """The flow limits in force (the scenario sets them before its load)."""
    expired: dict[str, dict] = field(default_factory=dict)
    """Job id -> maintenance's log record of its deletion by retention."""


def _grouped(rows: Iterable[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        out[str(row["job_id"])].append(row)
    return out


class Checker:
    """Judges one scenario; `check()` waits (bounded) for terminal states, then reads all."""

    def __init__(self, cluster: Cluster, history: History, scenario: str, *, runs: int = 1,
                 expect: Mapping[str, Iterable[str]] | None = None, wait_s: float = 60.0,
                 converge_s: float = CONVERGE_S, redis_gone: bool = False) -> None:
        self.cluster = cluster
        self.history = history
        self.scenario = scenario
        self.runs = runs
        self.expect = {k: frozenset(v) for k, v in (expect or {}).items()}
        self.wait_s = wait_s
        self.converge_s = converge_s
        self.redis_gone = redis_gone
        """Redis stays down for good: every job must end all the same (dispatch from
        PostgreSQL), and there is no Redis to compare with PostgreSQL."""
        self.url = cluster.settings.database_url

    def check(self) -> CheckResult:
        requests = self.history.entries("request")
        acked = acknowledged(requests)
        self.wait_terminal(acked)
        result = CheckResult(self.scenario, self.runs, len(self.history.entries("fault")),
                             len(acked))
        result.violations += api_violations(requests)
        snap = self.snapshot()
        snap.expired = expiry_records(self.cluster.log_events(("maintenance",)))
        for job_id in acked:
            result.classes[job_id] = self.classify(job_id, snap)
        result.violations += [f"job {j}: {c}" for j, c in result.classes.items()
                              if c not in OK_CLASSES]
        for job_id in snap.jobs:
            result.violations += [f"job {job_id}: {v}" for v in job_violations(job_id, snap)]
        result.violations += dlq_violations(snap)
        result.violations += wait_violations(requests, snap)
        result.violations += wake_violations(requests, snap)
        result.violations += flow_violations(snap)
        result.violations += ordering_violations(snap)
        result.violations += retention_violations(snap, self.cluster.settings.retention_s)
        result.violations += workflow_violations(self._query, snap)
        result.violations += unique_violations(self._query)
        result.violations += debounce_violations(self._query, self.history.entries("debounce"))
        result.violations += self.schedule_violations()
        result.violations += self.audit_violations()
        if not self.redis_gone:
            result.violations += self.redis_violations()
        result.stale = stale_rejections(self.cluster.log_events(("worker",)))
        result.recover_s = self.recovery(acked, snap)
        return result

    # --- waiting and reading -------------------------------------------------------------

    def _query(self, sql: str, params: tuple = ()) -> list[dict]:
        """`sql`, written against the default schema's tables (`taskline.jobs`), run against
        the cluster's own TASKLINE_SCHEMA."""
        sql = self.cluster.in_schema(sql)
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            return conn.execute(sql, params).fetchall()

    def wait_terminal(self, acked: Mapping[str, float]) -> None:
        """Until every acknowledged job that exists is terminal, or `wait_s` passed."""
        ids = list(acked)
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            rows = self._query("SELECT count(*) AS n FROM taskline.jobs WHERE id = ANY(%s::uuid[]) "
                               "AND status NOT IN ('succeeded', 'dead', 'cancelled')", (ids,))
            if rows[0]["n"] == 0:
                return
            time.sleep(0.2)

    def snapshot(self) -> Snapshot:
        jobs = {str(r["id"]): r for r in self._query(
            "SELECT id, type, queue, status, attempts, max_retries, updated_at, limit_key, "
            "run_when, ordering_key, created_at, expires_at, finished_at FROM taskline.jobs")}
        return Snapshot(
            jobs=jobs,
            events=_grouped(self._query(
                "SELECT job_id, id, attempt, event, detail, created_at FROM taskline.job_events "
                "ORDER BY id")),
            leases=_grouped(self._query(
                "SELECT job_id, id, attempt, worker_id, leased_at, leased_until, released_at, "
                "outcome FROM taskline.job_leases ORDER BY id")),
            execs=_grouped(self._query(
                "SELECT job_id, id, attempt, worker_id, pid, started_at, ended_at "
                "FROM fault_exec_log ORDER BY id")),
            effects=_grouped(self._query(
                "SELECT job_id, attempt, worker_id FROM fault_effects ORDER BY id")),
            dead_letters={str(r["job_id"]): r for r in self._query(
                "SELECT job_id, attempts FROM taskline.dead_letter_jobs")},
            limits=self._query("SELECT scope, concurrency, rate_limit, period_s, per_key "
                               "FROM taskline.flow_limits"),
        )

    # --- classification ------------------------------------------------------------------

    def allowed(self, job: Mapping[str, Any]) -> frozenset[str]:
        job_id = str(job["id"])
        if job_id in self.expect:
            return self.expect[job_id]
        return self.expect.get(job["type"], DEFAULT_EXPECT.get(job["type"], SUCCEEDED))

    def classify(self, job_id: str, snap: Snapshot) -> str:
        job = snap.jobs.get(job_id)
        if job is None:
            return self.classify_deleted(job_id, snap)
        if job["status"] not in TERMINAL:
            return "lost"
        effects = len(snap.effects.get(job_id, []))
        if effects > 1:
            return "duplicated"
        wants_effect = job["type"] in EFFECT_TYPES and job["status"] == "succeeded"
        if job["status"] not in self.allowed(job) or (
                job["type"] in EFFECT_TYPES and effects != int(wants_effect)):
            return "unexpected"
        repaired = any(e["event"] in REPAIR_EVENTS for e in snap.events.get(job_id, []))
        if repaired or job["attempts"] > 1 or len(snap.execs.get(job_id, [])) > 1:
            return "recovered"
        return "ok"

    def classify_deleted(self, job_id: str, snap: Snapshot) -> str:
        """An absent job: expired when retention recorded deleting it in an allowed end state
        (whether that deletion was legal is `retention_violations`' concern), else lost."""
        record = snap.expired.get(job_id)
        if record is None:
            return "lost"
        if len(snap.effects.get(job_id, [])) > 1:
            return "duplicated"
        if record.get("status") not in self.allowed({"id": job_id, "type": record.get("type")}):
            return "unexpected"
        return "expired"

    # --- schedules -----------------------------------------------------------------------

    def schedule_violations(self) -> list[str]:
        """At most one job per schedule slot (see `slot_violations`)."""
        jobs = self._query("SELECT id, schedule, scheduled_for FROM taskline.jobs "
                           "WHERE schedule IS NOT NULL")
        slots = self._query("SELECT schedule, slot, job_id FROM taskline.schedule_slots")
        fired = [r for r in self.cluster.log_events(("maintenance",))
                 if r.get("action") == FIRED_ACTION]
        return slot_violations(jobs, slots, fired)

    # --- the product's own audit --------------------------------------------------------

    def audit_violations(self) -> list[str]:
        """`taskline audit verify` over this history (taskline.audit_verify, the product's
        rules, the lifecycle by its own table): it must find nothing where the checker, with
        its own model, finds nothing; a false alarm of the audit is a violation too."""
        engine = make_engine(self.url, pool_size=1, max_overflow=0)
        try:
            reader = HistoryReader(engine, self.cluster.settings.schema)
            return [f"audit: {v.line()}" for v in verify(reader)][:50]
        finally:
            engine.dispose()

    # --- Redis ---------------------------------------------------------------------------

    def redis_violations(self) -> list[str]:
        """Poll until Redis matches PostgreSQL (reconciliation runs meanwhile), else report."""
        deadline = time.monotonic() + self.converge_s
        while True:
            problems = redis_drift(self.cluster, {str(r["id"]): r for r in self._query(
                "SELECT id, queue, status FROM taskline.jobs")})
            if not problems or time.monotonic() > deadline:
                return [f"redis: {p}" for p in problems[:50]]
            time.sleep(0.5)

    # --- time to recover -----------------------------------------------------------------

    def recovery(self, acked: Mapping[str, float], snap: Snapshot) -> float | None:
        """Seconds from the last nemesis action until the last job acknowledged before it was
        terminal (every acknowledged job when none was acknowledged before it)."""
        marks = [e["wall"] for e in self.history.entries() if e["kind"] in ("fault", "heal")]
        if not marks:
            return None
        healed = max(marks)
        before = [j for j, at in acked.items() if at <= healed] or list(acked)
        done = [snap.jobs[j]["updated_at"].timestamp() for j in before
                if j in snap.jobs and snap.jobs[j]["status"] in TERMINAL]
        if not done:
            return None
        return round(max(max(done) - healed, 0.0), 2)


# --- the history --------------------------------------------------------------------------

def acknowledged(requests: Iterable[dict]) -> dict[str, float]:
    """{job id: wall time of its first 2xx answer} over every enqueue request."""
    acked: dict[str, float] = {}
    for r in requests:
        if r["op"] in ACKING_OPS and r["status"] is not None and 200 <= r["status"] < 300:
            for job_id in r["job_ids"]:
                acked.setdefault(job_id, r["recv_wall"])
    return acked


def api_violations(requests: list[dict]) -> list[str]:
    """Every answer JSON; 5xx only as 503 with Retry-After; one key, one job."""
    problems = []
    for r in requests:
        where = f"{r['method']} {r['path']} -> {r['status']}"
        if r["status"] is not None and not r["json"]:
            problems.append(f"api: non-JSON answer: {where}")
        if r["status"] is not None and r["status"] >= 500 and not (
                r["status"] == 503 and r["retry_after"]):
            problems.append(f"api: {where} ({r.get('error_code')}); only 503 + Retry-After")
    by_key: dict[str, set[frozenset[str]]] = defaultdict(set)
    for r in requests:
        if r["key"] and r["status"] is not None and 200 <= r["status"] < 300:
            by_key[r["key"]].add(frozenset(r["job_ids"]))  # a workflow's key names its steps
    problems += [f"api: idempotency key {k} answered with jobs {sorted(map(sorted, v))}"
                 for k, v in by_key.items() if len(v) > 1]
    return problems


# --- per-job invariants -------------------------------------------------------------------

def job_violations(job_id: str, snap: Snapshot) -> list[str]:
    job = snap.jobs[job_id]
    leases = snap.leases.get(job_id, [])
    return (transition_violations(job, snap.events.get(job_id, []))
            + terminal_event_violations(job, snap.events.get(job_id, []))
            + completion_violations(job, leases, snap.effects.get(job_id, []))
            + lease_overlap_violations(leases)
            + recovery_violations(leases, snap.events.get(job_id, []))
            + snooze_violations(leases)
            + expiry_violations(job, leases)
            + execution_overlap_violations(snap.execs.get(job_id, []), leases))


def transition_violations(job: Mapping[str, Any], events: list[dict]) -> list[str]:
    """Replayed from nothing, every event is a legal move from the state the ones before it
    left, and the last leaves the job in the state PostgreSQL holds."""
    state: str | None = None
    for event in events:
        allowed = LEGAL.get((state, event["event"]))
        if allowed is None:
            return [f"illegal transition: {event['event']} (event {event['id']}) in state "
                    f"{state}"]
        after = (event["detail"] or {}).get("status") if len(allowed) > 1 else next(iter(allowed))
        if after not in allowed:
            return [f"event {event['id']} {event['event']} records state {after}, not one of "
                    f"{sorted(allowed)}"]
        state = after
    if state != job["status"]:
        return [f"history ends in state {state} but the job is {job['status']}"]
    return []


def _is_terminal_event(event: Mapping[str, Any]) -> bool:
    if event["event"] in TERMINAL_EVENTS:
        return True
    detail = event["detail"] or {}
    return event["event"] == "recovered" and detail.get("status") == "dead"


def terminal_event_violations(job: Mapping[str, Any], events: list[dict]) -> list[str]:
    """Each life (split at `requeued`) ends with one terminal event; the last one only if the
    job is terminal now."""
    lives: list[int] = [0]
    for event in events:
        if event["event"] == "requeued":
            lives.append(0)
        elif _is_terminal_event(event):
            lives[-1] += 1
    expected = [1] * (len(lives) - 1) + [1 if job["status"] in TERMINAL else 0]
    if lives != expected:
        return [f"terminal events per life {lives}, expected {expected} ({job['status']})"]
    return []


def completion_violations(job: Mapping[str, Any], leases: list[dict],
                          effects: list[dict]) -> list[str]:
    """At most one lease succeeds: the newest, of the current attempt; its effect matches it."""
    won = [lease for lease in leases if lease["outcome"] == "succeeded"]
    problems = []
    if len(won) > 1:
        problems.append(f"{len(won)} leases recorded a success")
    if won and (won[-1]["id"] != leases[-1]["id"] or won[-1]["attempt"] != job["attempts"]):
        problems.append(f"attempt {won[-1]['attempt']} completed but the newest attempt is "
                        f"{job['attempts']}")
    if won and job["status"] != "succeeded":
        problems.append(f"a lease recorded a success but the job is {job['status']}")
    for effect in effects:
        if not any(w["attempt"] == effect["attempt"] and w["worker_id"] == effect["worker_id"]
                   for w in won):
            problems.append(f"effect of attempt {effect['attempt']} by {effect['worker_id']} "
                            "committed without that attempt's recorded success")
    return problems


def lease_overlap_violations(leases: list[dict]) -> list[str]:
    """Each lease starts only after the previous one was released."""
    problems = []
    for prev, nxt in pairwise(leases):
        if prev["released_at"] is None or nxt["leased_at"] < prev["released_at"]:
            problems.append(f"lease {nxt['id']} (attempt {nxt['attempt']}) began at "
                            f"{nxt['leased_at']} while lease {prev['id']} was held "
                            f"(released {prev['released_at']})")
    return problems


LEASE_AFTER_EXPIRY_SLACK_S = 0.5
"""How far a lease's `leased_at` may trail its job's expiry: the claim tests the expiry, then
stamps the lease a few statements' time later (both in PostgreSQL's clock)."""


def expiry_violations(job: Mapping[str, Any], leases: list[dict]) -> list[str]:
    """No lease after expiry: a job with `expires_at` is leased only before it."""
    expires = job.get("expires_at")
    if expires is None:
        return []
    return [f"lease {lease['id']} began at {lease['leased_at']}, after the job's expiry {expires}"
            for lease in leases
            if (lease["leased_at"] - expires).total_seconds() > LEASE_AFTER_EXPIRY_SLACK_S]


def snooze_violations(leases: list[dict]) -> list[str]:
    """A snooze never consumes an attempt: the lease after a `snoozed` one runs the same
    attempt number again."""
    return [f"lease {nxt['id']} ran attempt {nxt['attempt']} after lease {prev['id']} of attempt "
            f"{prev['attempt']} was snoozed"
            for prev, nxt in pairwise(leases)
            if prev["outcome"] == "snoozed" and nxt["attempt"] != prev["attempt"]]


def recovery_violations(leases: list[dict], events: list[dict]) -> list[str]:
    """Each lease the reaper closed as lost has exactly one `recovered` event: no instance of
    maintenance recovered an attempt twice."""
    lost = Counter(lease["attempt"] for lease in leases if lease["outcome"] == "lost")
    recovered = Counter(e["attempt"] for e in events if e["event"] == "recovered")
    if lost != recovered:
        return [f"lost leases by attempt {dict(lost)} but recovered events {dict(recovered)}"]
    return []


def _lease_of(execution: Mapping[str, Any], leases: list[dict]) -> dict | None:
    mine = [lease for lease in leases if lease["attempt"] == execution["attempt"]
            and lease["worker_id"] == execution["worker_id"]
            and lease["leased_at"] <= execution["started_at"]]
    return mine[-1] if mine else None


def _lease_end(lease: Mapping[str, Any]) -> Any:
    """When a lease stopped protecting its attempt: its expiry, or its release if earlier (an
    outcome was recorded, e.g. a timeout whose handler thread could only be abandoned)."""
    released = lease["released_at"]
    return lease["leased_until"] if released is None else min(released, lease["leased_until"])


def execution_overlap_violations(execs: list[dict], leases: list[dict]) -> list[str]:
    """Every execution ran under a lease; a later one may overlap an earlier one only after
    the earlier one's lease had ended (expired, or released with a recorded outcome)."""
    problems = []
    for i, first in enumerate(execs):
        lease = _lease_of(first, leases)
        if lease is None:
            problems.append(f"execution {first['id']} (attempt {first['attempt']}) had no lease")
            continue
        end = _lease_end(lease)
        for later in execs[i + 1:]:
            overlaps = first["ended_at"] is None or first["ended_at"] > later["started_at"]
            if overlaps and later["started_at"] < end:
                problems.append(f"execution {later['id']} started at {later['started_at']} "
                                f"while execution {first['id']} ran under a lease valid until "
                                f"{end}")
    return problems


# --- the DLQ ------------------------------------------------------------------------------

TERMINAL = frozenset({"succeeded", "dead", "cancelled"})


def finished_waits(requests: Iterable[dict]) -> Iterator[tuple[dict, str, str]]:
    """(entry, job id, state told) of each waiting read answered 200 with a finished state."""
    for entry in requests:
        told = entry.get("job_status")
        if entry.get("op") == "wait" and entry.get("status") == 200 and told in TERMINAL:
            yield entry, entry["path"].split("/")[-1].split("?")[0], told


def wait_violations(requests: Iterable[dict], snap: Snapshot) -> list[str]:
    """A waiting read (`wait_s`) told a finished state only when it is the job's committed
    end: the job is in that state now, or, told dead, was requeued from the DLQ since (a new
    life); the finish that woke it cannot have been rolled back."""
    found = []
    for _entry, job_id, told in finished_waits(requests):
        job = snap.jobs.get(job_id)
        if job is None:
            continue  # deleted by retention: judged by retention_violations
        requeued = any(e["event"] == "requeued" for e in snap.events.get(job_id, []))
        if job["status"] != told and not (told == "dead" and requeued):
            found.append(f"job {job_id}: a waiter was told {told}, the job is {job['status']}")
    return found


WAKE_SLACK_S = 3.0
"""How long after a job's finish its waiters may still be held: well under the workload's
`wait_s` (8 s), well over a wake-up's path (a notification, one read, the answer)."""


def wake_violations(requests: Iterable[dict], snap: Snapshot,
                    slack_s: float = WAKE_SLACK_S) -> list[str]:
    """A waiting read sent before its job's last finish (`finished_at`) and answered with that
    end was answered within `slack_s` of it: the finishing commit woke it."""
    found = []
    for entry, job_id, told in finished_waits(requests):
        job = snap.jobs.get(job_id)
        if job is None or job["status"] != told or job.get("finished_at") is None:
            continue
        finished = job["finished_at"].timestamp()
        late = entry["recv_wall"] - finished
        if entry["sent_wall"] < finished and late > slack_s:
            found.append(f"job {job_id}: a waiter was answered {late:.1f} s after the "
                         f"job's finish, which should have woken it")
    return found


def dlq_violations(snap: Snapshot) -> list[str]:
    """status dead == dead_letter_jobs, each with its attempts, each justified."""
    dead = {j for j, row in snap.jobs.items() if row["status"] == "dead"}
    problems = [f"dlq: job {j} is dead but not in dead_letter_jobs"
                for j in sorted(dead - set(snap.dead_letters))]
    problems += [f"dlq: job {j} in dead_letter_jobs but {snap.jobs[j]['status']}"
                 for j in sorted(set(snap.dead_letters) - dead) if j in snap.jobs]
    for job_id in sorted(dead & set(snap.dead_letters)):
        job = snap.jobs[job_id]
        if snap.dead_letters[job_id]["attempts"] != job["attempts"]:
            problems.append(f"dlq: job {job_id} recorded {snap.dead_letters[job_id]['attempts']}"
                            f" attempts, has {job['attempts']}")
        if not (job["attempts"] > job["max_retries"]
                or _failed_permanently(snap.events.get(job_id, []))):
            problems.append(f"dlq: job {job_id} dead after {job['attempts']} attempts of "
                            f"{job['max_retries'] + 1} without a permanent failure")
    return problems


def _failed_permanently(events: list[dict]) -> bool:
    last = [e for e in events if e["event"] == "dead_lettered"]
    return bool(last) and (last[-1]["detail"] or {}).get("reason") == "non-retryable error"


# --- retention ----------------------------------------------------------------------------

def flow_violations(snap: Snapshot) -> list[str]:
    """Every flow limit held at every instant and in every sliding window (see the module)."""
    problems = []
    for limit in snap.limits:
        for key, leases in _leases_by_budget(limit, snap).items():
            name = f"{limit['scope']}" + (f" key {key!r}" if limit["per_key"] else "")
            if limit["concurrency"] is not None:
                peak = peak_open(leases)
                if peak > limit["concurrency"]:
                    problems.append(f"limit {name}: {peak} leases open at once "
                                    f"(concurrency {limit['concurrency']})")
            if limit["rate_limit"] is not None:
                worst = busiest_window([lease["leased_at"] for lease in leases],
                                       float(limit["period_s"]))
                if worst > limit["rate_limit"]:
                    problems.append(f"limit {name}: {worst} starts within {limit['period_s']} s "
                                    f"(rate {limit['rate_limit']})")
    return problems


def ordering_violations(snap: Snapshot) -> list[str]:
    """Per queue and ordering key: one lease open at a time, and first starts in enqueue order
    (see the module)."""
    lines: dict[tuple[str, str], list[str]] = defaultdict(list)
    for job_id, job in snap.jobs.items():
        if job.get("ordering_key") is not None:
            lines[(job["queue"], job["ordering_key"])].append(job_id)
    problems = []
    for (queue, key), ids in lines.items():
        name = f"ordering key {key!r} of queue {queue}"
        peak = peak_open(lease for job_id in ids for lease in snap.leases.get(job_id, []))
        if peak > 1:
            problems.append(f"{name}: {peak} leases open at once")
        problems += [f"{name}: job {b} started before job {a}, enqueued earlier"
                     for a, b in pairwise(_first_started_in_line(ids, snap))
                     if snap.leases[b][0]["leased_at"] < snap.leases[a][0]["leased_at"]]
    return problems


def _first_started_in_line(ids: list[str], snap: Snapshot) -> list[str]:
    """The key's jobs that started and kept their first place (never requeued), in line order."""
    kept = [j for j in ids if snap.leases.get(j)
            and not any(e["event"] == "requeued" for e in snap.events.get(j, []))]
    return sorted(kept, key=lambda j: (snap.jobs[j]["created_at"], j))


def _leases_by_budget(limit: Mapping[str, Any], snap: Snapshot) -> dict[str, list[dict]]:
    kind, name = limit["scope"].split(":", 1)
    out: dict[str, list[dict]] = defaultdict(list)
    for job_id, job in snap.jobs.items():
        if job.get(kind) == name:
            key = (job.get("limit_key") or "") if limit["per_key"] else ""
            out[key] += snap.leases.get(job_id, [])
    return out


def peak_open(leases: Iterable[Mapping[str, Any]]) -> int:
    """The most leases open at one instant; a lease is open from leased_at until released_at
    (still open if never released), and one ending at the instant another starts is not."""
    edges = []
    for lease in leases:
        edges.append((lease["leased_at"], 1))
        if lease["released_at"] is not None:
            edges.append((lease["released_at"], -1))
    peak = open_now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        open_now += step
        peak = max(peak, open_now)
    return peak


def busiest_window(starts: Iterable[datetime], period_s: float) -> int:
    """The most starts inside any half-open window (t - period_s, t]."""
    times = sorted(starts)
    worst, first = 0, 0
    for last, at in enumerate(times):
        while (at - times[first]).total_seconds() >= period_s:
            first += 1
        worst = max(worst, last - first + 1)
    return worst


def expiry_records(records: Iterable[Mapping[str, Any]]) -> dict[str, dict]:
    """Job id -> the log record of its deletion by retention (maintenance's `expired`)."""
    return {str(r["job_id"]): dict(r) for r in records
            if r.get("action") == EXPIRED_ACTION and r.get("job_id")}


def retention_violations(snap: Snapshot, retention_s: Mapping[str, float]) -> list[str]:
    """Retention deleted only finished jobs, none before its retention, each whole; and no job
    is half gone, whoever deleted it (judged from the tables, whatever the logs say)."""
    problems = []
    for job_id, record in sorted(snap.expired.items()):
        status = record.get("status")
        if "deleted" not in LEGAL.get((status, "expired"), frozenset()):
            problems.append(f"retention: job {job_id} was deleted while {status}")
        if job_id in snap.jobs:
            problems.append(f"retention: job {job_id} was logged deleted but its row remains")
        early = _deleted_early(record, retention_s.get(str(status), 0.0))
        if early:
            problems.append(f"retention: job {job_id} ({status}) was deleted {early}")
    problems += [f"retention: job {j} is gone but left a DLQ row"
                 for j in sorted(set(snap.dead_letters) - set(snap.jobs))]
    # A deleted job's events and leases go with their partition (migration 0021): only
    # those of a job whose deletion nobody recorded are a half-gone job.
    for what, rows in {"events": snap.events, "leases": snap.leases}.items():
        problems += [f"retention: job {j} is gone without a recorded deletion but left {what}"
                     for j in sorted(set(rows) - set(snap.jobs) - set(snap.expired))]
    return problems


def _deleted_early(record: Mapping[str, Any], retain_s: float) -> str:
    """'' when the deletion came after the retention (or 0 = never), else what happened."""
    try:
        finished = datetime.fromisoformat(record["finished_at"])
        deleted = datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
    except (KeyError, TypeError, ValueError):
        return "without a recorded finish and deletion time"
    if retain_s <= 0:
        return "although its status is kept forever"
    kept_s = (deleted - finished).total_seconds()
    if kept_s + CLOCK_SLACK_S < retain_s:
        return f"{kept_s:.1f} s after it finished, before its retention of {retain_s:g} s"
    return ""


# --- schedule slots -----------------------------------------------------------------------

def _instant(value: Any) -> str:
    """A slot instant as one comparable text (UTC, seconds), from a datetime or ISO text."""
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def slot_violations(jobs: Iterable[Mapping[str, Any]], slots: Iterable[Mapping[str, Any]],
                    fired: Iterable[Mapping[str, Any]]) -> list[str]:
    """The checker's model of schedules: a slot (schedule, instant) has at most one job. From
    the jobs carrying a slot, the slot records, and the `schedule_fired` log records."""
    problems = []
    by_slot: dict[tuple[str, str], list[str]] = defaultdict(list)
    for job in jobs:
        by_slot[(job["schedule"], _instant(job["scheduled_for"]))].append(str(job["id"]))
    problems += [f"schedule {s} slot {t}: {len(ids)} jobs {sorted(ids)}"
                 for (s, t), ids in sorted(by_slot.items()) if len(ids) > 1]
    recorded = {(r["schedule"], _instant(r["slot"])): str(r["job_id"]) for r in slots}
    for (name, at), ids in sorted(by_slot.items()):
        owner = recorded.get((name, at))
        problems += [f"schedule {name} slot {at}: job {j} is not the slot's recorded job "
                     f"({owner})" for j in ids if j != owner]
    claims = Counter((r.get("schedule"), _instant(r.get("scheduled_for"))) for r in fired)
    problems += [f"schedule {s} slot {t}: {n} instances logged firing it"
                 for (s, t), n in sorted(claims.items()) if n > 1]
    problems += [f"schedule {s} slot {t}: logged fired but never recorded"
                 for (s, t) in sorted(claims) if (s, t) not in recorded]
    return problems


# --- Redis against PostgreSQL -------------------------------------------------------------

def redis_drift(cluster: Cluster, jobs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Where Redis disagrees with PostgreSQL about where each id should be (a queue's
    partitions taken together: TASKLINE_QUEUE_PARTITIONS)."""
    client = cluster.dispatcher.client
    partitions: dict[str, set[int]] = defaultdict(set)
    for name in client.smembers(QUEUES_SET):
        queue, partition = split_partition(name)
        partitions[queue].add(partition)
    for job in jobs.values():
        partitions[job["queue"]].add(0)
    problems: list[str] = []
    for queue, found in sorted(partitions.items()):
        lanes = [QueueKeys(queue, p)
                 for p in sorted(found | set(range(cluster.dispatcher.partitions)))]
        problems += _queue_drift(client, lanes, jobs)
    return problems


def _queue_drift(client: Any, lanes: Sequence[QueueKeys],
                 jobs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    keys = lanes[0]
    ready = Counter(i for lane in lanes for key in lane.ready_by_urgency
                    for i in client.lrange(key, 0, -1))
    processing = Counter(i for lane in lanes
                         for key in client.scan_iter(match=lane.processing_pattern)
                         for i in client.lrange(key, 0, -1))
    sets = {"retrying": {i for lane in lanes for i in client.zrange(lane.retry, 0, -1)},
            "scheduled": {i for lane in lanes for i in client.zrange(lane.scheduled, 0, -1)},
            "dead": Counter(i for lane in lanes for i in client.lrange(lane.dlq, 0, -1))}
    status = {j: row["status"] for j, row in jobs.items() if row["queue"] == keys.queue}
    problems = [f"{keys.queue}: queued job {j} is in no ready or processing list"
                for j, s in status.items() if s == "queued" and j not in ready | processing]
    problems += [f"{keys.queue}: {s} job {j} is missing from its set"
                 for j, s in status.items() if s in sets and j not in sets[s]]
    problems += [f"{keys.queue}: id {i} is {n} times in the DLQ" for i, n in sets["dead"].items()
                 if n > 1]
    problems += [f"{keys.queue}: garbage id {i} in ready lists (job {status.get(i, 'absent')})"
                 for i in ready if status.get(i) not in ("queued", "running")]
    problems += [f"{keys.queue}: garbage id {i} in a processing list (job "
                 f"{status.get(i, 'absent')})" for i in processing
                 if status.get(i) not in ("queued", "running")]
    for kind, members in sets.items():
        problems += [f"{keys.queue}: garbage id {i} in the {kind} set (job "
                     f"{status.get(i, 'absent')})" for i in members if status.get(i) != kind]
    return problems


# --- logs ---------------------------------------------------------------------------------

def stale_rejections(records: Iterable[Mapping[str, Any]]) -> int:
    """Attempts whose outcome was refused because their lease was no longer held: by
    PostgreSQL's fenced write (stale_outcome) or by the worker's own lease deadline
    (self_fence, outcome_given_up); each attempt counted once."""
    return len({(r.get("worker"), r.get("job_id"), r.get("attempt")) for r in records
                if r.get("action") in STALE_ACTIONS})
