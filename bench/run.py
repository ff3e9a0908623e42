"""`make bench`: taskline's throughput and latency on the real stack, and beside Celery/Dramatiq.

Starts a gunicorn API, worker and maintenance processes against a fresh benchmark database
(PostgreSQL with fsync on; the full audit trail kept) and a dedicated Redis logical DB, and
measures each scenario `--repeat` times on a fresh database, printing median and min-max and
writing everything, with the machine and versions, as JSON. The side-by-side drains run
taskline, Celery, Dramatiq and pgqueuer in turn inside each repetition (so a noisy neighbour
hits all of them alike) and print each ratio taskline / peer: `side_by_side` with no-op jobs,
`drain_io_side_by_side` with jobs that make one Redis round trip or sleep 10 ms, at 2 processes
x 8 slots and x the worker's default concurrency. `pgqueuer_enqueue` measures pgqueuer's single
and bulk enqueue and its pickup; `producers_side_by_side` measures taskline's producer paths
(the library's in-transaction enqueue, `Client`, `Client.enqueue_batch`) beside it, with the
client's CPU per enqueue (bench/producers.py). See docs/performance.md.

Usage: python bench/run.py [--jobs N] [--big] [--repeat R] [--only NAME,...] [--no-peers]
           [--memory-jobs N] [--shared-postgres] [--log-level LEVEL]
           [--soak-s S] [--soak-window-s S] [--soak-sample-s S] [--soak-pairs N]
           [--audit-sizes N,...] [--audit-keep DIR[,DIR...]] [--audit-seed-only]
           [--history-jobs N] [--history-rate R] [--history-buckets B]
           [--out bench-results/latest.json]
`--only unique` runs the four unique and debounce scenarios (bench/uniques.py) with the plain
single and batch enqueues they are read beside.
`--only workflows` runs the three workflow scenarios (a fan-out of 999 steps into one fan-in,
the 1,000 steps one workflow may hold: submit to the fan-in's start; a chain of 100: median
handoff against the idle pickup; single enqueues' p99 while 32 clients list five 1,000-step
workflows, against a quiet run).
`pgbouncer_pairs` (part of a full run where Debian's pgbouncer is installed) runs the 2-worker
drain and 8 clients' single enqueues directly and through a transaction-pooling PgBouncer in
interleaved pairs, with the machine's CPU per job (bench/pooled.py).
`cluster_pairs` runs the same two scenarios on the single Redis and on a 3-master, 3-replica
Redis Cluster it starts from `redis-server` (bench/clustered.py), in interleaved pairs;
`cluster_partition_pairs` runs them on that cluster with TASKLINE_QUEUE_PARTITIONS 3 against 1.
`waiters_1000` holds 1,000 waiting requests (`wait_s`) on one API of 2 processes: one client's
enqueue rate and job reads' p99 beside them against a quiet run, then the wake-up delay from
each job's finishing commit to its waiter's answer (bench/waiting.py); `waiters_0` runs the same
phases with no waiter (only when named), the control for what the phases' order alone does
to the ratios.
`--only audit_verify` (only when named) builds a history of 250,000, 500,000 and 1,000,000 jobs
(1, 5 and 10 million with --big; any with --audit-sizes) by copying a template of 1,000 jobs run
by a worker, and times `taskline audit verify` over each with its CPU and peak memory, and the
linearity (bench/audit.py). `--audit-keep DIR` keeps that history's PostgreSQL cluster in DIR
(`DIR,DIR,...`: one per size), so `--audit-seed-only` can build it beside other work and a
later run times only the audits.
`ordering_keys` drains no-op jobs over 100 ordering keys and without keys (2 x 16 slots) in
interleaved pairs and prints keyed / plain (bench/ordering.py).
`drain_redis_down` runs 2-worker drains with Redis and with Redis unreachable (dispatch from
PostgreSQL) in interleaved pairs and prints the share; `pickup_redis_down` is an idle worker's
pickup while neither it nor the API reaches Redis.
`--only retention` (never part of a run without --only: it lasts about half an hour) runs the
retention soak at half the 2-worker drain rate with TASKLINE_RETAIN_SUCCEEDED_S=60, then drains
with retention on and off in interleaved pairs (docs/performance.md, "Retention soak").
`--only history_soak` (only when named; about an hour at 10 million jobs) builds a history of
--history-jobs (10 million) finished jobs spread over jobs / --history-rate seconds, sets
every retention window to its age, offers --history-rate (600) new jobs a second for --soak-s
and reports over the last --soak-window-s: table and index sizes, autovacuum runs and time,
rows deleted, partitions dropped, maintenance CPU and WAL per hour; then the drain and single
enqueue rates on it against an empty database in --soak-pairs interleaved pairs
(bench/history.py). Run with an older checkout's virtualenv, it measures that schema.
`--only limits` (also only when named, about ten minutes) runs the flow-limit scenarios of
bench/limits.py: --soak-pairs interleaved pairs of an unlimited type's drain beside a limited
one and alone, a 60 s rate limit, an idle worker waiting on a full budget, and fairness.
Environment: BENCH_REDIS_URL (default redis://127.0.0.1:6379/9; that logical DB is flushed),
BENCH_ADMIN_URL (with --shared-postgres), BENCH_WORKER_CONCURRENCY (handler threads, 64),
BENCH_IO_CASES (drain_io_side_by_side's cases, e.g. "redis 2x8,sleep10 2x8"; all by default),
BENCH_IO_HANDLERS (its jobs: "redis,sleep10" by default; "noop,redis,sleep10" adds the no-op job),
BENCH_PEERS (the peers run, e.g. "dramatiq,pgqueuer"; all installed by default).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench/ is put on the path first: its modules import each other by name.
import audit
import clustered
import cpu
import degraded
import history
import limits
import ordering
import peers
import pooled
import producers
import scenarios as sc
import uniques
import waiting
import workflows as wfb
from stack import ROOT, Stack, open_stack

PACKAGES = ("taskline", "gunicorn", "flask", "psycopg", "sqlalchemy", "redis", "celery",
            "kombu", "dramatiq", "pgqueuer", "asyncpg")
# The side-by-side peers, in the order each repetition runs them after taskline.
PEER_DRAINS: dict[str, Callable[..., float]] = {
    "celery": peers.celery_drain, "dramatiq": peers.dramatiq_drain,
    "pgqueuer": peers.pgqueuer_drain}
# drain_io_side_by_side: the handlers (bench/iojobs.py) and the worker processes.
IO_HANDLERS = tuple(h.strip() for h in os.environ.get(
    "BENCH_IO_HANDLERS", "redis,sleep10").split(",") if h.strip())
"""The jobs drain_io_side_by_side drains; `noop` too for the no-op job beside the peers at the
same processes x slots (bench/cpu_table.py's peer columns)."""
IO_PROCESSES = 2
IO_SLOTS = 8
IO_CASES = {c.strip() for c in os.environ.get("BENCH_IO_CASES", "").split(",") if c.strip()}
"""`<handler> <setup>` cases drain_io_side_by_side runs (all when empty), e.g. "redis 2x8"."""
ASYNC_SLOTS = (16, 64)
"""--concurrency of the `async def` 10 ms-sleep drains: the threads' default, and more than
threads could afford (coroutines cost no stack nor wake-up while they wait)."""
WORKFLOW_SCENARIOS = ("workflow_fan_in_1000_steps_s", "workflow_chain_100_handoff",
                      "enqueue_p99_beside_workflow_lists")


def summary(runs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs), "runs": runs}


