"""Thread switches per job in the worker processes during a drain: a count, not a time, so it
holds on a machine whose CPU time per job moves by a third from one run to the next.

Drains `--jobs` jobs of `bench.<handler>` with two worker processes of `--slots` handler slots
on the benchmark's stack (a private PostgreSQL), and between the 500th finished job and the
500th before the last reads, for every thread of the two workers, the kernel's voluntary (the
thread blocked: a lock, the GIL, a socket) and involuntary (preempted) context switches from
/proc, and the processes' CPU time. Prints both per job.

Usage: python bench/switches.py [--handler redis] [--slots 8] [--jobs 8000] [--shared-postgres]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cpu
import finished
import scenarios
from stack import open_stack, wait_until

MARGIN = 500
"""Jobs left out at each end: the workers' start and the drain's tail."""


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of `pid` so far."""
    voluntary = involuntary = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue  # the thread ended while we read
        for line in lines:
            name, _, value = line.partition(":")
            if name == "voluntary_ctxt_switches":
                voluntary += int(value)
            elif name == "nonvoluntary_ctxt_switches":
                involuntary += int(value)
    return voluntary, involuntary


def sample(pids: list[int]) -> tuple[int, int, float]:
    counts = [switches(pid) for pid in pids]
    return (sum(c[0] for c in counts), sum(c[1] for c in counts),
            sum(cpu.process_cpu_s(pid) for pid in pids))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handler", default="redis", help="bench.<handler> (benchjobs.py)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=8000, help="a multiple of 1,000")
    parser.add_argument("--shared-postgres", action="store_true")
    args = parser.parse_args()
    with open_stack(args.shared_postgres) as stack:
        scenarios._backlog(stack, args.jobs, job_type=f"bench.{args.handler}")
        with stack.workers(2, args.slots) as procs:
            pids = [p.pid for p in procs]
            with finished.taskline(stack, args.jobs) as done:
                wait_until(lambda: done() >= MARGIN, timeout=120, interval=0.01)
                first, done_first = sample(pids), stack.count("succeeded")
                wait_until(lambda: done() >= args.jobs - MARGIN, timeout=1200, interval=0.01)
            last, done_last = sample(pids), stack.count("succeeded")
    jobs = done_last - done_first
    voluntary, involuntary, seconds = (b - a for a, b in zip(first, last, strict=True))
    print(f"{args.handler} 2 x {args.slots}, {jobs} jobs: per job {voluntary / jobs:.2f} voluntary "
          f"and {involuntary / jobs:.2f} involuntary switches, worker CPU "
          f"{seconds * 1000 / jobs:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
