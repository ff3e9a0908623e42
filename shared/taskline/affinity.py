"""Pinning a process to CPUs (TASKLINE_WORKER_CPUS, `auto` by default): why, and how `auto`
spreads processes.

A worker process runs Python on one core at a time (the GIL), yet its threads hand the GIL and
their jobs to one another thousands of times a second. Spread over several cores, each hand-off
wakes a thread on another core (an inter-processor interrupt, on a VM an exit to the
hypervisor) and moves the data it touches between caches; on one core, the same hand-offs are
a local switch. Pinned, two workers of 8 slots spent 10 - 14 % less CPU per Redis round-trip
job on an Intel Xeon VM (their handler threads 17 - 22 % less) and drained 6 - 14 % faster,
and 25 % less on an AMD EPYC VM, draining 24 % faster (docs/performance.md, changes 120 and
125). What pinning gives up is the other cores for the system-call side of its I/O,
which is small for a job engine's worker.

`auto` gives each worker process one CPU of those it may use, a different one for each process
on the host while CPUs last; with more worker processes than CPUs none is pinned (the ones left
without a CPU hold spare slots, `oversubscribed`), since busy processes pinned to CPUs cannot be
balanced with the others by the kernel (4 worker processes on 2 CPUs drained no-op jobs 0.83x
as fast pinned two to a CPU: docs/performance.md, change 132). Each process holds an
advisory lock (flock) on one slot file per CPU in a directory of the user's under the temporary
directory, which the kernel releases when the process ends, so a restarted worker finds its CPU
free again. Processes that do not share that directory (separate containers)
cannot see each other's locks: each then starts from a random CPU. taskline.placement then keeps
a worker pinned to its CPU only while it is busy and not saturated, and moves it off a CPU it
finds crowded while another idles. `none` (or an empty value) leaves the kernel to place the
process's threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from taskline.errors import ConfigError

AUTO = "auto"
NONE = "none"
SPARES = 64
"""Worker processes beyond the CPUs that `oversubscribed` can see."""
_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
_held: list[int] = []
"""File descriptors of the slot locks this process holds (kept open for its lifetime)."""


def valid(spec: str) -> bool:
    """Whether `spec` is empty, `auto`, `none` or a CPU list (`3`, `0,2`, `0-3,6`)."""
    return spec in ("", AUTO, NONE) or (_LIST.fullmatch(spec) is not None
                                  and all(lo <= hi for lo, hi in _ranges(spec)))


def parse(spec: str) -> set[int]:
    """The CPUs of a list like `0-3,6`."""
    return {cpu for lo, hi in _ranges(spec) for cpu in range(lo, hi + 1)}


def pin(spec: str) -> set[int] | None:
    """Pin every thread of this process, and the threads it starts later, to the CPUs of the
    list `spec`; None when `spec` is empty, `none` or `auto` (whose CPU `assign` gives and
    taskline.placement pins while busy). ConfigError when the list cannot be pinned."""
    if spec in ("", NONE, AUTO):
        return None
    if not supported():
        raise ConfigError("TASKLINE_WORKER_CPUS needs Linux (os.sched_setaffinity)")
    allowed = os.sched_getaffinity(0)
    cpus = parse(spec)
    if not cpus <= allowed:
        raise ConfigError(f"TASKLINE_WORKER_CPUS={spec!r}: CPUs {_text(cpus - allowed)} "
                          f"are not among this process's CPUs ({_text(allowed)})")
    set_all(cpus)
    return cpus


def assign(*, slots_dir: Path | None = None) -> int | None:
    """`auto`'s CPU for this process: one no other process of the host holds, its slot held
    until the process ends; None when every CPU it may use is held, or it cannot pin (not
    Linux). Nothing is pinned here. A process left without a CPU holds a spare slot instead,
    which tells the others that the host has more worker processes than CPUs (`oversubscribed`)."""
    if not supported():
        return None
    slots_dir = slots_dir or default_slots_dir()
    slot = claim_slot(sorted(os.sched_getaffinity(0)), slots_dir)  # makes the directory
    if slot is None:
        spare = _lock_first([slots_dir / f"spare-{n}.lock" for n in range(SPARES)])
        if spare is not None:
            _held.append(spare[1])
        return None
    _held.append(slot[1])
    return slot[0]


def oversubscribed(*, slots_dir: Path | None = None) -> bool:
    """Whether a worker process of this host (sharing the slots' directory) was left without a
    CPU: then none should be pinned, since busy processes pinned to CPUs cannot be balanced
    with the others by the kernel (4 worker processes on 2 CPUs drained no-op jobs 0.91x as
    fast with two of them pinned; docs/performance.md, change 132)."""
    try:
        spares = [Path(e.path) for e in os.scandir(slots_dir or default_slots_dir())
                  if e.name.startswith("spare-")]
    except OSError:
        return False
    for path in spares:
        spare = _lock_first([path])
        if spare is None:
            return True  # held by a process without a CPU
        os.close(spare[1])
    return False


def move(cpu: int, *, slots_dir: Path | None = None) -> None:
    """Pin every thread of this `auto`-pinned process to `cpu` instead, trading its slot for
    one of `cpu`'s where one is free (taskline.placement; slots are advisory, so it moves
    either way)."""
    release_slots()
    slot = claim_slot([cpu], slots_dir or default_slots_dir())
    if slot is not None:
        _held.append(slot[1])
    set_all({cpu})


def set_all(cpus: set[int]) -> None:
    """Set the affinity of every thread of this process to `cpus`."""
    each_thread(lambda tid: os.sched_setaffinity(tid, cpus))


def each_thread(fn: Callable[[int], object]) -> None:
    """`fn(tid)` for every thread of this process, then for any a thread started meanwhile (it
    inherited its creator's settings, which may not have been set yet); a thread that ended
    since the list was read is skipped, any other error raised."""
    done: set[int] = set()
    while True:
        pending = [tid for tid in threads() if tid not in done]
        if not pending:
            return
        for tid in pending:
            with contextlib.suppress(ProcessLookupError):
                fn(tid)
            done.add(tid)


def release_slots() -> None:
    while _held:
        os.close(_held.pop())


def claim_slot(cpus: list[int], slots_dir: Path) -> tuple[int, int] | None:
    """The CPU of the first free slot, trying the CPUs from a random one on, and the
    descriptor holding its lock (until it is closed, or the process ends). None when every
    slot is taken."""
    slots_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    start = random.randrange(len(cpus))
    order = cpus[start:] + cpus[:start]
    # `-0`: the first round's name, which releases that spread several processes per CPU also
    # lock: both see each other through a rolling deploy.
    taken = _lock_first([slots_dir / f"cpu{cpu}-0.lock" for cpu in order])
    return None if taken is None else (order[taken[0]], taken[1])


def _lock_first(paths: list[Path]) -> tuple[int, int] | None:
    """(index, descriptor) of the first of `paths` this call could lock, held; None if all are
    held by others."""
    for index, path in enumerate(paths):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return index, fd
    return None


def supported() -> bool:
    """Whether this platform can pin a process (Linux)."""
    return hasattr(os, "sched_setaffinity")


def allowed_cpus() -> set[int]:
    """The CPUs this thread may run on (empty where that cannot be read)."""
    return os.sched_getaffinity(0) if supported() else set()


def allowed() -> int:
    """How many CPUs this thread may run on (for a pinned worker, every thread's)."""
    return len(allowed_cpus()) or os.cpu_count() or 1


def default_slots_dir() -> Path:
    """Where `auto`'s slot files are: one directory per user under the temporary directory."""
    return Path(tempfile.gettempdir()) / f"taskline-cpus-{os.getuid()}"


def threads() -> Iterable[int]:
    """This process's thread ids (0, the calling thread, where /proc cannot be read)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _ranges(spec: str) -> list[tuple[int, int]]:
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def _text(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))