def machine(stack: Stack) -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "cpu": _cpu_model(),
            "load_average_at_start": os.getloadavg(), "servers": stack.server_facts(),
            "packages": versions, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def scenario_table(n: int, big: bool) -> dict[str, Callable[[Stack], Any]]:
    """Name -> one measurement. Throughputs are jobs/s."""
    table: dict[str, Callable[[Stack], Any]] = {
        "enqueue_single_1_client": lambda s: sc.enqueue_single(s, min(n, 1000), 1),
        "enqueue_single_8_clients": lambda s: sc.enqueue_single(s, min(n, 4000), 8),
        # More keep-alive clients than one process's PostgreSQL pool has connections.
        "enqueue_single_16_clients": lambda s: sc.enqueue_single(s, min(n, 4000), 16),
        "http_floor_8_clients": lambda s: sc.http_floor(s, min(n, 4000), 8),
        "enqueue_batch": lambda s: sc.enqueue_batch(s, n),
        "drain_1_worker": lambda s: sc.drain(s, n, 1),
        "drain_4_workers": lambda s: sc.drain(s, n, 4),
        "drain_2_workers_1pct_failing": lambda s: sc.drain(s, n, 2, failing_per_1000=10),
        "pickup_idle_worker": lambda s: sc.pickup(s),
        # taskline.enqueue / aenqueue, one process each: jobs/s and CPU per call (us).
        "library_enqueue": lambda s: producers.library_enqueue(s, min(n, 2000)),
        "killed_worker_rerun_s": sc.killed_worker,
        "reconcile_100k_pending": lambda s: sc.reconcile(s, 100_000),
        # Normal requests' latency (ms) while 1,000 slow or half-open connections are held.
        "slow_clients_1000": lambda s: sc.slow_clients(s, 1000),
        # Workflows (`--only workflows` runs both): submit -> start of the fan-in of 999
        # parallel steps (1,000 steps, the most one workflow holds), seconds; and the
        # step-to-step handoff along a chain of 100, ms.
        "workflow_fan_in_1000_steps_s": lambda s: wfb.fan_in(s, 999),
        "workflow_chain_100_handoff": lambda s: wfb.chain(s, 100),
        # Single-enqueue latency (ms) in five interleaved pairs of blocks of up to 1,000,
        # quiet and while 32 clients list five 1,000-step workflows: the median pair's p99
        # within 1.2 x its quiet block's, every list answered.
        "enqueue_p99_beside_workflow_lists": lambda s: wfb.enqueue_beside_lists(
            s, min(n, 1000)),
        # Dispatch from PostgreSQL: an idle worker's pickup (ms) with Redis unreachable.
        "pickup_redis_down": degraded.pickup_redis_down,
        # 1,000 requests waiting (wait_s) on one API: the enqueue rate and other requests'
        # p99 against the quiet run's, and the wake-up delay from the finishing commit (ms).
        "waiters_1000": lambda s: waiting.beside_waiters(s, 1000),
        # Unique and debounced jobs (bench/uniques.py), beside enqueue_single_8_clients and
        # enqueue_batch: new unique jobs, duplicates of 64 keys, debounce joins into 64
        # groups, and batches of 1,000 unique jobs.
        **uniques.scenarios(n),
    }
    for slots in ASYNC_SLOTS:
        # `async def` handlers awaiting 10 ms, 2 processes: read beside drain_io's sleep10
        # (threads) and Dramatiq's 2 x 16 threads there.
        table[f"drain_sleep10_async_{IO_PROCESSES}x{slots}"] = (
            lambda s, slots=slots: sc.drain(s, n, IO_PROCESSES, job_type="bench.sleep10_async",
                                            concurrency=slots))
    if big:
        table["enqueue_batch_100k"] = lambda s: sc.enqueue_batch(s, 100_000)
        table["drain_2_workers_100k"] = lambda s: sc.drain(s, 100_000, 2)
    return table


