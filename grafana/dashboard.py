"""The taskline Grafana dashboard, generated from code with grafana-foundation-sdk.

`make dashboard` (python grafana/dashboard.py) rewrites grafana/dashboards/taskline.json from
ROWS below; tests/unit/test_dashboard.py fails when the committed JSON differs from what this
produces, so the JSON is never edited by hand. Every query uses only metrics that
`taskline.metrics` defines or that Prometheus and the Redis/PostgreSQL exporters export, and
`panel_expressions()` lists every query so tests can check or evaluate them.

Queue-depth gauges are exported by maintenance only, possibly by several replicas, so they are
combined with `max by (...)`; counters and worker gauges come from every replica and are summed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dashboard_models

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "taskline.json"
DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="prometheus")
UID = "taskline"
HEIGHT = 8


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Chart:
    """One panel: a time series, or a stat showing the latest value."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    stat: bool = False
    width: int = 8
    # Values at which the panel turns orange then red; empty for none.
    thresholds: tuple[float, ...] = ()


def _quantiles(histogram: str, by: str, legend: str) -> tuple[Query, ...]:
    """p50/p95/p99 of a histogram, grouped by the labels in `by`."""
    return tuple(
        Query(f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket[5m])))",
              f"p{round(q * 100)} {legend}")
        for q in (0.5, 0.95, 0.99)
    )


READY_TOTAL = "sum(max by (queue, priority) (job_queue_depth))"

QUEUES = (
    Chart("Ready jobs by queue and priority",
          "Jobs waiting in Redis ready lists, per queue and priority (9 is most urgent).",
          (Query("max by (queue, priority) (job_queue_depth)", "{{queue}} p{{priority}}"),),
          width=12),
    Chart("Ready jobs", "All ready jobs, every queue and priority.", (Query(READY_TOTAL),),
          stat=True, width=4),
    Chart("Oldest ready job", "Age of the oldest ready job of any queue.",
          (Query("max(job_oldest_ready_age_seconds)"),), unit="s", stat=True, width=4,
          thresholds=(60, 300)),
    Chart("Dead-lettered jobs", "Jobs in the DLQ of every queue, waiting for a person.",
          (Query("sum(max by (queue) (job_dlq_depth))"),), stat=True, width=4,
          thresholds=(1, 100)),
    Chart("In processing", "Ids held in workers' processing lists (claimed, running).",
          (Query("max by (queue) (job_processing_queue_depth)", "{{queue}}"),)),
    Chart("Waiting for a retry", "Failed attempts whose backoff has not elapsed yet.",
          (Query("max by (queue) (job_retry_queue_depth)", "{{queue}}"),)),
    Chart("Scheduled (delayed)", "Jobs enqueued with delay_s or run_at, not yet due.",
          (Query("max by (queue) (job_scheduled_queue_depth)", "{{queue}}"),)),
    Chart("DLQ depth by queue", "Dead-lettered jobs per queue.",
          (Query("max by (queue) (job_dlq_depth)", "{{queue}}"),), width=12),
    Chart("Oldest ready job by queue", "How long the oldest ready job of each queue has waited; "
          "a rising line is a queue that is not draining (alert at 5m).",
          (Query("max by (queue) (job_oldest_ready_age_seconds)", "{{queue}}"),), unit="s",
          width=12, thresholds=(60, 300)),
    Chart("Workflow steps waiting", "Steps waiting in PostgreSQL for their parents to succeed "
          "(never in Redis); a flat line while nothing runs is a workflow whose parent is dead.",
          (Query("max by (queue) (taskline_waiting_jobs)", "{{queue}}"),), width=12),
    Chart("Paused queues", "1 while a queue is paused: its jobs wait, none starts (alert when "
          "paused with a backlog for 1h).",
          (Query("max by (queue) (taskline_queue_paused)", "{{queue}}"),), width=12),
    Chart("Flow limits: budget in use", "Open leases against each concurrency limit and "
          "starts in each rate window against its limit.",
          (Query("max by (scope) (taskline_limit_running)", "running {{scope}}"),
           Query("max by (scope) (taskline_limit_concurrency)", "concurrency {{scope}}"),
           Query("max by (scope) (taskline_limit_window_starts)", "started {{scope}}"),
           Query("max by (scope) (taskline_limit_rate)", "rate {{scope}}")), width=12),
    Chart("Flow limits: held jobs", "Queued jobs each limit holds back while its budget is "
          "used (alert when held at a full budget for 15m).",
          (Query("max by (scope) (taskline_limit_held_jobs)", "{{scope}}"),), width=12),
    Chart("Ids held back by a pause", "Fetched ids a worker handed back because the claim found "
          "their queue paused: a burst right after a pause, or after Redis lost a pause marker.",
          (Query("sum by (queue) (rate(taskline_queue_pause_held_total[5m]))", "{{queue}}"),),
          unit="ops", width=12),
    Chart("Ordering keys", "Keys with unfinished jobs and their queued jobs per queue (queued "
          "well above keys: long lines behind slow heads), and turns passed per second by the "
          "statement that finished a head; the budgeted claim's starts are the backstop.",
          (Query("max by (queue) (taskline_ordering_keys)", "keys {{queue}}"),
           Query("max by (queue) (taskline_ordering_queued_jobs)", "queued {{queue}}"),
           Query("sum(rate(taskline_ordering_turns_total[5m]))", "turns passed"),
           Query("sum(rate(taskline_limit_claimed_total[5m]))", "budgeted claim starts")),
          width=12),
)

