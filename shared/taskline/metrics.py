"""Prometheus metrics shared by the three services; names kept from the system taskline grew from.

Label values come only from bounded sets: `type` is a registered handler type or "other", and
`queue` is a configured or known queue name capped in number, so a client inventing job types
or queues cannot create unbounded series. Queue-depth gauges are set by maintenance only, so
Prometheus never sums duplicates across workers, and maintenance's unlabelled series (live
workers, leader flag, reconciliation duration) exist only in maintenance: see `maintenance()`.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)

log = logging.getLogger(__name__)

OTHER = "other"
MAX_QUEUE_LABELS = 50

_LATENCY_BUCKETS = (0.001, 0.0022, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                    60, 120, 300, 600)

JOB_ENQUEUED = Counter("job_enqueued_total", "Jobs accepted", ["type", "queue"])
# Tags are not labels: any 1..100-character string is a tag, so a series per tag would be
# unbounded. This counts the jobs that carry tags per queue; a tag's own jobs are counted by
# GET /api/v1/jobs?tag= (the jobs_tags index).
JOB_TAGGED = Counter("taskline_jobs_tagged_total", "Jobs accepted with at least one tag",
                     ["queue"])
ENQUEUE_FOLDED = Counter(
    "taskline_enqueue_folded_total",
    "Enqueues that made no new job: a unique key's job returned (duplicate) or rewritten "
    "(replaced), or a debounce arrival joined a waiting job (joined)",
    ["type", "queue", "outcome"])
JOB_COMPLETED = Counter("job_completed_total", "Attempts that succeeded", ["type", "queue"])
JOB_FAILED = Counter("job_failed_total", "Attempts that failed (any reason)",
                     ["type", "queue", "reason"])
JOB_RETRIED = Counter("job_retried_total", "Failed attempts scheduled for a retry",
                      ["type", "queue"])
JOB_DLQ = Counter("job_dlq_total", "Jobs dead-lettered", ["type", "queue"])
JOBS_LAPSED = Counter("taskline_jobs_lapsed_total", "Jobs cancelled because they had not started "
                      "by their expires_at (event lapsed)", ["queue"])
JOB_SNOOZED = Counter("taskline_job_snoozed_total", "Attempts a handler ended with Snooze: "
                      "scheduled again, the attempt not counted", ["type", "queue"])
JOB_RECOVERED = Counter("job_recovered_total", "Jobs recovered by maintenance",
                        ["queue", "cause"])
JOB_CANCELLED = Counter("job_cancelled_total", "Jobs cancelled", ["queue"])
RECONCILE_MISSING = Counter("reconciliation_missing_jobs_total",
                            "Pending jobs missing from Redis and restored", ["queue", "kind"])
RECONCILE_CORRUPTED = Counter("reconciliation_corrupted_metadata_total",
                              "Redis entries removed or moved by reconciliation", ["queue", "kind"])
RECONCILE_STALE = Counter(
    "reconciliation_stale_ids_total",
    "Ready-list ids of jobs cancelled while pending, removed by reconciliation: expected "
    "leftovers (a cancel leaves them for the claim to refuse), not drift", ["queue"])
RECONCILE_MOVED = Counter(
    "reconciliation_partition_moved_total",
    "Ids reconciliation moved out of a queue's Redis partitions at or above "
    "TASKLINE_QUEUE_PARTITIONS (after N shrank) into their home partition", ["queue"])
PROMOTED = Counter("job_promoted_total", "Due retries and delayed jobs promoted", ["queue"])

# Workflows (taskline.workflows): steps released by their last parent's success (worker),
# workflows accepted (API), and steps waiting for parents (maintenance, from PostgreSQL).
STEPS_RELEASED = Counter("taskline_workflow_steps_released_total",
                         "Waiting workflow steps queued by the parent outcome that decided them")
STEPS_UNMET = Counter(
    "taskline_workflow_steps_condition_unmet_total",
    "any_failed workflow steps cancelled as condition_unmet: every parent succeeded")
STEPS_STARTED_IN_PLACE = Counter(
    "taskline_workflow_steps_started_in_place_total",
    "Released workflow steps claimed by their parent's own completion, on that worker")
WORKFLOWS_SUBMITTED = Counter("taskline_workflows_submitted_total", "Workflows accepted")
WAITING_DEPTH = Gauge("taskline_waiting_jobs", "Workflow steps waiting for their parents",
                      ["queue"], multiprocess_mode="livemax")

QUEUE_DEPTH = Gauge("job_queue_depth", "Ready jobs", ["queue", "priority"],
                    multiprocess_mode="livemax")
PROCESSING_DEPTH = Gauge("job_processing_queue_depth", "Ids in processing lists", ["queue"],
                         multiprocess_mode="livemax")
RETRY_DEPTH = Gauge("job_retry_queue_depth", "Jobs waiting for a retry", ["queue"],
                    multiprocess_mode="livemax")
SCHEDULED_DEPTH = Gauge("job_scheduled_queue_depth", "Delayed jobs not yet due", ["queue"],
                        multiprocess_mode="livemax")
DLQ_DEPTH = Gauge("job_dlq_depth", "Dead-lettered jobs", ["queue"], multiprocess_mode="livemax")
OLDEST_READY = Gauge("job_oldest_ready_age_seconds", "Age of the oldest queued job", ["queue"],
                     multiprocess_mode="livemax")
# Queue pause (maintenance only, from PostgreSQL's queue_pauses), and ids workers handed back
# because the claim found their queue paused.
QUEUE_PAUSED = Gauge("taskline_queue_paused", "1 while the queue is paused", ["queue"],
                     multiprocess_mode="livemax")
QUEUE_PAUSED_SINCE = Gauge("taskline_queue_paused_since_timestamp_seconds",
                           "When the queue was paused (Unix time)", ["queue"],
                           multiprocess_mode="livemax")
PAUSE_HELD = Counter("taskline_queue_pause_held_total",
                     "Fetched ids handed back to Redis because their queue is paused", ["queue"])
# Flow limits: jobs the budgeted claim started (workers), and per scope (maintenance only,
# from PostgreSQL) the limits, what they hold back and what uses their budget now.
HELD_CLAIMS = Counter("taskline_limit_claimed_total",
                      "Limited jobs started by the budgeted claim, within their budgets (jobs "
                      "with an ordering key it found waiting included)")
# A key's next job normally starts through its turn's push; the budgeted claim is the backstop
# (Redis lost, a job enqueued while its head's settle ran): the first growing, not the second,
# is health.
ORDERING_TURNS = Counter("taskline_ordering_turns_total",
                         "Ordering keys' turns passed by the move that finished their head "
                         "(settle, cancel, lapse): the next job pushed to Redis after the "
                         "commit, or started in place by the worker that finished the head")
# Ordering keys, per queue (maintenance only, from PostgreSQL): the keys with unfinished jobs,
# and their queued jobs, of which each key's head may start and the rest wait their turn.
ORDERING_KEYS = Gauge("taskline_ordering_keys", "Ordering keys with unfinished jobs",
                      ["queue"], multiprocess_mode="livemax")
ORDERING_QUEUED = Gauge("taskline_ordering_queued_jobs", "Queued jobs with an ordering key "
                        "(each key's head may start; the others wait their turn)", ["queue"],
                        multiprocess_mode="livemax")
LIMIT_HELD = Gauge("taskline_limit_held_jobs", "Queued jobs a flow limit applies to (held back "
                   "while its budget is used)", ["scope"], multiprocess_mode="livemax")
LIMIT_RUNNING = Gauge("taskline_limit_running", "Open leases of jobs a flow limit applies to",
                      ["scope"], multiprocess_mode="livemax")
LIMIT_STARTED = Gauge("taskline_limit_window_starts", "Starts inside a rate limit's window",
                      ["scope"], multiprocess_mode="livemax")
LIMIT_CONCURRENCY = Gauge("taskline_limit_concurrency", "A scope's concurrency limit",
                          ["scope"], multiprocess_mode="livemax")
LIMIT_RATE = Gauge("taskline_limit_rate", "A scope's rate limit (starts per period)",
                   ["scope"], multiprocess_mode="livemax")
# The audit of the recorded history (maintenance's leader, every TASKLINE_AUDIT_INTERVAL_S).
AUDIT_VIOLATIONS = Gauge("taskline_audit_violations",
                         "Violations of an invariant found by the newest audit pass",
                         ["rule"], multiprocess_mode="livemax")
# Retention (maintenance only; `status` is succeeded, cancelled or dead). The retention gauge
# carries the setting so an alert can compare the oldest age with it.
RETENTION_DELETED = Counter("taskline_retention_deleted_total",
                            "Finished jobs deleted by retention, with their history",
                            ["status"])
HISTORY_PARTITIONS_AHEAD = Gauge("taskline_history_partitions_ahead",
                                 "Partitions ready past the one being written", ["table"],
                                 multiprocess_mode="livemin")
HISTORY_PARTITIONS_EXPIRED = Counter("taskline_history_partitions_expired_total",
                                     "History partitions retention dropped (kept 0 rows) or "
                                     "replaced by a copy of their kept rows",
                                     ["table", "kind"])
RETENTION_OLDEST = Gauge("taskline_retention_oldest_finished_age_seconds",
                         "Age of the oldest finished job still kept (0: none)", ["status"],
                         multiprocess_mode="livemax")
RETENTION_SECONDS = Gauge("taskline_retention_seconds",
                          "How long finished jobs are kept, seconds (0: forever)", ["status"],
                          multiprocess_mode="livemax")
# The outbox relay (maintenance only): jobs enqueued inside application transactions whose ids
# it pushed to Redis after their commit.
OUTBOX_RELAYED = Counter("taskline_outbox_relayed_total",
                         "Jobs enqueued in application transactions, pushed to Redis by the relay",
                         ["queue"])
OUTBOX_PENDING = Gauge("taskline_outbox_pending_jobs",
                       "Committed in-transaction enqueues not yet relayed to Redis",
                       multiprocess_mode="livemax")
OUTBOX_OLDEST = Gauge("taskline_outbox_oldest_age_seconds",
                      "Age of the oldest committed in-transaction enqueue not relayed (0: none)",
                      multiprocess_mode="livemax")

# Schedules (maintenance's scheduler) and bulk dead-letter operations (the API).
SCHEDULE_FIRED = Counter("taskline_schedule_slots_fired_total",
                         "Schedule slots that enqueued their job", ["queue"])
SCHEDULE_FOLDED = Counter(
    "taskline_schedule_slots_folded_total",
    "Schedule slots that enqueued no job: a job still held the schedule job's unique key")
SCHEDULE_SKIPPED = Counter("taskline_schedule_slots_skipped_total",
                           "Schedule slots passed over (missed while no maintenance led, or "
                           "folded into a later slot by catch_up)", ["catch_up"])
SCHEDULE_LAG = Histogram("taskline_schedule_lag_seconds",
                         "From a slot's instant to the commit of its job",
                         buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 15.0, 60.0, 300.0))
DLQ_BULK = Counter("taskline_dlq_bulk_jobs_total",
                   "Dead jobs requeued or purged by the bulk DLQ operations", ["action"])

PROCESSING_TIME = Histogram("job_processing_time_seconds", "Handler run time",
                            ["type", "queue"], buckets=_LATENCY_BUCKETS)
WAIT_TIME = Histogram("job_wait_time_seconds", "Time from ready to claimed", ["type", "queue"],
                      buckets=_LATENCY_BUCKETS)
CLAIM_CONFLICTS = Counter("job_claim_conflicts_total",
                          "Fetched ids another worker or state change won", ["queue"])
LEASE_RENEWALS = Counter("job_lease_renewals_total", "Lease renewals", ["result"])
STALE_COMPLETIONS = Counter("job_stale_completions_total",
                            "Outcomes rejected by fencing (lease no longer held)", ["queue"])
BUSY_SLOTS = Gauge("taskline_worker_busy_slots", "Handler slots in use", ["worker"],
                   multiprocess_mode="livesum")
SLOTS = Gauge("taskline_worker_slots", "Handler slots", ["worker"], multiprocess_mode="livesum")
WORKER_CPUS = Gauge("taskline_worker_cpus",
                    "CPUs the worker process may run on (1 when TASKLINE_WORKER_CPUS=auto "
                    "pinned it)", ["worker"], multiprocess_mode="livesum")
PLACEMENT_CHANGES = Counter("taskline_worker_placement_changes_total",
                            "Changes of an auto worker process's CPUs: pinned to its CPU once "
                            "busy (pin), freed when idle or when its own threads keep a whole "
                            "CPU busy (free), moved off a crowded CPU (move)", ["change"])
CLAIMED_AHEAD = Gauge("taskline_worker_claimed_ahead",
                      "Jobs claimed and leased (status running) waiting for a handler thread",
                      ["worker"], multiprocess_mode="livesum")
EVENT_LOOP_LAG = Gauge("taskline_worker_event_loop_lag_seconds",
                       "How long an async def handler has been holding the worker's event loop "
                       "(0 when it runs freely or there is none)", ["worker"],
                       multiprocess_mode="livemax")
ABANDONED_HANDLERS = Gauge("taskline_worker_abandoned_handlers",
                           "Handlers past their timeout still running (threads, and coroutines "
                           "ignoring their cancellation); above the slots the worker recycles",
                           ["worker"], multiprocess_mode="livesum")
DISPATCH_DEGRADED = Gauge("taskline_dispatch_degraded",
                          "1 while the worker claims from PostgreSQL because Redis is unreachable",
                          ["worker"], multiprocess_mode="livesum")
DISPATCH_SWITCHES = Counter("taskline_dispatch_switches_total",
                            "Dispatch mode switches of workers, by the mode switched to", ["to"])
LOOP_ERRORS = Counter("taskline_loop_errors_total", "Failed iterations of a service loop",
                      ["loop"])

EVENT_STREAMS = Gauge("taskline_event_streams", "Open /api/v1/events streams",
                      multiprocess_mode="livesum")
EVENT_STREAM_DROPS = Counter("taskline_event_stream_drops_total",
                             "Event streams the API ended (slow client, shutdown)",
                             ["reason"])
HTTP_REQUESTS = Counter("taskline_http_requests_total", "API requests",
                        ["route", "method", "status"])
QUOTA_DECISIONS = Counter("taskline_quota_decisions_total",
                          "Enqueue requests checked against a client's quota",
                          ["client", "decision"])
QUOTA_JOBS = Counter("taskline_quota_jobs_total",
                     "Jobs of the enqueue requests checked against a client's quota",
                     ["client", "decision"])
PAYLOAD_REFUSED = Counter(
    "taskline_payload_refused_total",
    "Jobs the API refused for their declared type: reason `schema` (the payload fits no "
    "declared version; type is the declared type) or `undeclared` (TASKLINE_UNKNOWN_TYPES="
    "reject; type is 'other', a client's invention is no label)", ["type", "reason"])
HTTP_LATENCY = Histogram("taskline_http_request_duration_seconds", "API request latency",
                         ["route", "method", "status"], buckets=_LATENCY_BUCKETS)
# Requests held by `wait_s` until their job or workflow finishes (taskline_producer.http.waiting).
WAITING_REQUESTS = Gauge("taskline_api_waiting_requests", "Requests waiting (wait_s) for a job or "
                         "workflow to finish, holding no thread", multiprocess_mode="livesum")
WAITS_ENDED = Counter("taskline_api_waits_total", "Waiting requests answered, by what ended the "
                      "wait: signalled (the finish, or the listener reconnecting), timeout "
                      "(wait_s passed), stopping (the API process stops)", ["ended"])
WOKEN_ANSWERS = Counter("taskline_api_woken_answers_total", "Waiting requests answered once "
                        "signalled, by how: burst (written from one read of the jobs of every "
                        "waiter woken together), request (their request run again)", ["how"])


class MaintenanceMetrics:
    """The unlabelled series only maintenance exports, created by `maintenance()` on first use.

    An unlabelled metric is exported (as 0) by every process that creates it, and under
    gunicorn's multiprocess mode creating it writes a sample the API would serve; so these are
    not created at import, and a worker or the API never exports a live-worker count or a
    leader flag of 0 for Prometheus to mistake for maintenance's.
    """

    def __init__(self) -> None:
        self.live_workers = Gauge("taskline_live_workers", "Workers with a recent heartbeat",
                                  multiprocess_mode="livemax")
        self.leader = Gauge("taskline_maintenance_leader",
                            "1 while this maintenance instance is active",
                            multiprocess_mode="livemax")
        self.reconcile_duration = Histogram("reconciliation_duration_seconds",
                                            "Reconciliation pass duration",
                                            buckets=_LATENCY_BUCKETS)
        self.audit_deleted = Counter("taskline_audit_deleted_total",
                                     "Audit records deleted by retention")


@functools.cache
def maintenance() -> MaintenanceMetrics:
    """The maintenance-only metrics of this process, registered in the default registry."""
    return MaintenanceMetrics()


class LabelGuard:
    """Maps free-form values to a bounded label set: known values pass, others become 'other'."""

    def __init__(self, known: Iterable[str] = (), limit: int = MAX_QUEUE_LABELS) -> None:
        self._known = set(known)
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._known:
            return value
        with self._lock:
            if len(self._known) < self._limit:
                self._known.add(value)
                return value
        return OTHER


class TypeLabels:
    """Job types as labels: registered handler types only; anything else is 'other'."""

    def __init__(self, types: Iterable[str]) -> None:
        self._types = frozenset(types)

    def __call__(self, job_type: str) -> str:
        return job_type if job_type in self._types else OTHER


class CachedLabels:
    """A metric's label children, kept: prometheus-client's `labels()` validates its arguments
    and takes a lock on every call, a cost per job on the worker's hot path. The label sets
    used with it are bounded (TypeLabels, queue names) and never removed."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


