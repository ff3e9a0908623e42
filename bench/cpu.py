"""CPU per job of a drain, by component: the worker processes, PostgreSQL, Redis, the machine.

A sampler thread reads the CPU counters from /proc every SAMPLE_S while the drain runs; the
window is then cut, by interpolation between samples, to the drain's own span, from its first
claim to its last outcome's commit (PostgreSQL's clock: the same machine's), so neither the
processes' start-up nor the wait for the count to be seen is counted. Components:
- `worker`: every worker process's user + system CPU (all their threads, and the processes
  they forked: a peer's pool);
- `postgres`: the benchmark's PostgreSQL, the postmaster and all its children (the private
  cluster's; absent with --shared-postgres, whose server others use too);
- `redis`: the Redis server's process, the whole server: another client of that server
  (another logical DB) is counted too;
- `machine`: /proc/stat's user + system (+ nice, irq, softirq) of every core: everything.
Read the machine's figure beside the others: on a shared machine it also holds other load.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SAMPLE_S = 0.05
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (every thread); 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as kids:
                found += [int(k) for k in kids.read().split()]
    except OSError:
        pass
    return found


def machine_cpu_s() -> float:
    """Seconds of CPU the whole machine has spent busy since boot (idle and iowait left out)."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) * TICK_S


Probe = Callable[[], float]


class CpuSampler:
    """Samples `probes` (name -> cumulative CPU seconds) every SAMPLE_S on its own thread."""

    def __init__(self, probes: dict[str, Probe]) -> None:
        self.probes = probes
        self.times: list[float] = []
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-cpu")

    def _sample(self) -> None:
        now = time.time()
        self.samples.append({name: probe() for name, probe in self.probes.items()})
        self.times.append(now)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_S)
        self._sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, when: float) -> dict[str, float]:
        """Each probe's counter at wall time `when`, interpolated between its samples."""
        i = min(max(bisect_left(self.times, when), 1), len(self.times) - 1)
        t0, t1 = self.times[i - 1], self.times[i]
        share = 0.0 if t1 == t0 else min(max((when - t0) / (t1 - t0), 0.0), 1.0)
        before, after = self.samples[i - 1], self.samples[i]
        return {name: before[name] + share * (after[name] - before[name])
                for name in self.probes}

    def per_job_ms(self, start: float, end: float, jobs: int) -> dict[str, float]:
        """CPU ms per job of each probe between wall times `start` and `end`."""
        first, last = self.at(start), self.at(end)
        return {name: round((last[name] - first[name]) * 1000 / jobs, 4)
                for name in self.probes}


def descendants(root: int) -> list[int]:
    """`root` and every process below it, as they are now."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children(pid)
    return found


def tree_cpu(roots: list[int]) -> Probe:
    """The CPU of `roots` and the processes below them (as they are at each sample: backends
    and forked workers come and go; one that exited between samples takes its share with it,
    a small under-count)."""
    return lambda: sum(process_cpu_s(p) for root in roots for p in descendants(root))


def probes(worker_pids: list[int], postmaster: int | None, redis_pid: int | None
           ) -> dict[str, Probe]:
    """The worker processes (and any they forked: a peer's pool), PostgreSQL, Redis and the
    machine."""
    found: dict[str, Probe] = {"worker": tree_cpu(worker_pids)}
    if postmaster:
        found["postgres"] = tree_cpu([postmaster])
    if redis_pid:
        found["redis"] = lambda: process_cpu_s(redis_pid)
    found["machine"] = machine_cpu_s
    return found


@contextmanager
def sampled(probe_map: dict[str, Probe]) -> Iterator[CpuSampler]:
    sampler = CpuSampler(probe_map)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


def summaries(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Per component, the median and min-max of per-job CPU over repetitions."""
    import statistics
    out: dict[str, Any] = {}
    for name in runs[0] if runs else []:
        values = [r[name] for r in runs if name in r]
        out[name] = {"median": statistics.median(values), "min": min(values),
                     "max": max(values), "runs": values}
    return out