THROUGHPUT = (
    Chart("Enqueued per second", "Jobs accepted by the API, per queue, and those with tags "
          "(tags are no label: search one with tag:name).",
          (Query("sum by (queue) (rate(job_enqueued_total[5m]))", "{{queue}}"),
           Query("sum by (queue) (rate(taskline_jobs_tagged_total[5m]))", "tagged {{queue}}")),
          unit="ops"),
    Chart("Attempts finished per second", "Attempts that succeeded or failed, per queue.",
          (Query("sum by (queue) (rate(job_completed_total[5m]))", "completed {{queue}}"),
           Query("sum by (queue) (rate(job_failed_total[5m]))", "failed {{queue}}")),
          unit="ops"),
    Chart("Promoted per second", "Due retries and delayed jobs moved to ready by maintenance.",
          (Query("sum by (queue) (rate(job_promoted_total[5m]))", "{{queue}}"),), unit="ops"),
    Chart("Processing time by type", "Handler run time, p50/p95/p99 per job type.",
          _quantiles("job_processing_time_seconds", "type", "{{type}}"), unit="s", width=12),
    Chart("Wait time by queue", "Time from ready to claimed, p50/p95/p99 per queue: "
          "rising wait with flat processing time means too few workers.",
          _quantiles("job_wait_time_seconds", "queue", "{{queue}}"), unit="s", width=12),
    Chart("Workflows", "Workflows accepted, waiting steps released by the parent outcome that "
          "decided them, those started at once on the releasing worker, and any_failed steps "
          "cancelled because every parent succeeded, per second.",
          (Query("sum(rate(taskline_workflows_submitted_total[5m]))", "submitted"),
           Query("sum(rate(taskline_workflow_steps_released_total[5m]))", "steps released"),
           Query("sum(rate(taskline_workflow_steps_condition_unmet_total[5m]))",
                 "condition unmet"),
           Query("sum(rate(taskline_workflow_steps_started_in_place_total[5m]))",
                 "started in place")),
          unit="ops", width=12),
    Chart("Outbox relay", "Jobs enqueued inside application transactions (taskline.enqueue): "
          "pushed to Redis by the relay per second and queue, those committed and not relayed "
          "yet, and how long the oldest has waited (alert past 1 minute; near 0 while a relay "
          "runs).",
          (Query("sum by (queue) (rate(taskline_outbox_relayed_total[5m]))", "relayed {{queue}}"),
           Query("max(taskline_outbox_pending_jobs)", "pending"),
           Query("max(taskline_outbox_oldest_age_seconds)", "oldest, s")), width=12),
    Chart("Enqueues folded into an existing job", "Enqueues that made no new job, per second: "
          "a unique key's job returned (duplicate) or rewritten (replaced), a debounce arrival "
          "joined a waiting job (joined), a schedule's slot folded into the job holding its "
          "unique key.",
          (Query("sum by (outcome) (rate(taskline_enqueue_folded_total[5m]))", "{{outcome}}"),
           Query("sum(rate(taskline_schedule_slots_folded_total[5m]))", "schedule slots")),
          unit="ops", width=24),
)

