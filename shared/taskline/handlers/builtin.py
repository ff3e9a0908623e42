"""Built-in handlers: `echo`, `simulate` and `report`; `webhook` lives in its own module.

Each one is pure computation on its payload, so a retry or a re-run after a lost lease repeats
the same work and returns the same result (`report` draws its generated data from a seeded
generator for that reason).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from typing import Any

from taskline.errors import JobCancelled, NonRetryableError
from taskline.handlers.registry import JobContext, handler


@handler("echo")
def echo(payload: Any, ctx: JobContext) -> Any:
    """Return the payload unchanged."""
    return payload


@handler("simulate")
def simulate(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Sleep and/or burn CPU, and fail on demand, so demos and tests get any job they need.

    Parameters: sleep_s, cpu_ms, fail_rate (0..1), fail_first (fail attempts 1..N),
    error (the message), non_retryable (fail permanently).
    """
    params = payload if isinstance(payload, dict) else {}
    _sleep(float(params.get("sleep_s", 0) or 0), ctx)
    _burn_cpu(float(params.get("cpu_ms", 0) or 0), ctx)
    if ctx.stopping:
        # Cut short by cancel, timeout, lost lease or shutdown: the work did not finish.
        raise JobCancelled("stopped before the simulated work finished")
    message = str(params.get("error") or "simulated failure")
    failing = ctx.attempt <= int(params.get("fail_first", 0) or 0)
    failing = failing or random.random() < float(params.get("fail_rate", 0) or 0)
    if failing:
        if params.get("non_retryable"):
            raise NonRetryableError(message)
        raise RuntimeError(message)
    return {"attempt": ctx.attempt}


def _sleep(seconds: float, ctx: JobContext) -> None:
    # Waiting on the stop event instead of time.sleep lets cancel and shutdown interrupt it.
    if seconds > 0:
        ctx.stop_event.wait(seconds)


def _burn_cpu(milliseconds: float, ctx: JobContext) -> None:
    deadline = time.perf_counter() + milliseconds / 1000
    while time.perf_counter() < deadline and not ctx.stopping:
        sum(i * i for i in range(1000))


# `report` bounds: a default run takes milliseconds; the largest a few seconds of one core.
REPORT_DEFAULT_SIZE = 10_000
REPORT_MAX_SIZE = 2_000_000
REPORT_MAX_GROUPS = 1_000
_REPORT_CHUNK = 10_000  # rows between two looks at ctx.stopping
_QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


@handler("report")
def report(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Aggregate a data set into a summary per group and a ranking of the groups by total.

    Data: `data`, a list of numbers or of {"group": name, "value": number} objects; or, when
    absent, `size` rows (default 10,000, at most 2,000,000) generated from `seed` (default 0,
    same seed same data) over `groups` groups (default 10, at most 1,000). `top` (default 5)
    is how many groups the ranking names. The result: `rows`, `groups` (per group count, sum,
    mean, stdev, min, max, p50, p90, p99), `top` and `elapsed_ms`. A malformed payload fails
    the job without retries; a stop request (cancel, timeout, shutdown) ends it between chunks.
    """
    params = payload if isinstance(payload, dict) else {}
    started = time.perf_counter()
    columns = _group_values(_report_rows(params), ctx)
    if ctx.stopping:
        raise JobCancelled("stopped before the report was complete")
    summary = {name: _summarise(values) for name, values in sorted(columns.items())}
    top = _bounded_int(params, "top", 5, 0, REPORT_MAX_GROUPS)
    ranking = sorted(summary, key=lambda name: (-summary[name]["sum"], name))[:top]
    return {"rows": sum(len(v) for v in columns.values()), "groups": summary, "top": ranking,
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 3)}


def _report_rows(params: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """(group, value) pairs: the given `data`, or `size` seeded random rows."""
    if "data" in params:
        return _given_rows(params["data"])
    size = _bounded_int(params, "size", REPORT_DEFAULT_SIZE, 0, REPORT_MAX_SIZE)
    groups = _bounded_int(params, "groups", 10, 1, REPORT_MAX_GROUPS)
    seed = params.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, (int, str)):
        raise NonRetryableError("report: `seed` must be an integer or a string")
    return _generated_rows(size, groups, random.Random(seed))


def _generated_rows(size: int, groups: int, rng: random.Random) -> Iterator[tuple[str, float]]:
    # Log-normal amounts (like order totals), with each group's median a little higher than
    # the one before, so the ranking and the quantiles have something to show.
    names = [f"g{i:03d}" for i in range(groups)]
    for _ in range(size):
        index = rng.randrange(groups)
        yield names[index], round(rng.lognormvariate(3.0 + index * 0.05, 0.8), 2)


def _given_rows(data: Any) -> Iterator[tuple[str, float]]:
    if not isinstance(data, list):
        raise NonRetryableError("report: `data` must be a list of numbers or of "
                                "{\"group\": ..., \"value\": ...} objects")
    for index, item in enumerate(data):
        group, value = (item.get("group", "all"), item.get("value")) \
            if isinstance(item, dict) else ("all", item)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise NonRetryableError(f"report: data[{index}] has no finite numeric value")
        yield str(group), float(value)


def _group_values(rows: Iterator[tuple[str, float]], ctx: JobContext) -> dict[str, list[float]]:
    """The values of each group; stops early (partial columns) once `ctx.stopping` is set."""
    columns: dict[str, list[float]] = {}
    for count, (group, value) in enumerate(rows, start=1):
        columns.setdefault(group, []).append(value)
        if count % _REPORT_CHUNK == 0 and ctx.stopping:
            break
    return columns


def _summarise(values: list[float]) -> dict[str, float]:
    """Count, sum, mean, population standard deviation, extremes and nearest-rank quantiles."""
    ordered = sorted(values)
    count = len(ordered)
    total = math.fsum(ordered)
    mean = total / count
    variance = math.fsum((v - mean) ** 2 for v in ordered) / count
    summary = {"count": count, "sum": round(total, 2), "mean": round(mean, 4),
               "stdev": round(math.sqrt(variance), 4), "min": ordered[0], "max": ordered[-1]}
    for name, q in _QUANTILES:
        summary[name] = ordered[max(0, math.ceil(q * count) - 1)]
    return summary


def _bounded_int(params: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise NonRetryableError(f"report: `{name}` must be an integer in {low}..{high}")
    return value
