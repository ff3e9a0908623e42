"""`python bench/thread_cpu.py`: a worker's CPU per job by thread role, in interleaved pairs of
two checkouts (or one checkout's runs alone).

A worker process runs its fetch loops, its handler threads (and an event loop's thread for
`async def` handlers), the recorder that writes outcomes, the lease keeper, the heartbeat and
the deadline thread; py-spy's sampling says which steps
hold the GIL, not what each thread costs. This reads the kernel's own account instead: for
every thread of the two worker processes, its CPU time (`/proc/<pid>/task/<tid>/schedstat`, in
nanoseconds: user and system, the kernel's work of its sockets and futexes included) at the
window's two ends, with its switches (`status`: voluntary ones, waits for a lock, the GIL or a
socket; involuntary ones, preemptions), named by the thread's Python name (one `py-spy dump`
per process). The
window runs from the `--margin`th job succeeded to the `--margin`th before the last, so start-up
and the drain's tail are left out; PostgreSQL's, Redis's and the machine's CPU over the same
window are read beside it (the private cluster's every process, the Redis server's, every core's
from /proc/stat).

Each run is this script started with one checkout's virtualenv (so its workers are that
checkout's code) on the benchmark's stack: a private PostgreSQL and Redis DB 9. Pairs alternate
which side runs first; lower is better, so each ratio is before / after.

Usage: python bench/thread_cpu.py [--before DIR --after DIR | --tree DIR] [--pairs 5]
           [--handler redis] [--slots 8] [--jobs 20000] [--margin 2000]
           [--after-env BENCH_SET_TASKLINE_WORKER_CPUS=auto] [--maintenance]
           [--out bench-results/thread_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROLES = ("fetch", "handlers", "event loop", "recorder", "lease keeper", "other")
"""A worker's threads by role; `other` is every thread not named below (heartbeat, deadlines,
the metrics server, the main thread while it only waits)."""
_ROLE_OF = (("taskline-fetch", "fetch"), ("taskline-worker", "fetch"),
            ("taskline-handler", "handlers"), ("taskline-asyncio", "event loop"),
            ("taskline-recorder", "recorder"),
            ("taskline-lease-keeper", "lease keeper"))
"""Thread names by prefix: the first fetch loop runs on the worker's own thread."""


STEPS_RATE = 250
"""py-spy's samples a second for `--steps`: each sample of the GIL's holder stands for 4 ms of
Python running."""

def steps_file(steps: Path, n: int) -> Path:
    """The py-spy recording of the `n`th worker process for `--steps steps`."""
    return steps.with_name(f"{steps.stem}.{n}{steps.suffix}")


POLL_S = 0.1
"""How often the finished jobs are polled for the window's ends (bench/finished.py: cheap reads
inside the window). The counts at the two ends are read exactly whenever the polls stop."""


def role(name: str) -> str:
    return next((r for prefix, r in _ROLE_OF if name.startswith(prefix)), "other")