def side_by_side(stack: Stack, n: int, repeat: int, with_peers: bool) -> dict[str, Any]:
    """taskline's 2-process drain, then Celery's, Dramatiq's and pgqueuer's, in every
    repetition."""
    drains = {"taskline": lambda: sc.drain(stack, n, 2)}
    found = _peers_installed(with_peers)
    drains.update({name: lambda fn=fn: fn(stack, n) for name, fn in PEER_DRAINS.items()
                   if name in found})
    runs: dict[str, list[float]] = {name: [] for name in drains}
    cpu_runs: dict[str, list[dict[str, float]]] = {name: [] for name in drains}
    for _ in range(repeat):
        for name, fn in drains.items():
            runs[name].append(with_cpu(stack, fn, cpu_runs[name]))
    return {**_with_ratios(runs), **_cpu_entries(cpu_runs)}


def _cpu_entries(cpu_runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """`<system>_cpu_ms`: each system's CPU ms per job by component, where it was measured."""
    return {f"{name}_cpu_ms": cpu.summaries(runs) for name, runs in cpu_runs.items() if runs}


def _peers_installed(with_peers: bool) -> set[str]:
    if not with_peers:
        return set()
    found = {name for name in PEER_DRAINS if importlib.util.find_spec(name)}
    if not {"celery", "dramatiq"} <= found:
        print("Celery or Dramatiq is not installed (pip install -e '.[bench]'): no peers run")
        return set()
    if "pgqueuer" not in found:
        print("pgqueuer is not installed (pip install -e '.[bench]'): it does not run")
    wanted = os.environ.get("BENCH_PEERS", ",".join(PEER_DRAINS))
    return found & {p.strip() for p in wanted.split(",")}


def _with_ratios(runs: dict[str, list[float]]) -> dict[str, Any]:
    """Each system's summary, and taskline / peer per repetition for every peer that ran."""
    out: dict[str, Any] = {name: summary(r) for name, r in runs.items() if r}
    for peer in PEER_DRAINS:
        if runs.get(peer):
            out[f"ratio_taskline_over_{peer}"] = summary(
                [t / p for t, p in zip(runs["taskline"], runs[peer], strict=True)])
    return out


def producers_side_by_side(stack: Stack, n: int, repeat: int,
                           with_peers: bool) -> dict[str, Any]:
    """The producer's ways in (bench/producers.py) and pgqueuer's, in every repetition:
    single enqueue through the library and the client, bulk through both, enqueue call
    to handler start through each; each figure's summary, the ratios per repetition."""
    peer = peers if "pgqueuer" in _peers_installed(with_peers) else None
    runs: dict[str, list[float]] = {}
    for _ in range(repeat):
        for name, value in producers.side_by_side_once(stack, n, peer).items():
            runs.setdefault(name, []).append(value)
    return {name: summary(values) for name, values in runs.items()}


def io_setups() -> dict[str, int]:
    """Setup name -> slots per process: 2 x 8, and 2 x the worker's default concurrency (read
    from the CLI at run time) when that differs."""
    default = sc.default_concurrency()
    setups = {f"{IO_PROCESSES}x{IO_SLOTS}": IO_SLOTS}
    if default != IO_SLOTS:
        setups[f"{IO_PROCESSES}x{default}_default"] = default
    return setups


def drain_io_side_by_side(stack: Stack, n: int, repeat: int,
                          with_peers: bool) -> dict[str, Any]:
    """Per I/O handler and worker setup, taskline's drain then every peer's at the same
    processes x slots, all of them in every repetition; `<handler> <setup>` -> summaries."""
    found = _peers_installed(with_peers)
    drains: dict[str, Callable[[str, int], float]] = {
        "taskline": lambda handler, slots: sc.drain(stack, n, IO_PROCESSES,
                                                    job_type=f"bench.{handler}",
                                                    concurrency=slots)}
    drains.update({name: lambda handler, slots, fn=fn: fn(stack, n, handler, IO_PROCESSES,
                                                          slots)
                   for name, fn in PEER_DRAINS.items() if name in found})
    cases = [(h, setup, slots) for h in IO_HANDLERS for setup, slots in io_setups().items()
             if not IO_CASES or f"{h} {setup}" in IO_CASES]
    runs = {(h, setup, name): [] for h, setup, _ in cases for name in drains}
    cpu_runs: dict[tuple[str, str, str], list[dict[str, float]]] = {
        key: [] for key in runs}
    for _ in range(repeat):
        for handler, setup, slots in cases:
            for name, fn in drains.items():
                runs[handler, setup, name].append(with_cpu(
                    stack, functools.partial(fn, handler, slots), cpu_runs[handler, setup, name]))
    return {f"{h} {setup}": {**_with_ratios({name: runs[h, setup, name] for name in drains}),
                             **_cpu_entries({name: cpu_runs[h, setup, name] for name in drains})}
            for h, setup, _ in cases}


SWEEP_SLOTS = (4, 8, 16, 32)
"""Slots per process the concurrency sweep tries (the worker's default is chosen from it)."""


def concurrency_sweep(stack: Stack, n: int, repeat: int) -> dict[str, Any]:
    """taskline alone, 2 worker processes, per handler (no-op and the two I/O ones) and slot
    count: the figures behind the worker's default concurrency (docs/performance.md)."""
    runs: dict[str, list[float]] = {}
    cpu_runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeat):
        for handler in ("noop", *IO_HANDLERS):
            for slots in SWEEP_SLOTS:
                case = f"{handler} {IO_PROCESSES}x{slots}"
                runs.setdefault(case, []).append(with_cpu(stack, functools.partial(
                    sc.drain, stack, n, IO_PROCESSES, job_type=f"bench.{handler}",
                    concurrency=slots), cpu_runs.setdefault(case, [])))
    return {**{case: summary(values) for case, values in runs.items()},
            **{f"{case}_cpu_ms": cpu.summaries(kept) for case, kept in cpu_runs.items()}}