# A type that never succeeded (or never failed) has no series for that counter: `or ... * 0`
# stands in a zero so its ratio is 0 (or 1) instead of missing.
_SUCCEEDED = ("(sum by (type) (rate(job_completed_total[5m]))"
              " or sum by (type) (rate(job_failed_total[5m])) * 0)")
_FAILED = ("(sum by (type) (rate(job_failed_total[5m]))"
           " or sum by (type) (rate(job_completed_total[5m])) * 0)")
SUCCESS_RATIO = f"{_SUCCEEDED} / ({_SUCCEEDED} + {_FAILED})"

RELIABILITY = (
    Chart("Success ratio by type", "Share of attempts that succeeded over 5m, per job type.",
          (Query(SUCCESS_RATIO, "{{type}}"),), unit="percentunit", width=12),
    Chart("Failures by type and reason", "Failed attempts per second: error, timeout, "
          "no handler, lease lost ...",
          (Query("sum by (type, reason) (rate(job_failed_total[5m]))", "{{type}} {{reason}}"),),
          unit="ops", width=12),
    Chart("Retries by type", "Failed attempts scheduled for another try; a sudden jump for one "
          "type is a retry storm.",
          (Query("sum by (type) (rate(job_retried_total[5m]))", "{{type}}"),), unit="ops"),
    Chart("Dead-lettered by type", "Jobs that exhausted their retries or failed for good.",
          (Query("sum by (type) (rate(job_dlq_total[5m]))", "{{type}}"),), unit="ops"),
    Chart("Cancelled per second", "Jobs cancelled through the API.",
          (Query("sum by (queue) (rate(job_cancelled_total[5m]))", "{{queue}}"),), unit="ops"),
    Chart("Stale completions", "Outcomes rejected by fencing: a worker finished an attempt "
          "after its lease was taken (zombie). Each one is a re-run that was kept harmless.",
          (Query("sum by (queue) (rate(job_stale_completions_total[5m]))", "{{queue}}"),),
          unit="ops", width=12),
    Chart("Claim conflicts", "Fetched ids that another worker or a state change had already "
          "won; expected to be rare.",
          (Query("sum by (queue) (rate(job_claim_conflicts_total[5m]))", "{{queue}}"),),
          unit="ops", width=12),
)