def thread_ns(pid: int) -> dict[int, tuple[int, int, int]]:
    """Every thread of `pid`, by thread id: its CPU nanoseconds so far, and how often it gave up
    its core waiting (voluntary switches) and was taken off it (involuntary: preempted)."""
    out: dict[int, tuple[int, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            status = dict(line.split(":", 1) for line in
                          (task / "status").read_text().splitlines() if ":" in line)
            out[int(task.name)] = (ns, int(status["voluntary_ctxt_switches"]),
                                   int(status["nonvoluntary_ctxt_switches"]))
        except (OSError, ValueError, KeyError):
            continue  # the thread ended while it was read
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Each live thread's Python name, from py-spy's dump of the process."""
    from pyspy import PY_SPY

    dump = subprocess.run([PY_SPY, "dump", "--pid", str(pid)], capture_output=True,
                          text=True, check=True).stdout
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', dump, re.M)}


def measure(handler: str, slots: int, jobs: int, margin: int, maintenance: bool = False,
            steps: Path | None = None) -> dict[str, Any]:
    """One drain on this interpreter's taskline: CPU us per job by role, and the servers'.
    `maintenance`: a maintenance process leads through the drain and its CPU is read beside
    the rest; `steps`: py-spy records the GIL's holder in each worker over the window, into
    `<stem>.0<suffix>` and `<stem>.1<suffix>` (its figures then carry the profiler's cost)."""
    sys.path.insert(0, str(BENCH))
    import cpu
    import finished
    import scenarios
    from pyspy import start_recording, stop_recording
    from stack import open_stack, wait_until

    import taskline

    with open_stack(False) as stack, ExitStack() as running:
        scenarios._backlog(stack, jobs, job_type=f"bench.{handler}")
        chores = [running.enter_context(stack.process("maintenance")).pid] if maintenance else []
        if chores:  # its start-up is left out of the window: the workers start once it leads
            wait_until(lambda: stack.sql("SELECT count(*) FROM taskline.leader_leases")[0][0] > 0,
                       timeout=60, interval=0.05)
        procs = running.enter_context(stack.workers(2, slots))
        succeeded = running.enter_context(finished.taskline(stack, jobs))
        pids = [p.pid for p in procs]
        wait_until(lambda: succeeded() >= margin, timeout=120, interval=POLL_S)
        servers = {"postgres us": cpu.tree_cpu([stack.postmaster_pid() or 0]),
                   "redis us": cpu.tree_cpu([stack.redis_pid() or 0]),
                   "machine us": cpu.machine_cpu_s,
                   **({"maintenance us": cpu.tree_cpu(chores)} if chores else {})}
        names = {tid: name for pid in pids for tid, name in thread_names(pid).items()}
        spies = [start_recording(pid, steps_file(steps, n), rate=STEPS_RATE, gil=True)
                 for n, pid in enumerate(pids)] if steps else []
        start = ([thread_ns(pid) for pid in pids], stack.count("succeeded"),
                 [probe() for probe in servers.values()], time.monotonic())
        wait_until(lambda: succeeded() >= jobs - margin, timeout=600, interval=POLL_S)
        end = ([thread_ns(pid) for pid in pids], stack.count("succeeded"),
               [probe() for probe in servers.values()], time.monotonic())
        for spy in spies:
            stop_recording(spy)
        # A handler thread started in the window (one replaced after a timeout) too.
        names.update({tid: name for pid in pids for tid, name in thread_names(pid).items()})
    done = end[1] - start[1]
    by_role = {r: [0.0, 0.0, 0.0] for r in ROLES}
    for before, after in zip(start[0], end[0], strict=True):
        for tid, counts in after.items():
            was = before.get(tid, (0, 0, 0))
            sums = by_role[role(names.get(tid, ""))]
            for i, (a, b) in enumerate(zip(counts, was, strict=True)):
                sums[i] += (a - b) / done
    result: dict[str, Any] = {f"{r} us": round(v[0] / 1e3, 2) for r, v in by_role.items()}
    result["worker us"] = round(sum(v[0] for v in by_role.values()) / 1e3, 2)
    for r, v in by_role.items():  # switches per job, fewer is better as for CPU
        result[f"{r} waits"], result[f"{r} preempted"] = round(v[1], 3), round(v[2], 3)
    for label, b, a in zip(servers, start[2], end[2], strict=True):
        result[label] = round((a - b) * 1e6 / done, 2)
    result["jobs/s"] = round(done / (end[3] - start[3]), 1)
    if steps:  # the profile's samples are shared over these
        result["jobs"] = done
    result["taskline"] = str(Path(taskline.__file__).resolve())
    return result


def run_measure(python: str, handler: str, slots: int, jobs: int, margin: int,
                maintenance: bool = False, steps: Path | None = None,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """`measure` in a child process of `python` (`env` added to its environment); the JSON
    object its last line prints."""
    answer = subprocess.run(
        [python, str(Path(__file__).resolve()), "--measure", "--handler", handler,
         "--slots", str(slots), "--jobs", str(jobs), "--margin", str(margin),
         *(["--maintenance"] if maintenance else []),
         *(["--steps", str(steps)] if steps else [])],
        capture_output=True, text=True, cwd=BENCH, env={**os.environ, **(env or {})})
    if answer.returncode != 0:
        raise RuntimeError(f"thread_cpu.py --measure with {python} ({handler}, {slots} slots) "
                           f"failed:\n{answer.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(answer.stdout.splitlines()[-1])
    return result


def run_in_tree(tree: Path, args: argparse.Namespace,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """`measure` under `tree`'s virtualenv (`env` added to its environment)."""
    result = run_measure(str(tree / ".venv" / "bin" / "python"), args.handler, args.slots,
                         args.jobs, args.margin, args.maintenance, env=env)
    if not Path(result["taskline"]).is_relative_to(tree.resolve()):
        raise RuntimeError(f"{tree}'s virtualenv imported taskline from {result['taskline']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--tree", type=Path, help="one checkout's runs, no pairs")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--handler", default="redis", help="bench.<handler> (benchjobs.py)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--margin", type=int, default=2_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/thread_cpu.json"))
    parser.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set for the after side's runs only (BENCH_SET_TASKLINE_X=v sets "
                             "TASKLINE_X for the workers: one setting against its default)")
    parser.add_argument("--maintenance", action="store_true",
                        help="a maintenance process runs beside the workers; its CPU is read too")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=Path, help=argparse.SUPPRESS)  # bench/cpu_table.py's
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.handler, args.slots, args.jobs, args.margin,
                                 args.maintenance, args.steps)))
        return 0
    from pairs import alternating, compared

    sides = {"before": args.before, "after": args.after} if args.tree is None else {
        "before": args.tree, "after": args.tree}
    if None in sides.values():
        parser.error("give --before and --after, or --tree")
    after_env = dict(item.split("=", 1) for item in args.after_env)
    runs: list[dict[str, dict[str, Any]]] = []
    for n in range(args.pairs):
        runs.append({side: run_in_tree(sides[side], args, after_env if side == "after" else None)
                     for side in alternating(n)})
        print(json.dumps(runs[-1]), flush=True)
    metrics = [k for k, v in runs[0]["before"].items() if isinstance(v, float | int)]
    summary = {}
    for metric in metrics:
        before = [r["before"][metric] for r in runs]
        after = [r["after"][metric] for r in runs]
        # CPU: before / after (above 1, the after side is cheaper); jobs/s: after / before.
        ratios = [a / b if metric == "jobs/s" else b / a
                  for b, a in zip(before, after, strict=True) if a and b]
        if ratios:  # a role no thread of either side had (nothing to compare) is left out
            summary[metric] = compared(ratios, before, after)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                    "pairs": runs, "summary": summary}, indent=2))
    for metric, s in summary.items():
        print(f"{metric:16s} {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