def show(name: str, value: Any) -> None:
    if isinstance(value, dict) and "median" in value:
        print(f"{name:40s} median {value['median']:10.1f}  min {value['min']:10.1f}  "
              f"max {value['max']:10.1f}", flush=True)
    else:
        print(f"{name:40s} {json.dumps(value, default=str)}", flush=True)


def show_any(name: str, value: Any) -> None:
    """`show`, or `show_cpu` for a CPU-per-job entry."""
    if name.endswith("_cpu_ms"):
        show_cpu(name.removesuffix("_cpu_ms"), value)
    else:
        show(name, value)


def show_cpu(name: str, by_component: dict[str, Any]) -> None:
    print(f"{name + ' CPU ms/job':40s} " + "  ".join(
        f"{part} {value['median']:.3f} ({value['min']:.3f}-{value['max']:.3f})"
        for part, value in by_component.items()), flush=True)


def with_cpu(stack: Stack, fn: Callable[[], Any], cpu_runs: list[dict[str, float]]) -> Any:
    """`fn()`, keeping the CPU per job of the drain it ran, if it ran one."""
    stack.last_cpu = None
    value = fn()
    if stack.last_cpu is not None:
        cpu_runs.append(stack.last_cpu)
    return value


def measure(stack: Stack, fn: Callable[[Stack], Any], repeat: int,
            cpu_runs: list[dict[str, float]] | None = None) -> Any:
    kept: list[dict[str, float]] = [] if cpu_runs is None else cpu_runs
    results = [with_cpu(stack, lambda: fn(stack), kept) for _ in range(repeat)]
    if all(isinstance(r, float | int) for r in results):
        return summary([float(r) for r in results])
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--big", action="store_true", help="also 100,000-job runs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--memory-jobs", type=int, default=0, help="RSS over a long drain")
    parser.add_argument("--shared-postgres", action="store_true")
    # WARNING keeps the figures comparable with earlier runs; INFO (the services' default)
    # adds a log line per accepted job and two per run job (docs/performance.md).
    parser.add_argument("--log-level", default="WARNING", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="TASKLINE_LOG_LEVEL of the services (default WARNING)")
    parser.add_argument("--soak-s", type=float, default=1200.0,
                        help="retention soak: seconds of offered load (default 20 min)")
    parser.add_argument("--soak-window-s", type=float, default=600.0,
                        help="retention soak: the last seconds judged steady (default 10 min)")
    parser.add_argument("--soak-sample-s", type=float, default=30.0,
                        help="retention soak: seconds between table samples")
    parser.add_argument("--soak-pairs", type=int, default=5,
                        help="retention on/off drain pairs")
    parser.add_argument("--audit-sizes", default="",
                        help="audit_verify: comma-separated history sizes in jobs")
    parser.add_argument("--audit-keep", default="",
                        help="audit_verify: a directory keeping the history's PostgreSQL "
                             "(or one per size, comma-separated)")
    parser.add_argument("--audit-seed-only", action="store_true",
                        help="audit_verify: build the history to the sizes, audit nothing")
    parser.add_argument("--history-jobs", type=int, default=10_000_000,
                        help="history_soak: jobs of history")
    parser.add_argument("--history-rate", type=float, default=600.0,
                        help="history_soak: jobs/s offered, and expiring")
    parser.add_argument("--history-buckets", type=int, default=40,
                        help="history_soak: partitions the history spans (partitioned schema)")
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "latest.json"))
    return parser.parse_args()