Ready = Callable[[], tuple[int, dict[str, Any]]]
"""A readiness answer: (HTTP status, JSON body)."""


PORT_SEARCH = 100
"""How many ports past a taken default one a process started without `--metrics-port` tries."""


def serve(port: int, addr: str = "0.0.0.0", ready: Ready | None = None, *,
          fallback: bool = False) -> int | None:
    """Serve /metrics on `port` (0 turns it off), on a daemon thread; with `ready`, also
    /readyz, which answers what `ready()` returns. The port bound (None when off).

    With `fallback` (the port is the default, not one the operator chose), a taken port moves
    to the next free one, up to PORT_SEARCH ports on, so several processes share a host;
    without it a taken port is the OSError. Every other path is the scrape too, as with
    prometheus-client's own server, so health checks that ask any path keep working.
    """
    if not port:
        return None
    app = _app(make_wsgi_app(_registry()), ready)
    last = min(port + PORT_SEARCH, 65535) if fallback else port
    for candidate in range(port, last + 1):
        try:
            server = make_server(addr, candidate, app, _ThreadingServer,
                                 handler_class=_QuietHandler)
        except OSError as err:
            if err.errno != errno.EADDRINUSE or candidate == last:
                raise
            continue
        threading.Thread(target=server.serve_forever, name="taskline-metrics",
                         daemon=True).start()
        _log_port(port, candidate)
        return candidate
    raise AssertionError("unreachable: the last candidate returns or raises")


def _log_port(wanted: int, bound: int) -> None:
    if bound == wanted:
        log.info("serving /metrics on port %d", bound, extra={"action": "start", "port": bound})
    else:
        log.warning("metrics port %d is taken: serving /metrics on port %d", wanted, bound,
                    extra={"action": "start", "port": bound, "taken": wanted})


def _app(scrape: Callable[..., Any], ready: Ready | None) -> Callable[..., Any]:
    def app(request: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        # `request` is the WSGI environ: named otherwise so that the configuration-drift test
        # does not read its keys as environment variables.
        if ready is None or request.get("PATH_INFO") != "/readyz":
            return scrape(request, start_response)
        status, body = ready()
        data = json.dumps(body).encode()
        start_response(f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
                       [("Content-Type", "application/json"),
                        ("Content-Length", str(len(data)))])
        return [data]
    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request: a slow scrape never delays a probe."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line on stderr for every scrape and probe."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _registry() -> CollectorRegistry:
    from prometheus_client import REGISTRY
    return REGISTRY


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")
