"""`python bench/cpu_table.py`: where a job's CPU goes, by component and by step, in one table.

For each job (`noop`, `redis`: one Redis round trip, `sleep10`: a 10 ms wait; any
bench/benchjobs.py type, `redis_async` its `async def` form) and each worker setup (2 processes
x 8 slots and x the default), this checkout drains 20,000 jobs with a maintenance process
leading beside the workers, and reads over a window in the middle of the drain
(bench/thread_cpu.py): each worker thread's CPU from the kernel's account, by role (fetch loops,
handler threads, the event loop of `async def` handlers, recorder, lease keeper, the rest), and
PostgreSQL's, Redis's, maintenance's and the machine's. The cases run interleaved, `--repeat`
times; the table gives medians in microseconds a job.

The roles are split into steps (fetch, claim, hand-off, the handler's body, settle, Redis
acknowledgement, renewal, metrics, logging, tracing) by one more drain per case with py-spy
sampling the GIL's holder in both workers (bench/thread_cpu.py `--steps`): each sample is the
Python a step ran, 4 ms of it at 250 samples a second, shared over the window's jobs. What a
role's threads spent beyond their Python is the kernel's work for them (context switches,
futexes, socket calls) and C code run without the GIL: the table gives it as the remainder.
That drain carries the profiler's cost (py-spy's own CPU, on the other core); its raw stacks are
kept beside `--out` (`cpu_table_<job>_2x<slots>.0.txt` and `.1.txt`).

`--peers FILE` adds the peers' rows from a `bench/run.py` result holding
`drain_io_side_by_side` (run with BENCH_IO_HANDLERS=noop,redis,sleep10 for the no-op job):
their worker processes, PostgreSQL, Redis and the machine, by the same /proc accounting, from
the first pickup to the last acknowledgement; a peer has no threads of these roles to split.

Usage: python bench/cpu_table.py [--handlers noop,redis,sleep10] [--slots 8,16] [--repeat 3]
           [--jobs 20000] [--margin 2500] [--peers bench-results/latest.json]
           [--out bench-results/cpu_table.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from thread_cpu import STEPS_RATE, run_measure, steps_file  # noqa: E402

ROLE_OF = (("fetch", ("worker/loop.py",)), ("handlers", ("_work (",)),
           ("event loop", ("execution/eventloop.py",)),
           ("recorder", ("execution/outcomes.py",)), ("lease keeper", ("execution/leases.py",)))
"""A sample's thread role: the first of these met walking its stack from the thread's root
(the main thread runs a fetch loop too; a fetch loop's hand-off passes through the runner, but
only a handler thread's root is `Runner._work`)."""

ROOTS = ("_bootstrap (threading", "_run_module_as_main (")
"""The first frame of a whole stack (a thread's, the main thread's); py-spy, reading a running
process without stopping it, sometimes gets only the top of a stack."""
PARTIAL = ("unattributed", "py-spy's partial stacks (no thread root)")
"""(role, step) of a stack without its root: Python of some role, counted on its own."""

CROSSING = (("metrics", ("prometheus_client", "taskline/metrics.py")),
            ("logging", ("logging/", "taskline/log.py")),
            ("tracing", ("opentelemetry", "taskline/tracing.py")))
"""Steps any role may take, counted wherever they run."""

STEPS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "fetch": (("claim", ("claim (", "_claim_jobs (", "claim_due (", "_claim_keyed (")),
              ("fetch from Redis", ("dispatch/",)),
              ("hand-off to a handler thread", ("execution/runner.py", "execution/attempts.py")),
              ("the loop's own pacing and slots", ())),
    "handlers": (("the job's body", ("benchjobs.py", "iojobs.py")),
                 ("the runner around it", ())),
    "event loop": (("the job's body", ("benchjobs.py", "iojobs.py")),
                   ("asyncio and the runner around it", ())),
    "recorder": (("settle (PostgreSQL statement)", ("store/", "sqlalchemy/", "psycopg/")),
                 ("acknowledgement in Redis", ("dispatch/", "redis/")),
                 ("building outcomes, waking waiters", ())),
    "lease keeper": (("renewal", ()),),
    "other": (("heartbeat, deadlines, the rest", ()),),
}
"""Each role's steps: the first whose marks a sample's stack holds, else the last."""


def step_of(frames: list[str]) -> tuple[str, str]:
    """(role, step) of one sampled stack, its frames from the thread's root to the leaf."""
    if not any(root in frames[0] for root in ROOTS):
        return PARTIAL
    role = next((r for frame in frames for r, marks in ROLE_OF
                 if any(m in frame for m in marks)), "other")
    for step, marks in CROSSING:
        if any(m in frame for frame in frames for m in marks):
            return role, step
    for step, marks in STEPS[role]:
        if not marks or any(m in frame for frame in frames for m in marks):
            return role, step
    raise AssertionError("every role's last step takes any stack")