def side_by_sides(stack: Stack, args: argparse.Namespace, only: set[str],
                  results: dict[str, Any]) -> None:
    """The scenarios that run the peers: the no-op and I/O drains, pgqueuer's enqueue."""
    with_peers = not args.no_peers
    if not only or "side_by_side" in only:
        results["side_by_side"] = side_by_side(stack, args.jobs, args.repeat, with_peers)
        for name, value in results["side_by_side"].items():
            show_any(f"drain_2_workers {name}", value)
    if not only or "drain_io_side_by_side" in only:
        results["drain_io_side_by_side"] = drain_io_side_by_side(
            stack, args.jobs, args.repeat, with_peers)
        for case, values in results["drain_io_side_by_side"].items():
            for name, value in values.items():
                show_any(f"drain_io {case} {name}", value)
    producer_paths(stack, args, only, results)
    if "concurrency_sweep" in only:  # only when asked: twelve drains per repetition
        results["concurrency_sweep"] = concurrency_sweep(stack, args.jobs, args.repeat)
        for case, value in results["concurrency_sweep"].items():
            show_any(f"concurrency_sweep {case}", value)
    if (not only or "pgqueuer_enqueue" in only) and "pgqueuer" in _peers_installed(with_peers):
        # Read beside enqueue_single_1_client, enqueue_batch and pickup_idle_worker.
        results["pgqueuer_enqueue"] = measure(
            stack, lambda s: sc.pgqueuer_enqueue(s, args.jobs), args.repeat)
        show("pgqueuer_enqueue", results["pgqueuer_enqueue"])


