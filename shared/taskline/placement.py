"""Keeping an `auto` worker where it runs best: pinned to its CPU while busy, free while idle
or while its own work could use more than one CPU, and moved off a crowded CPU.

`auto` gives each worker process a CPU (taskline.affinity), because a busy worker's threads then
hand the GIL and their jobs to one another on one core. Pinning pays only under load and can
cost otherwise, so the process is pinned to that CPU only while that pays:

- idle (its own threads use under IDLE_BELOW of a CPU): free, its threads may run on any CPU it
  may use, so a job that arrives starts on whichever core is free rather than waiting for its
  own (pinned, the idle pickup's p50 was 10 % slower and its p99 35 % slower:
  docs/performance.md, change 132). A worker starts free;
- busy (from BUSY_FROM): pinned;
- saturated (SATURATED or more: handlers computing, in Python or in C extensions that release
  the GIL and could use several cores): free again, and pinned once more only below REPIN_BELOW,
  so a process hovering near a whole CPU does not flap;
- the host running more worker processes than it has CPUs (those without a CPU say so,
  taskline.affinity): free, so the kernel balances all of them (4 on 2 CPUs drained no-op jobs
  0.91x as fast with two pinned);
- its CPU crowded (idle under CROWDED_IDLE, other processes taking at least OTHERS_MIN of it)
  while another CPU it may use idles (at least TARGET_IDLE): it moves to the idlest CPU, with
  probability one half at each look, so that two crowded processes do not move together.
  Processes that do not share `auto`'s slot directory (separate containers) cannot see each
  other's CPUs and may be given the same one.

It looks four times a second from two cheap reads: the process's CPU time (`getrusage`) and
every CPU's idle time (`/proc/stat`, which in a container is the host's). A CPU kept busy by
everything together (a loaded host) moves nothing: no CPU is idle enough to be worth a move.
"""

from __future__ import annotations

import logging
import random
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from taskline import affinity
from taskline.service import Periodic

log = logging.getLogger(__name__)

PERIOD_S = 0.25
"""About how often the placement looks (each wait is drawn from 0.75 - 1.25 of it): a drain of
a few seconds is pinned within half a second of its start. A look costs tens of microseconds."""
BUSY_FROM = 0.2
"""The process's own CPU use, in CPUs, from which a free process is pinned ..."""
REPIN_BELOW = 0.8
"""... up to this ..."""
IDLE_BELOW = 0.1
"""... and below which a pinned one is freed (between the bands it stays as it is) ..."""
SATURATED = 0.9
"""... as from this, where its own threads may want more than one CPU."""
CROWDED_IDLE = 0.1
"""Its CPU is crowded when idle less than this share of the time ..."""
OTHERS_MIN = 0.25
"""... and other processes take at least this share of it."""
TARGET_IDLE = 0.5
"""A CPU worth moving to is idle at least this share of the time."""
MOVE_CHANCE = 0.5
"""The chance of moving at a look that finds the CPU crowded and a better one."""

STAY, PIN, FREE, MOVE = "stay", "pin", "free", "move"


@dataclass(frozen=True)
class Sample:
    """What one look reads: when (s), the process's CPU time (s) and, per CPU, its idle and
    total time (clock ticks since boot)."""

    at: float
    own_s: float
    cpus: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    action: str
    cpu: int | None = None


def read(stat: str = "/proc/stat") -> Sample:
    """This process's CPU time and every CPU's idle (idle + iowait) and total time, now."""
    usage = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where os.times has ticks
    cpus: dict[int, tuple[int, int]] = {}
    with open(stat, encoding="ascii") as lines:
        for line in lines:
            if not line.startswith("cpu") or not line[3].isdigit():
                continue
            name, *ticks = line.split()
            values = [int(t) for t in ticks[:8]]  # guest time is counted in user already
            cpus[int(name[3:])] = (values[3] + values[4], sum(values))
    return Sample(time.monotonic(), usage.ru_utime + usage.ru_stime, cpus)


