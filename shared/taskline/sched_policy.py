"""The kernel's scheduling policy of a worker process (TASKLINE_WORKER_SCHED): why `batch`.

A worker's threads hand the GIL and their jobs to one another thousands of times a second:
a fetch loop wakes handler threads for the jobs it claimed, a thread that sends on a socket
wakes one that waits for the GIL, a handler's outcome wakes the recorder. Under Linux's
default policy (SCHED_OTHER) a woken thread may preempt the thread that woke it: on a busy
core the waker is switched out while it still holds the GIL, the woken thread finds the GIL
taken and sleeps again, and the waker needs a switch of its own to go on. SCHED_BATCH is the
same fair scheduler without that wake-up preemption (the woken thread runs when the waker
blocks, or on an idle core, or at the next tick), the policy Linux names for "non-interactive,
CPU-bound" work, which a job worker is. With it, two workers of 8 threads switched 1.8 - 2.5x
less often involuntarily and spent less CPU per Redis round-trip job (docs/performance.md,
change 131). Other processes on the host are unaffected, except that they now preempt the
worker rather than the reverse, which is what an API on the same host wants.

`normal` is SCHED_OTHER. Any process may move itself to SCHED_BATCH (no capability is needed);
where the kernel has no such policy (not Linux), or refuses it, the worker runs as started.
"""

from __future__ import annotations

import os

from taskline.affinity import each_thread

BATCH = "batch"
NORMAL = "normal"
POLICIES = (BATCH, NORMAL)


def apply(policy: str) -> bool:
    """Put every thread of this process, and the threads it starts later (they inherit it),
    under `policy` (one of POLICIES); False when it could not be: no such policy here (not
    Linux), or the kernel refused (a seccomp profile may). The worker runs either way."""
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None or not hasattr(os, "sched_setscheduler"):
        return False
    target = batch if policy == BATCH else os.SCHED_OTHER
    try:
        each_thread(lambda tid: os.sched_setscheduler(tid, target, os.sched_param(0)))
    except PermissionError:
        return False
    return True


def current(tid: int = 0) -> str:
    """The policy of thread `tid` (0: the calling thread): `batch`, `normal` or another
    kernel policy's number (real-time, idle), as the kernel reports it."""
    if not hasattr(os, "sched_getscheduler"):
        return NORMAL
    found = os.sched_getscheduler(tid)
    if found == getattr(os, "SCHED_BATCH", None):
        return BATCH
    return NORMAL if found == os.SCHED_OTHER else str(found)