SELF_HEALING = (
    Chart("Recoveries by cause", "Jobs given back by the reaper in the last 5m, by cause "
          "(lease_expired: the worker died or stalled past its lease).",
          (Query("sum by (cause) (increase(job_recovered_total[5m]))", "{{cause}}"),)),
    Chart("Reconciliation repairs by kind", "Redis entries restored from or removed to match "
          "PostgreSQL in the last 5m; non-zero after a Redis restart, zero in steady state.",
          (Query("sum by (kind) (increase(reconciliation_missing_jobs_total[5m]))",
                 "restored {{kind}}"),
           Query("sum by (kind) (increase(reconciliation_corrupted_metadata_total[5m]))",
                 "removed {{kind}}"))),
    Chart("Reconciliation pass duration", "Mean and p99 time of one reconciliation pass.",
          (Query("sum(rate(reconciliation_duration_seconds_sum[5m]))"
                 " / sum(rate(reconciliation_duration_seconds_count[5m]))", "mean"),
           Query("histogram_quantile(0.99, sum by (le) "
                 "(rate(reconciliation_duration_seconds_bucket[5m])))", "p99")), unit="s"),
    Chart("Lease renewals by result", "Lease renewals per second; anything but success means "
          "attempts are losing their lease.",
          (Query("sum by (result) (rate(job_lease_renewals_total[5m]))", "{{result}}"),),
          unit="ops"),
    # Only maintenance exports the leader gauge (taskline.metrics.maintenance()), one series
    # per maintenance instance.
    Chart("Maintenance leader", "1 for the maintenance instance that is active; exactly one "
          "instance should show 1.",
          (Query("max by (instance) (taskline_maintenance_leader)", "{{instance}}"),),
          stat=True),
    # Retention gauges come from the leading maintenance instance only, like the depths.
    Chart("Retention: oldest finished job by status", "Age of the oldest succeeded, cancelled "
          "and dead job still kept, against its retention (dashed: 0 keeps forever). An age "
          "past retention + 1 h means retention falls behind (RetentionFallingBehind).",
          (Query("max by (status) (taskline_retention_oldest_finished_age_seconds)",
                 "oldest {{status}}"),
           Query("max by (status) (taskline_retention_seconds)", "retention {{status}}")),
          unit="s"),
    Chart("Retention: jobs deleted by status", "Finished jobs deleted per second with their "
          "DLQ rows (their events and leases go with their partition); in steady state it "
          "follows the finish rate.",
          (Query("sum by (status) (rate(taskline_retention_deleted_total[5m]))", "{{status}}"),),
          unit="ops"),
    Chart("History partitions ready ahead", "Partitions of job_events and job_leases ready "
          "past the one being written (maintenance keeps TASKLINE_HISTORY_PARTITIONS_AHEAD, "
          "7); 0 means tomorrow's rows spill into the default partition (taskline doctor "
          "fails).",
          (Query("min by (table) (taskline_history_partitions_ahead)", "{{table}}"),)),
    # Schedules are fired by the leading maintenance instance only.
    Chart("Schedules: slots fired and skipped", "Schedule slots that enqueued their job, and "
          "slots passed over (missed while no maintenance instance led, or folded into a later "
          "slot by catch_up), per second.",
          (Query("sum(rate(taskline_schedule_slots_fired_total[5m]))", "fired"),
           Query("sum by (catch_up) (rate(taskline_schedule_slots_skipped_total[5m]))",
                 "skipped ({{catch_up}})")), unit="ops"),
    Chart("Schedules: lag from slot to job", "Time from a slot's instant to the commit of its "
          "job, p50 and p99; a slot fires within about a second while maintenance runs.",
          (Query("histogram_quantile(0.5, sum by (le) "
                 "(rate(taskline_schedule_lag_seconds_bucket[5m])))", "p50"),
           Query("histogram_quantile(0.99, sum by (le) "
                 "(rate(taskline_schedule_lag_seconds_bucket[5m])))", "p99")), unit="s"),
    Chart("Bulk DLQ operations", "Dead jobs requeued or purged per second by POST "
          "/api/v1/dlq/retry and /purge.",
          (Query("sum by (action) (rate(taskline_dlq_bulk_jobs_total[5m]))", "{{action}}"),),
          unit="ops"),
    Chart("Loop errors", "Failed iterations of service loops (reaper, promoter, reconciler, "
          "heartbeat ...), per scrape job.",
          (Query("sum by (job, loop) (rate(taskline_loop_errors_total[5m]))",
                 "{{job}} {{loop}}"),), unit="ops"),
)

# Without any 5xx there is no 5xx series at all: `or vector(0)` makes the ratio 0, not "no data".
HTTP_ERRORS = ('(sum(rate(taskline_http_requests_total{status=~"5.."}[5m])) or vector(0))'
               " / sum(rate(taskline_http_requests_total[5m]))")