def idle_shares(before: Sample, after: Sample) -> dict[int, float]:
    """Each CPU's idle share of the time between two samples."""
    shares = {}
    for cpu, (idle, total) in after.cpus.items():
        if cpu in before.cpus and total > before.cpus[cpu][1]:
            shares[cpu] = (idle - before.cpus[cpu][0]) / (total - before.cpus[cpu][1])
    return shares


def decide(before: Sample, after: Sample, cpu: int, allowed: set[int], coin: float, *,
           pinned: bool = True, oversubscribed: bool = False) -> Decision:
    """What a process given `cpu` (of `allowed`), pinned to it or free, should do, from two
    samples; `coin` is drawn from [0, 1) for a move's chance; `oversubscribed`: the host has
    more worker processes than CPUs (taskline.affinity), so none is pinned."""
    if oversubscribed:
        return Decision(FREE) if pinned else Decision(STAY)
    wall = after.at - before.at
    if wall <= 0:
        return Decision(STAY)
    own = (after.own_s - before.own_s) / wall
    if not pinned:
        return Decision(PIN) if BUSY_FROM <= own < REPIN_BELOW else Decision(STAY)
    if own < IDLE_BELOW or own >= SATURATED:
        return Decision(FREE)
    return _crowding(idle_shares(before, after), own, cpu, allowed, coin)


def _crowding(shares: dict[int, float], own: float, cpu: int, allowed: set[int],
              coin: float) -> Decision:
    idle = {c: share for c, share in shares.items() if c in allowed}
    mine = idle.get(cpu)
    if mine is None or mine >= CROWDED_IDLE or (1.0 - mine) - own < OTHERS_MIN:
        return Decision(STAY)
    target = max((c for c in idle if c != cpu), key=lambda c: (idle[c], -c), default=None)
    if target is None or idle[target] < TARGET_IDLE or coin >= MOVE_CHANCE:
        return Decision(STAY)
    return Decision(MOVE, target)


class Placement(Periodic):
    """Watches an `auto` worker process (`run(stop)`, from a thread of its own) and pins, frees
    or moves it as `decide` says; `on_change(cpus, change)` hears each change (`cpus` None:
    free)."""

    name = "placement"

    def __init__(self, cpu: int, allowed: set[int],
                 on_change: Callable[[list[int] | None, str], None], *,
                 sample: Callable[[], Sample] = read,
                 coin: Callable[[], float] = random.random,
                 oversubscribed: Callable[[], bool] = affinity.oversubscribed) -> None:
        super().__init__()
        self.cpu = cpu
        self.allowed = set(allowed)
        self.pinned = False  # a worker starts idle
        self._on_change = on_change
        self._sample = sample
        self._coin = coin
        self._oversubscribed = oversubscribed
        self._last: Sample | None = None

    @property
    def interval_s(self) -> float:
        return PERIOD_S * 1.25  # the longest wait: Periodic takes no wait above it

    def next_wait(self) -> float:
        return PERIOD_S * random.uniform(0.75, 1.25)  # apart from another crowded process

    def run_once(self) -> Decision:
        now = self._sample()
        last, self._last = self._last, now
        if last is None:
            return Decision(STAY)
        decision = decide(last, now, self.cpu, self.allowed, self._coin(), pinned=self.pinned)
        if (decision.action == PIN or (self.pinned and decision.action != FREE)) \
                and self._oversubscribed():  # read only when busy: a look stays cheap
            decision = decide(last, now, self.cpu, self.allowed, 0.0, pinned=self.pinned,
                              oversubscribed=True)
        self._apply(decision)
        return decision

    def _apply(self, decision: Decision) -> None:
        if decision.action == PIN:
            affinity.set_all({self.cpu})
            self.pinned = True
            self._on_change([self.cpu], PIN)
        elif decision.action == FREE:
            affinity.set_all(self.allowed)
            self.pinned = False
            self._on_change(None, FREE)
        elif decision.action == MOVE and decision.cpu is not None:
            affinity.move(decision.cpu)
            log.info("worker moved to a less busy CPU", extra={
                "action": "placement", "cpus": [decision.cpu], "from": self.cpu})
            self.cpu = decision.cpu
            self._last = None  # the next look measures the new CPU only
            self._on_change([decision.cpu], MOVE)