def python_us(collapsed: list[Path], jobs: int, rate: int) -> dict[str, dict[str, float]]:
    """Per role and step, the microseconds a job that the GIL's holder spent there: py-spy's
    raw stacks of every worker, `rate` samples a second, over `jobs` jobs."""
    counts: Counter[tuple[str, str]] = Counter()
    for path in collapsed:
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            frames = [f for f in stack.split(";")[1:] if f]
            if frames:
                counts[step_of(frames)] += int(n)
    by_role: dict[str, dict[str, float]] = {}
    for (role, step), n in counts.items():
        by_role.setdefault(role, {})[step] = n / rate / jobs * 1e6
    return by_role


def drain(handler: str, slots: int, args: argparse.Namespace,
          steps: Path | None = None) -> dict[str, Any]:
    """One bench/thread_cpu.py measurement in this interpreter, maintenance running."""
    return run_measure(sys.executable, handler, slots, args.jobs, args.margin,
                       maintenance=True, steps=steps)


def table(cases: dict[str, dict[str, Any]], peers: dict[str, dict[str, Any]]) -> str:
    """The markdown table: components and steps down, cases across."""
    names = list(cases)
    lines = ["| us a job | " + " | ".join(names) + " |", "|---" + "|---:" * len(names) + "|"]

    def row(label: str, values: list[float | None]) -> None:
        lines.append(f"| {label} | " + " | ".join(
            "-" if v is None else f"{v:,.0f}" for v in values) + " |")

    for role in ("fetch", "handlers", "event loop", "recorder", "lease keeper", "other"):
        row(f"worker: {role}", [c["median"].get(f"{role} us") for c in cases.values()])
        for step, _ in STEPS[role] + CROSSING:
            values = [c["python"].get(role, {}).get(step, 0.0) for c in cases.values()]
            if any(v >= 0.5 for v in values):
                row(f"- {step}", values)
        if role == "other":
            value = [c["python"].get(PARTIAL[0], {}) for c in cases.values()]
            row("worker: stacks py-spy read in part (Python of any role)",
                [sum(v.values()) for v in value])
            continue
        rest = [max(0.0, c["median"].get(f"{role} us", 0.0) -
                    sum(c["python"].get(role, {}).values())) for c in cases.values()]
        if any(v >= 0.5 for v in rest):
            row("- outside the GIL: the kernel's switches, futexes, sockets", rest)
    for label in ("worker", "postgres", "redis", "maintenance", "machine"):
        row(label if label != "worker" else "**worker, all threads**",
            [c["median"].get(f"{label} us") for c in cases.values()])
    row("jobs/s", [c["median"].get("jobs/s") for c in cases.values()])
    for system, by_case in peers.items():
        label = "taskline beside the peers" if system == "taskline" else system
        for part in ("worker", "postgres", "redis", "machine", "jobs/s"):
            row(f"{label}: {part}", [by_case.get(name, {}).get(part) for name in names])
    return "\n".join(lines)


def peer_columns(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per system of a bench/run.py result's I/O drains (taskline beside the peers too) and
    per case: CPU us a job by component, and jobs/s."""
    found: dict[str, dict[str, Any]] = {}
    for case, values in results["results"].get("drain_io_side_by_side", {}).items():
        handler, setup = case.split(" ", 1)
        name = f"{handler} {setup.removesuffix('_default')}"
        for key, parts in values.items():
            if key.endswith("_cpu_ms"):
                system = key.removesuffix("_cpu_ms")
                found.setdefault(system, {})[name] = {
                    **{part: 1000 * v["median"] for part, v in parts.items()},
                    "jobs/s": values[system]["median"]}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handlers", default="noop,redis,sleep10")
    parser.add_argument("--slots", default="8,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--margin", type=int, default=2_500)
    parser.add_argument("--peers", type=Path, help="a bench/run.py result with the peers' drains")
    parser.add_argument("--out", type=Path, default=BENCH.parent / "bench-results" /
                        "cpu_table.json")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    slots = [int(s) for s in args.slots.split(",")]
    cases = {f"{h} 2x{s}": (h, s) for h in args.handlers.split(",") for s in slots}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for n in range(args.repeat):
        for name, (handler, s) in cases.items():
            runs[name].append(drain(handler, s, args))
            print(f"{n + 1}/{args.repeat} {name}: {json.dumps(runs[name][-1])}", flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for name, (handler, s) in cases.items():
        profile = args.out.with_name(f"{args.out.stem}_{handler}_2x{s}.txt")
        profiled = drain(handler, s, args, steps=profile)
        spent = python_us([steps_file(profile, n) for n in range(2)], profiled["jobs"],
                          STEPS_RATE)
        keys = [k for k, v in runs[name][0].items() if isinstance(v, int | float)]
        summary[name] = {"median": {k: statistics.median(r[k] for r in runs[name] if k in r)
                                    for k in keys}, "python": spent, "profiled": profiled}
    peers = peer_columns(json.loads(args.peers.read_text())) if args.peers else {}
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                    "runs": runs, "summary": summary, "peers": peers}, indent=2))
    print(table(summary, peers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