INFRASTRUCTURE = (
    Chart("Targets up per job", "Scrape targets up, and all targets, per Prometheus job.",
          (Query("sum by (job) (up)", "{{job}} up"), Query("count by (job) (up)", "{{job}} all"))),
    Chart("Live workers", "Workers with a recent heartbeat, as maintenance counts them.",
          (Query("max(taskline_live_workers)"),), stat=True, width=4),
    Chart("Slot utilisation", "Busy handler slots over all slots of every worker.",
          (Query("sum(taskline_worker_busy_slots) / sum(taskline_worker_slots)"),),
          unit="percentunit", stat=True, width=4, thresholds=(0.8, 0.9)),
    Chart("Worker slots", "Busy and total handler slots over every worker, and the jobs "
          "claimed ahead of them (leased, waiting for a thread).",
          (Query("sum(taskline_worker_busy_slots)", "busy"),
           Query("sum(taskline_worker_slots)", "total"),
           Query("sum(taskline_worker_claimed_ahead)", "claimed ahead"))),
    Chart("API requests by route and status", "Requests per second the API answered.",
          (Query("sum by (route, status) (rate(taskline_http_requests_total[5m]))",
                 "{{route}} {{status}}"),), unit="reqps", width=12),
    Chart("API latency by route", "Request latency p50/p95/p99 per route, every status "
          "together (the histogram also has a status label, for ad-hoc queries).",
          _quantiles("taskline_http_request_duration_seconds", "route", "{{route}}"),
          unit="s", width=12),
    Chart("API waiting requests", "Requests held by wait_s until their job or workflow "
          "finishes (they hold no thread), and what ended the waits per second.",
          (Query("sum(taskline_api_waiting_requests)", "waiting"),
           Query("sum by (ended) (rate(taskline_api_waits_total[5m]))", "ended {{ended}}")),
          width=24),
    Chart("API server error ratio", "Share of API requests answered with a 5xx.",
          (Query(HTTP_ERRORS, "5xx"),), unit="percentunit", thresholds=(0.01, 0.05)),
    Chart("Redis memory", "Memory Redis uses, against its maxmemory (0 means no limit).",
          (Query("sum by (instance) (redis_memory_used_bytes)", "used {{instance}}"),
           Query("sum by (instance) (redis_memory_max_bytes)", "max {{instance}}")),
          unit="bytes"),
    Chart("Redis clients", "Clients connected to Redis (workers block on BLMOVE, one each).",
          (Query("sum by (instance) (redis_connected_clients)", "{{instance}}"),)),
    Chart("PostgreSQL connections", "Backends per database, against max_connections.",
          (Query("sum by (datname) (pg_stat_database_numbackends)", "{{datname}}"),
           Query("max(pg_settings_max_connections)", "max_connections")), width=12),
    Chart("PostgreSQL transactions per second", "Commits and rollbacks per database.",
          (Query("sum by (datname) (rate(pg_stat_database_xact_commit[5m]))",
                 "commit {{datname}}"),
           Query("sum by (datname) (rate(pg_stat_database_xact_rollback[5m]))",
                 "rollback {{datname}}")), unit="ops", width=12),
    Chart("Async handlers", "How long an async def handler has been holding each worker's "
          "event loop (blocking code in a coroutine), and handlers past their timeout still "
          "running (a worker recycles once they outnumber its slots).",
          (Query("max by (worker) (taskline_worker_event_loop_lag_seconds)",
                 "loop held {{worker}}"),
           Query("sum(taskline_worker_abandoned_handlers)", "abandoned handlers")),
          width=24),
)