def producer_paths(stack: Stack, args: argparse.Namespace, only: set[str],
                   results: dict[str, Any]) -> None:
    if not only or "producers_side_by_side" in only:
        results["producers_side_by_side"] = producers_side_by_side(
            stack, args.jobs, args.repeat, not args.no_peers)
        for name, value in results["producers_side_by_side"].items():
            show(f"producers {name}", value)


def expand_only(only: set[str]) -> set[str]:
    """`--only`'s names, its groups (`workflows`, `unique`) replaced by their scenarios."""
    if "workflows" in only:
        only |= set(WORKFLOW_SCENARIOS)
    if "unique" in only:
        only |= {*uniques.scenarios(0), "enqueue_single_8_clients", "enqueue_batch"}
    return only


def run(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    only = expand_only({name for name in args.only.split(",") if name})
    stack.extra_env["TASKLINE_LOG_LEVEL"] = args.log_level
    report: dict[str, Any] = {"machine": machine(stack), "jobs": args.jobs,
                              "repeat": args.repeat, "log_level": args.log_level,
                              "results": {}}
    print(json.dumps(report["machine"]), flush=True)
    results = report["results"]
    side_by_sides(stack, args, only, results)
    for name, fn in scenario_table(args.jobs, args.big).items():
        if only and name not in only:
            continue
        stack.placements.clear()
        stack.group_sizes.clear()
        cpu_runs: list[dict[str, float]] = []
        results[name] = measure(stack, fn, args.repeat, cpu_runs)
        show(name, results[name])
        if cpu_runs:  # the drains: CPU ms per job by component, beside jobs/s
            results[name + "_cpu_ms"] = cpu.summaries(cpu_runs)
            show_cpu(name, results[name + "_cpu_ms"])
        if stack.placements:  # the enqueue scenarios: connections per API process, per run
            results[name + "_connections_per_process"] = list(stack.placements)
            show(name + "_connections_per_process", stack.placements)
        if stack.group_sizes:  # single enqueues: jobs per statement (group commit), per run
            results[name + "_mean_group_size"] = list(stack.group_sizes)
            show(name + "_mean_group_size", stack.group_sizes)
    redis_down(stack, args, only, results)
    behind_pgbouncer(stack, args, only, results)
    peak = results.get("side_by_side", {}).get("taskline", {}).get("median")
    if peak and (not only or "steady_latency" in only):
        results["steady_latency_50pct"] = measure(
            stack, lambda s: sc.steady_latency(s, peak), args.repeat)
        show("steady_latency_50pct", results["steady_latency_50pct"])
    only_when_named(stack, args, only, results)
    if args.memory_jobs:
        results["memory"] = sc.memory(stack, args.memory_jobs)
        show("memory", results["memory"]["rss_mib_after_10pct"])
    return report


def only_when_named(stack: Stack, args: argparse.Namespace, only: set[str],
                    results: dict[str, Any]) -> None:
    """The long scenarios, part of a run only when named."""
    if "retention" in only:
        results["retention"] = retention(stack, args)
    if "waiters_0" in only:  # waiters_1000's control: its phases with no waiter
        results["waiters_0"] = measure(stack, lambda s: waiting.beside_waiters(s, 0),
                                       args.repeat, [])
        show("waiters_0", results["waiters_0"])
    if "history_soak" in only:
        results["history_soak"] = history.run(
            stack, args.history_jobs, args.history_rate, args.history_buckets, args.soak_s,
            args.soak_window_s, args.soak_sample_s, args.soak_pairs)
    if "limits" in only:  # about ten minutes
        results["limits"] = limits.run_all(stack, args.jobs, args.soak_pairs)
    if "audit_verify" in only:  # minutes per million jobs, most of it building the history
        sizes = [1_000_000, 5_000_000, 10_000_000] if args.big else [250_000, 500_000,
                                                                     1_000_000]
        if args.audit_sizes:
            sizes = sorted(int(n) for n in args.audit_sizes.split(","))
        results["audit_verify"] = audit.scaling(
            stack, sizes, [Path(d) for d in args.audit_keep.split(",") if d],
            args.audit_seed_only)


def redis_down(stack: Stack, args: argparse.Namespace, only: set[str],
               results: dict[str, Any]) -> None:
    """Interleaved pairs: 2-worker drains with Redis and with Redis unreachable."""
    if not only or "drain_redis_down" in only:
        results["drain_redis_down"] = degraded.drain_pairs(stack, args.jobs, args.repeat)
        for name, value in results["drain_redis_down"].items():
            show(f"drain_redis_down {name}", value)


def behind_pgbouncer(stack: Stack, args: argparse.Namespace, only: set[str],
                     results: dict[str, Any]) -> None:
    """Interleaved pairs: the 2-worker drain and 8 clients' single enqueues, directly and
    through a transaction-pooling PgBouncer (bench/pooled.py), then on the single Redis and on
    a Redis Cluster (bench/clustered.py), with CPU per job."""
    if (not only and pooled.available()) or "pgbouncer_pairs" in only:
        results["pgbouncer_pairs"] = pooled.pairs(stack, args.jobs, args.repeat)
        _show_pairs("pgbouncer", results["pgbouncer_pairs"])
    if not only or "ordering_keys" in only:
        results["ordering_keys"] = ordering.pairs(stack, args.jobs, args.repeat)
        show("ordering_keys keyed/plain", results["ordering_keys"]["ratio_keyed_over_plain"])
    if not only or "cluster_pairs" in only:
        results["cluster_pairs"] = clustered.pairs(stack, args.jobs, args.repeat)
        _show_pairs("redis cluster", results["cluster_pairs"])
    if not only or "cluster_partition_pairs" in only:
        results["cluster_partition_pairs"] = clustered.partition_pairs(stack, args.jobs,
                                                                       args.repeat)
        _show_pairs("redis cluster partitions", results["cluster_partition_pairs"])


def _show_pairs(label: str, pairs: dict[str, Any]) -> None:
    for case, values in pairs.items():
        for name, value in values.items():
            show(f"{label} {case} {name}", value)


def retention(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    """The retention soak at half the measured drain rate, then the on/off drain pairs."""
    peak = sc.drain(stack, args.jobs, 2)
    print(f"retention: 2-worker drain {peak:.0f} jobs/s; offering {peak / 2:.0f} jobs/s for "
          f"{args.soak_s:.0f} s", flush=True)
    soak = sc.retention_soak(stack, peak / 2, args.soak_s, args.soak_window_s,
                             args.soak_sample_s)
    show("retention_soak_verdict", soak["verdict"])
    pairs = sc.retention_pairs(stack, args.jobs, args.soak_pairs)
    ratio = pairs["ratio_on_over_off"]
    print(f"{'retention_drain_on_over_off':40s} median {ratio['median']:.3f}  min "
          f"{ratio['min']:.3f}  max {ratio['max']:.3f}  within 10 %: {pairs['within_10pct']}",
          flush=True)
    return {"drain_2_workers": peak, "soak": soak, "drain_pairs": pairs}


def main() -> int:
    args = parse_args()
    with open_stack(args.shared_postgres) as stack:
        report = run(stack, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
