"""Pace: how many jobs a worker claims ahead of its free handler slots.

A slot that frees would otherwise wait a whole fetch and claim (a PostgreSQL commit, an fsync)
before its next handler starts: with short handlers that wait is a large share of every job.
Claiming ahead hides it, but a job claimed ahead waits in this worker while, perhaps, another
worker has a free slot: the more ahead, the longer a claimed job can sit (Celery's prefetch
problem). So the worker claims ahead about the slots expected to free while one claim is in
flight, from moving averages of claim latency and handler time, and none when that is under
half a slot. Handlers end independently of one another, so the slots that free during one
claim are a count that scatters around its mean (about as a Poisson count: standard deviation
the square root of the mean), and a budget of the mean alone leaves a thread waiting in one
claim in three or four: the budget is the mean plus SPREAD standard deviations, as a reorder
point covers the demand during a lead time. Handlers that run for seconds make it 0 (no job
waits), handlers of a few milliseconds make it a few.

While it claims ahead, a worker also claims in batches: a claim waits until `batch` slots are
free, and the slots are `batch - 1` higher, so the claim starts when as few jobs are left as
with claims of one job each. Without it, handlers that end one at a time (10 ms jobs on 8
slots) made a claim of 1.6 jobs on average: a fetch round trip, a claim statement and its
commit, and a wake-up of the fetch loop per job or so (docs/performance.md, change 104). The
batch is half the slots, and the budget ahead yields to it: handlers so short that more slots
free during one claim than a worker has (a Redis round trip) would otherwise fill the headroom
with jobs ahead and claim as each slot frees: a claim and a fetch-loop wake-up per 5.2 jobs of
a Redis round trip on 8 slots, where a batch of half the slots makes one per 6.5 (change 130).

Invariant: `ahead` is never above `concurrency` and is 0 until a handler has finished;
`ahead + batch - 1` is never above `concurrency` either, so a worker never holds more than
twice its slots claimed; while jobs are claimed ahead the batch is half of `concurrency` (at
least 1); a slow-job worker claims none ahead and as each slot frees, and an idle one finds
more free slots than a batch, so its claim never waits.
"""

from __future__ import annotations

import math
import threading

SMOOTHING = 0.1
"""Weight of each new sample in the moving averages: about the last 20 samples count."""
HALF_A_SLOT = 0.5
"""Below half a slot expected to free during a claim, nothing is claimed ahead."""
SPREAD = 2.0
"""Standard deviations of the slots freeing during a claim that the budget covers above their
mean (docs/performance.md, change 44, drains with the budget forced from 2 to 16)."""


class Pace:
    """Moving averages of claim latency and handler time; `ahead` is the claim-ahead budget."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._claim_s: float | None = None
        self._handler_s: float | None = None
        self._lock = threading.Lock()

    def claimed(self, seconds: float) -> None:
        """One fetch-and-claim round took `seconds` (sent to committed)."""
        with self._lock:
            self._claim_s = _average(self._claim_s, seconds)

    def finished(self, seconds: float) -> None:
        """One handler ran `seconds`."""
        with self._lock:
            self._handler_s = _average(self._handler_s, seconds)

    @property
    def ahead(self) -> int:
        """Jobs to hold claimed beyond the free slots: enough for the slots that free while
        one claim is in flight in all but a few claims, within the headroom the batch leaves
        (`concurrency - batch + 1`)."""
        claim_s, handler_s = self._claim_s, self._handler_s
        if claim_s is None or handler_s is None:
            return 0
        expected = claim_s * self.concurrency / max(handler_s, 1e-4)
        if expected < HALF_A_SLOT:
            return 0  # long handlers: a job claimed ahead would wait, and waiting costs little
        budget = math.ceil(expected + SPREAD * math.sqrt(expected))
        return min(budget, self.concurrency - self._half + 1)

    @property
    def batch(self) -> int:
        """The fewest jobs a claim waits for: half the slots while jobs are claimed ahead;
        otherwise 1 (claim as a slot frees)."""
        return self._half if self.ahead else 1

    @property
    def _half(self) -> int:
        return max(1, self.concurrency // 2)


def _average(current: float | None, sample: float) -> float:
    return sample if current is None else current + SMOOTHING * (sample - current)