DISPATCH = (
    Chart("Workers dispatching from PostgreSQL", "Workers claiming straight from PostgreSQL "
          "because Redis is unreachable from them (or not rebuilt since it returned); 0 is "
          "the normal Redis dispatch.",
          (Query("sum(taskline_dispatch_degraded) or vector(0)"),), stat=True, width=4,
          thresholds=(1, 1)),
    Chart("Dispatch mode", "1 while a worker dispatches from PostgreSQL, per worker.",
          (Query("max by (worker) (taskline_dispatch_degraded)", "{{worker}}"),), width=10),
    Chart("Dispatch mode switches", "Switches to each mode over 5 minutes: to postgres when "
          "Redis is lost, to redis once it was rebuilt.",
          (Query("sum by (to) (increase(taskline_dispatch_switches_total[5m]))", "to {{to}}"),),
          width=10),
)

ROWS: tuple[tuple[str, tuple[Chart, ...]], ...] = (
    ("Queue depths", QUEUES),
    ("Throughput and latency", THROUGHPUT),
    ("Reliability", RELIABILITY),
    ("Self-healing", SELF_HEALING),
    ("Infrastructure", INFRASTRUCTURE),
    ("Dispatch mode", DISPATCH),
)


def panel_expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL expression) for every query of every panel, in dashboard order."""
    return [(chart.title, query.expr)
            for _, charts in ROWS for chart in charts for query in chart.queries]


def _thresholds(levels: tuple[float, ...]) -> dashboard_builders.ThresholdsConfig:
    steps = [dashboard_models.Threshold(None, "green")]
    steps += [dashboard_models.Threshold(value, color)
              for value, color in zip(levels, ("orange", "red"), strict=False)]
    return (dashboard_builders.ThresholdsConfig()
            .mode(dashboard_models.ThresholdsMode.ABSOLUTE).steps(steps))


def _stat() -> stat.Panel:
    return (stat.Panel()
            .graph_mode(common.BigValueGraphMode.AREA)
            .color_mode(common.BigValueColorMode.VALUE)
            .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"])))


def _timeseries(chart: Chart) -> timeseries.Panel:
    legend = (common_builders.VizLegendOptions().show_legend(True)
              .display_mode(common.LegendDisplayMode.LIST)
              .placement(common.LegendPlacement.BOTTOM))
    tooltip = (common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
               .sort(common.SortOrder.DESCENDING))
    panel = timeseries.Panel().legend(legend).tooltip(tooltip).fill_opacity(10).line_width(1)
    if chart.thresholds:
        panel = panel.thresholds_style(common_builders.GraphThresholdsStyleConfig()
                                       .mode(common.GraphThresholdsStyleMode.DASHED))
    return panel


def _panel(chart: Chart, panel_id: int) -> stat.Panel | timeseries.Panel:
    panel = _stat() if chart.stat else _timeseries(chart)
    if chart.unit == "percentunit":
        panel = panel.min(0).max(1)
    panel = (panel.id(panel_id).title(chart.title).description(chart.description)
             .datasource(DATASOURCE).unit(chart.unit).height(HEIGHT).span(chart.width)
             .thresholds(_thresholds(chart.thresholds)))
    for ref, query in zip("ABCDEFGH", chart.queries, strict=False):
        panel = panel.with_target(prometheus.Dataquery().expr(query.expr)
                                  .legend_format(query.legend or "__auto").ref_id(ref))
    return panel


def build() -> dict:
    """The dashboard as a JSON-ready dict."""
    board = (dashboard_builders.Dashboard("taskline").uid(UID).tags(["taskline"])
             .description("Queues, throughput, reliability and self-healing of taskline; "
                          "docs/observability.md says which panel answers which question.")
             .refresh("10s").time("now-1h", "now").timezone("browser")
             .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR).readonly())
    panel_id = 0
    for title, charts in ROWS:
        panel_id += 1
        board = board.with_row(dashboard_builders.Row(title).id(panel_id))
        for chart in charts:
            panel_id += 1
            board = board.with_panel(_panel(chart, panel_id))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    """The dashboard JSON exactly as committed: sorted keys, two-space indent, final newline."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    target = Path(argv[0]) if argv else OUTPUT
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target} ({len(panel_expressions())} queries)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
