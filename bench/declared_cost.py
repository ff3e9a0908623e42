"""What a declared job type costs per job, in one process: the worker's call (`Handler.run`,
which validates the payload into its type) and the API's check of the payload against the
type's JSON Schema, each declared and undeclared, hot and cold.

Hot: best of 7 rounds of 100,000 calls. Cold: each call after 64 MiB were written through, so
that the CPU caches hold none of the validator, as on an idle worker between jobs (the idle
pickup); median and p90 of 300 calls, declared and undeclared interleaved. The payload is `{}`
into a one-field dataclass, as in bench/benchjobs.py's declared no-op jobs.

Usage: python bench/declared_cost.py (the taskline it imports is the running virtualenv's)
"""

from __future__ import annotations

import statistics
import sys
import time
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchjobs import Empty  # the declared no-op jobs' payload type
from jsonschema import Draft202012Validator

from taskline.handlers import registry
from taskline.handlers.payloads import PayloadModel
from taskline_producer.operations.declared import _payload_errors

_JUNK = bytearray(64 << 20)
_LINES = [bytes([n]) * (len(_JUNK) // 64) for n in (0, 1)]


def _thrash() -> None:
    """One byte written in every 64-byte line of 64 MiB (alternating values, so each pass
    writes)."""
    _LINES.reverse()
    _JUNK[::64] = _LINES[0]


def hot_us(call: Callable[[], Any]) -> float:
    return min(timeit.repeat(call, number=100_000, repeat=7)) / 100_000 * 1e6


def cold_us(calls: dict[str, Callable[[], Any]], rounds: int = 300) -> dict[str, list[float]]:
    took: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            _thrash()
            start = time.perf_counter_ns()
            call()
            took[name].append((time.perf_counter_ns() - start) / 1000)
    return took


def main() -> int:
    ctx = registry.JobContext(job_id=uuid.uuid4(), attempt=1, queue="default",
                              type="cost.declared", worker_id="cost")
    plain = registry.handler("cost.plain")(lambda payload, ctx: None)
    declared = registry.handler("cost.declared", payload=Empty)(lambda payload, ctx: None)
    checked = [Draft202012Validator(PayloadModel(Empty).schema)]  # as the API compiles it
    calls = {"worker, undeclared": lambda: plain.run({}, ctx),
             "worker, declared": lambda: declared.run({}, ctx),
             "API check, declared": lambda: _payload_errors(checked, {}, "payload")}
    cold = cold_us(calls)
    for name, call in calls.items():
        kept = sorted(cold[name])
        print(f"{name:22s} hot {hot_us(call):6.2f} us   cold median "
              f"{statistics.median(kept):6.1f} us, p90 {kept[int(len(kept) * 0.9)]:6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
