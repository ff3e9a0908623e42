"""Schedules at load: N schedules firing every second, one maintenance process leading.

Usage: python bench/schedules.py [--schedules 100] [--seconds 60]

On the benchmark's stack (bench/stack.py: a private PostgreSQL with fsync on, the benchmark's
Redis DB), `--schedules` schedules of `* * * * * *` are written, then one `taskline
maintenance` runs for `--seconds`. Every slot from one second after its start to one second
before its stop is owed a job (the scheduler fires every slot while it leads); the figures are
the owed slots, the jobs made for them (one per slot: never fewer, never two), and the lag of
their jobs (the job row's creation minus its slot), in ms. No worker runs, so the jobs only
accumulate as queued.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import quantiles
from stack import Stack, open_stack, wait_until

JOB = '{"type": "bench.noop", "payload": {}, "queue": "sched", "priority": 5, ' \
      '"max_retries": 0, "timeout_s": 30.0}'


def run(stack: Stack, schedules: int, seconds: float) -> dict[str, object]:
    stack.reset()
    stack.sql("INSERT INTO taskline.schedules (name, cron, timezone, job, paused, catch_up, "
              "since) SELECT 'every-second-' || lpad(i::text, 4, '0'), '* * * * * *', 'UTC', "
              "%s::jsonb, false, 'none', now() FROM generate_series(1, %s) AS i RETURNING 1",
              JOB, schedules)
    with stack.process("maintenance", "--metrics-port", "0"):
        wait_until(lambda: stack.sql("SELECT count(*) FROM taskline.jobs")[0][0] > 0,
                   timeout=60)
        (start,) = stack.sql("SELECT now()")[0]
        time.sleep(seconds)
        (stop,) = stack.sql("SELECT now()")[0]
        time.sleep(5)  # the slots up to `stop` are fired within this
    rows = stack.sql(
        "SELECT count(*), count(DISTINCT (schedule, scheduled_for)), "
        "array_agg(extract(epoch FROM created_at - scheduled_for) * 1000) "
        "FROM taskline.jobs WHERE scheduled_for > date_trunc('second', %s::timestamptz) "
        "  AND scheduled_for <= date_trunc('second', %s::timestamptz)", start, stop)
    jobs, distinct, lags = rows[0]
    owed = schedules * int((stop.replace(microsecond=0) - start.replace(microsecond=0))
                           .total_seconds())
    return {"schedules": schedules, "owed_slots": owed, "jobs": jobs,
            "distinct_slots": distinct, "every_slot_once": jobs == distinct == owed,
            "lag_ms": quantiles([float(x) for x in lags or [0.0]])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--shared-postgres", action="store_true")
    args = parser.parse_args()
    with open_stack(args.shared_postgres) as stack:
        print(json.dumps(run(stack, args.schedules, args.seconds), indent=1))


if __name__ == "__main__":
    main()
