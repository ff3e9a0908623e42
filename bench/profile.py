"""`python bench/profile.py`: py-spy profiles of a worker draining and of the API under load.

Records, on the real stack, (1) one worker process (16 threads) draining a backlog of no-op
jobs and (2) one gunicorn API worker process while 8 client processes enqueue one job per
request; writes py-spy's raw collapsed stacks and prints the top frames by own and total time.
py-spy comes from PyPI (`pip install py-spy`) and needs ptrace rights on the profiled process.

Usage: python bench/profile.py [--seconds S] [--out bench-results/profile]
       [--handler noop|redis|sleep10] [--workers N] [--slots N] [--jobs N] [--gil]
       [--worker-only | --api-only]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios as sc
from clients import post_concurrently
from pyspy import PY_SPY
from stack import ROOT, Stack, open_stack, wait_until


def record(pid: int, seconds: int, out: Path, gil: bool = False) -> None:
    """py-spy samples `pid` for `seconds`; `gil`: only the thread holding the GIL, which
    leaves out threads blocked in I/O that py-spy would otherwise count as running."""
    subprocess.run([PY_SPY, "record", "-p", str(pid), "-d", str(seconds), "-f", "raw",
                    "-o", str(out), "--nonblocking", "-r", "200", *(["--gil"] if gil else [])],
                   check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top(collapsed: Path, n: int = 15) -> dict[str, list[tuple[str, float]]]:
    """The frames with most own and most total samples, as shares of all non-idle samples."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";")[1:] if f]
        if not frames or _idle(frames[-1]):
            continue
        samples += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            total[frame] += int(count)
    share = lambda c: [(f, round(100 * k / samples, 1)) for f, k in c.most_common(n)]  # noqa: E731
    return {"own_pct": share(own), "total_pct": share(total)}


def _idle(frame: str) -> bool:
    return any(word in frame for word in ("wait (threading", "_wait_for_tstate_lock",
                                          "get (queue", "select (selectors", "sleep"))


def profile_worker(stack: Stack, jobs: int, seconds: int, out: Path, job_type: str = "bench.noop",
                   workers: int = 1, slots: int = sc.DRAIN_CONCURRENCY, gil: bool = False) -> None:
    """Records the first of `workers` worker processes draining `jobs` jobs of `job_type`."""
    sc._backlog(stack, jobs, job_type=job_type)
    with stack.workers(workers, slots) as procs:
        wait_until(lambda: stack.count("succeeded") > 500, timeout=60)
        record(procs[0].pid, seconds, out, gil)


def profile_api(stack: Stack, seconds: int, out: Path, gil: bool = False) -> None:
    stack.reset()
    with stack.api(workers=1) as base:
        pids = subprocess.run(["pgrep", "-P", str(stack.api_pid)], capture_output=True,
                              text=True).stdout.split()
        load = threading.Thread(target=post_concurrently,
                                args=(base, "/api/v1/jobs", sc.NOOP, 400 * seconds, 8))
        load.start()
        record(int(pids[0]), seconds, out, gil)
        load.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "profile"))
    parser.add_argument("--handler", default="noop", help="benchmark job: noop, redis, sleep10")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=sc.DRAIN_CONCURRENCY)
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--gil", action="store_true", help="sample the GIL's holder only")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--worker-only", action="store_true", help="skip the API's profile")
    only.add_argument("--api-only", action="store_true", help="skip the worker's profile")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    recorded = []
    with open_stack(shared_postgres=False) as stack:
        if not args.api_only:
            profile_worker(stack, args.jobs, args.seconds, out / "worker.txt",
                           f"bench.{args.handler}", args.workers, args.slots, args.gil)
            recorded.append("worker")
        if not args.worker_only:
            profile_api(stack, args.seconds, out / "api.txt", args.gil)
            recorded.append("api")
    for name in recorded:
        print(f"== {name}")
        for kind, frames in top(out / f"{name}.txt").items():
            print(f"  -- {kind}")
            for frame, pct in frames:
                print(f"  {pct:5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
