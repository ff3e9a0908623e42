"""The history soak (`--only history_soak`): millions of jobs of history, retention on, a steady
flow of new jobs, and what keeping that history costs: table and index sizes over time,
autovacuum time, retention work and WAL per hour, and the enqueue and drain rates beside the
same measurements on an empty database.

How the history is made: a template of 1,000 jobs is run by a worker (bench/audit.py), then
copied in PostgreSQL until the database holds `jobs` of them, each copy's timestamps moved
into the past so that finish times are spread evenly over `span_s` = jobs / rate seconds,
oldest first. Its events and leases take ids from their sequences; on a schema whose history
tables are partitioned by id (migration 0021), each of `buckets` slices of the span is written
into a partition of its own, as `TASKLINE_HISTORY_PARTITION_S` = span / buckets would have
rolled them. The soak then sets every retention window to the age of the oldest copy (less 30
s), so the history expires at `rate` jobs a second from the soak's start while `rate` new jobs
a second arrive through the API and run: the kept set stays at `jobs`, as in a production
database whose retention window holds that many.

Autovacuum time comes from PostgreSQL's own log (`log_autovacuum_min_duration = 0` on the
benchmark's private cluster, whose initdb defaults run autovacuum): each run's "system usage"
line, summed per table (a partition counts as its table) over the judged window. The same
module drives an older checkout (`bench/run.py` of this tree run with the older tree's
virtualenv), so the old and the new schema are measured by one method.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import audit
import cpu
import psycopg
import scenarios as sc
from clients import Connection, post_concurrently
from stack import DB_NAME, Stack, wait_until

EMPTY_DB = DB_NAME + "_empty"
"""The empty database the rates are compared with, in the same cluster."""
ROOTS = re.compile(r"^(jobs|job_events|job_leases|dead_letter_jobs)(?:_p\d+(?:_k)?|_legacy|"
                   r"_default)?$")
AUTOVACUUM = re.compile(
    r"^(\S+ \S+) \S+ \[\d+\] LOG:  automatic (vacuum|analyze) of table \"([^\"]+)\""
    r".*?system usage: CPU: user: ([\d.]+) s, system: ([\d.]+) s, elapsed: ([\d.]+) s",
    re.MULTILINE | re.DOTALL)
EXPIRY_LEAD_S = 30.0
"""The oldest copy expires this long after the soak starts."""


def _partitioned(stack: Stack) -> bool:
    return bool(stack.sql(
        "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p JOIN pg_class c "
        "ON c.oid = p.partrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = 'job_events')", stack.schema)[0][0])


def _place(stack: Stack, k: int) -> None:
    """Point both history sequences at partition k, creating it as maintenance would."""
    from taskline.store.partitions import STORAGE, TABLES, WIDTH
    for table in TABLES:
        name = f"{stack.schema}.{table}_p{k}"
        exists = stack.sql("SELECT to_regclass(%s) IS NOT NULL", name)[0][0]
        if not exists:
            audit._execute(stack, f"CREATE TABLE {name} (LIKE taskline.{table} INCLUDING "
                                  f"DEFAULTS) WITH ({STORAGE})")
            audit._execute(stack, f"ALTER TABLE taskline.{table} ATTACH PARTITION {name} FOR "
                                  f"VALUES FROM ({k * WIDTH}) TO ({(k + 1) * WIDTH})")
        audit._execute(stack, f"SELECT setval(pg_get_serial_sequence('taskline.{table}', 'id'),"
                              f" {k * WIDTH}, false)")


def _first_free_partition(stack: Stack) -> int:
    from taskline.store.partitions import WIDTH
    bounds = stack.sql("SELECT max((regexp_match(c.relname, '_p(\\d+)$'))[1]::bigint) "
                       "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s)", f"{stack.schema}.job_events")[0][0]
    seq = stack.sql("SELECT nextval(pg_get_serial_sequence(%s, 'id'))",
                    f"{stack.schema}.job_events")[0][0]
    return max(int(bounds or 0), int(seq) // WIDTH) + 1


def build(stack: Stack, jobs: int, span_s: float, buckets: int) -> dict[str, Any]:
    """A database of `jobs` finished jobs whose finish times spread over the `span_s` seconds
    before now, oldest first (on a partitioned schema, `buckets` partitions of them)."""
    started = time.monotonic()
    stack.reset()
    template = audit._template(stack)
    statement = audit._copy_statement(stack, shifted=True)
    partitioned = _partitioned(stack)
    ref, now = stack.sql("SELECT extract(epoch FROM max(finished_at)), extract(epoch FROM now())"
                         " FROM taskline.jobs")[0]
    copies = max(jobs // len(template), buckets)
    step = span_s / copies
    k0 = _first_free_partition(stack) if partitioned else 0
    oldest = float(now) - span_s
    done = 0
    for b in range(buckets):
        if partitioned:
            _place(stack, k0 + b)
        last = copies if b == buckets - 1 else (b + 1) * copies // buckets
        while done < last:
            n = min(audit.COPY_BATCH, last - done)
            base = oldest + done * step - float(ref)
            audit._execute(stack, statement, {"base": base, "step": step, "copies": n,
                                              "template": template})
            done += n
        print(f"history_soak build: bucket {b + 1}/{buckets}, {done * len(template):,} jobs, "
              f"{time.monotonic() - started:.0f} s", flush=True)
    if partitioned:
        _place(stack, k0 + buckets)  # the soak's own rows start a partition of their own
    for table in ("jobs", "job_leases", "job_events"):  # what autovacuum does after inserts
        audit._execute(stack, f"VACUUM (ANALYZE) taskline.{table}")
    return {"jobs": done * len(template), "oldest_epoch": oldest, "span_s": span_s,
            "partitioned": partitioned, "buckets": buckets if partitioned else 0,
            "build_s": round(time.monotonic() - started, 1)}


def _stats(stack: Stack) -> dict[str, Any]:
    """One sample: history table sizes, rows deleted so far, WAL position, partitions."""
    tables = sc.table_sizes(stack)
    wal, queued = stack.sql("SELECT pg_current_wal_lsn() - '0/0', (SELECT count(*) FROM "
                            "taskline.jobs WHERE status = 'queued')")[0]
    parts = [r[0] for r in stack.sql(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = ANY(ARRAY[to_regclass(%s), to_regclass(%s)])",
        f"{stack.schema}.job_events", f"{stack.schema}.job_leases")]
    return {"tables": tables, "deleted": {t: v["deleted"] for t, v in tables.items()},
            "wal": int(wal),
            "queued": int(queued), "partitions": sorted(parts)}


def autovacuum(log: Path, start: int, end: int) -> dict[str, dict[str, float]]:
    """Autovacuum and autoanalyze runs logged between byte offsets `start` and `end`, per
    table (partitions under their table): runs, elapsed and CPU seconds."""
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode(errors="replace")
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for _, kind, name, user, system, elapsed in AUTOVACUUM.findall(text):
        rel = name.rsplit(".", 1)[-1]
        root = ROOTS.match(rel)
        row = out[f"{root.group(1) if root else 'other'} {kind}"]
        row["runs"] += 1
        row["elapsed_s"] += float(elapsed)
        row["cpu_s"] += float(user) + float(system)
    return {k: {n: round(v, 2) for n, v in row.items()} for k, row in out.items()}


def _per_hour(value: float, seconds: float) -> float:
    return round(value * 3600 / seconds, 1)


def soak(stack: Stack, built: dict[str, Any], rate: float, seconds: float, window_s: float,
         sample_s: float) -> dict[str, Any]:
    """`rate` jobs/s offered for `seconds` with every retention window at the history's age
    (api, maintenance, 2 workers); samples every `sample_s`; judged over the last `window_s`."""
    now = float(stack.sql("SELECT extract(epoch FROM now())")[0][0])
    window = now - built["oldest_epoch"] - EXPIRY_LEAD_S
    settings = {f"TASKLINE_RETAIN_{s}_S": str(int(window))
                for s in ("SUCCEEDED", "CANCELLED", "DEAD")}
    if built["partitioned"]:
        settings["TASKLINE_HISTORY_PARTITION_S"] = str(int(built["span_s"] / built["buckets"]))
    stack.extra_env.update(settings)
    log = stack.postgres_log
    samples: list[dict[str, Any]] = []
    try:
        with stack.api() as base, stack.process("maintenance") as maint, \
                stack.workers(2, sc.DRAIN_CONCURRENCY):
            sc.idle_workers(stack, 2)
            shares: list[dict[str, float]] = [{} for _ in range(sc.SOAK_PRODUCERS)]
            producers = [threading.Thread(target=sc._paced_producer, args=(
                base, rate / sc.SOAK_PRODUCERS, seconds, share, True, sc.SOAK_TICK_S))
                for share in shares]
            started = time.monotonic()
            for producer in producers:
                producer.start()
            maint_cpu = cpu.tree_cpu([maint.pid])
            while True:
                alive = [p for p in producers if p.is_alive()]
                sample = {"t": time.monotonic() - started, "maintenance_cpu_s": maint_cpu(),
                          "machine_cpu_s": cpu.machine_cpu_s(),
                          "log_offset": log.stat().st_size if log else 0, **_stats(stack)}
                samples.append(sample)
                _print(sample)
                if not alive:
                    break
                alive[0].join(sample_s)
            achieved = sum(s.get("achieved_jobs_per_s", 0) for s in shares)
            wait_until(lambda: stack.count("queued", "running") == 0, timeout=600, interval=1)
    finally:
        for name in settings:
            del stack.extra_env[name]
    return {"settings": settings, "offered_jobs_per_s": rate,
            "achieved_jobs_per_s": round(achieved, 1), "seconds": seconds,
            **_window(samples, window_s, log), "verdict": sc._judge(samples, window_s),
            "samples": samples}


def _print(sample: dict[str, Any]) -> None:
    cells = "  ".join(f"{t} {v['bytes'] / 2**20:8.1f} MiB dead {v['dead']:8d}"
                      for t, v in sample["tables"].items())
    print(f"  history soak t={sample['t']:6.0f}s  {cells}  queued {sample['queued']}  "
          f"partitions {len(sample['partitions'])}", flush=True)


def _window(samples: list[dict[str, Any]], window_s: float, log: Path | None) -> dict[str, Any]:
    """What the last `window_s` of samples cost, per hour."""
    last = samples[-1]
    first = next(s for s in samples if s["t"] >= last["t"] - window_s)
    span = last["t"] - first["t"]
    dropped = sorted(set().union(*(s["partitions"] for s in samples if s["t"] >= first["t"]))
                     - set(last["partitions"]))
    out: dict[str, Any] = {
        "window_s": round(span),
        "wal_mib_per_hour": _per_hour((last["wal"] - first["wal"]) / 2**20, span),
        "maintenance_cpu_s_per_hour": _per_hour(
            last["maintenance_cpu_s"] - first["maintenance_cpu_s"], span),
        "machine_cpu_s_per_hour": _per_hour(last["machine_cpu_s"] - first["machine_cpu_s"],
                                            span),
        "rows_deleted_per_hour": {t: _per_hour(last["deleted"].get(t, 0)
                                               - first["deleted"].get(t, 0), span)
                                  for t in last["deleted"]},
        "partitions_dropped": dropped,
        "sizes_mib": {t: [round(s["tables"][t]["bytes"] / 2**20, 1) for s in samples
                          if s["t"] >= first["t"]] for t in last["tables"]},
    }
    if log:
        runs = autovacuum(log, first["log_offset"], last["log_offset"])
        out["autovacuum_per_hour"] = {
            k: {"runs": _per_hour(v["runs"], span), "elapsed_s": _per_hour(v["elapsed_s"], span),
                "cpu_s": _per_hour(v["cpu_s"], span)} for k, v in sorted(runs.items())}
    return out


def _drain_probe(stack: Stack, jobs: int) -> float:
    """Jobs/s of 2 workers draining `jobs` no-op jobs enqueued now (their ids known, so a
    large history is not read to find them)."""
    ids: list[str] = []
    body = ('{"jobs": [' + ",".join(['{"type": "bench.noop", "payload": {}}'] * 1000)
            + "]}").encode()
    with stack.api() as base:
        conn = Connection(base)
        for _ in range(jobs // 1000):
            ids += [item["job"]["id"] for item in conn.post("/api/v1/jobs/batch", body)["jobs"]]
        conn.close()
    done = "SELECT count(*) FROM taskline.jobs WHERE id = ANY(%s::uuid[]) AND status = 'succeeded'"
    with stack.workers(2, sc.DRAIN_CONCURRENCY):
        wait_until(lambda: stack.sql(done, ids)[0][0] >= len(ids), timeout=600, interval=0.1)
    first, last = stack.sql(
        "SELECT (SELECT min(leased_at) FROM taskline.job_leases WHERE job_id = ANY(%s::uuid[])),"
        " (SELECT max(updated_at) FROM taskline.jobs WHERE id = ANY(%s::uuid[]))", ids, ids)[0]
    return len(ids) / (last - first).total_seconds()


def _enqueue_probe(stack: Stack, jobs: int) -> float:
    """Jobs/s of 8 clients' single enqueues (no reset: the database as it is)."""
    with stack.api() as base:
        seconds = post_concurrently(base, "/api/v1/jobs", sc.NOOP, jobs, 8, warmup=20)
    return jobs / seconds


def rate_pairs(stack: Stack, jobs: int, pairs: int) -> dict[str, Any]:
    """Interleaved pairs on the soaked database and on an empty one in the same cluster: the
    2-worker drain and 8 clients' single enqueues, ratio full / empty (above 1: faster full)."""
    stack.db_name = EMPTY_DB
    stack.reset()
    runs: dict[str, dict[str, list[float]]] = {db: defaultdict(list) for db in (DB_NAME, EMPTY_DB)}
    try:
        for i in range(pairs):
            for db in ((DB_NAME, EMPTY_DB) if i % 2 == 0 else (EMPTY_DB, DB_NAME)):
                stack.close_sql()
                stack.db_name = db
                stack.redis.flushdb()
                runs[db]["drain_2_workers"].append(_drain_probe(stack, jobs))
                runs[db]["enqueue_single_8_clients"].append(_enqueue_probe(stack, jobs))
                # The enqueued jobs are not run: drop them so the next drain is the probe's.
                stack.sql("WITH d AS (DELETE FROM taskline.jobs WHERE status = 'queued' "
                          "RETURNING 1) SELECT count(*) FROM d")
            print(f"history_soak rates pair {i + 1}: " + "  ".join(
                f"{m} {runs[DB_NAME][m][-1] / runs[EMPTY_DB][m][-1]:.3f}"
                for m in runs[DB_NAME]), flush=True)
    finally:
        stack.close_sql()
        stack.db_name = DB_NAME
    out: dict[str, Any] = {}
    for metric in runs[DB_NAME]:
        ratios = [f / e for f, e in zip(runs[DB_NAME][metric], runs[EMPTY_DB][metric],
                                        strict=True)]
        out[metric] = {"full": runs[DB_NAME][metric], "empty": runs[EMPTY_DB][metric],
                       "ratio_median": round(statistics.median(ratios), 3),
                       "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}
    return out


MIGRATION_PRODUCERS = 4
MIGRATION_RATE = 200.0
"""Single enqueues a second offered while the migration runs (each timed)."""


def _timed_producer(base: str, rate: float, stop: threading.Event,
                    out: list[tuple[float, float, str]]) -> None:
    """Single enqueues at `rate` a second on an absolute schedule until `stop`: (sent at,
    seconds to the 201, job id) each."""
    conn = Connection(base)
    body = b'{"type": "bench.noop", "payload": {}}'
    start = time.perf_counter()
    i = 0
    while not stop.is_set():
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent = time.time()
        t0 = time.perf_counter()
        job = conn.post("/api/v1/jobs", body)
        out.append((sent, time.perf_counter() - t0, job["id"]))
        i += 1
    conn.close()


def migrate_under_load(stack: Stack, python: str, settle_s: float = 20.0) -> dict[str, Any]:
    """`taskline migrate` of the checkout whose interpreter is `python` over this database
    while this checkout's api, maintenance and 2 workers serve MIGRATION_RATE single
    enqueues a second: every enqueue's latency, the migration's time, then the fault
    checker's per-job rules over every job acknowledged (bench/history_check.py, run with
    `python`)."""
    stop = threading.Event()
    with stack.api() as base, stack.process("maintenance"), \
            stack.workers(2, sc.DRAIN_CONCURRENCY):
        sc.idle_workers(stack, 2)
        outs: list[list[tuple[float, float, str]]] = [[] for _ in range(MIGRATION_PRODUCERS)]
        producers = [threading.Thread(target=_timed_producer, args=(
            base, MIGRATION_RATE / MIGRATION_PRODUCERS, stop, out)) for out in outs]
        for producer in producers:
            producer.start()
        time.sleep(settle_s)
        began = time.time()
        done = subprocess.run([python, "-m", "taskline_cli.main", "migrate"], env=stack.env(),
                              capture_output=True, text=True)
        ended = time.time()
        time.sleep(settle_s)
        stop.set()
        for producer in producers:
            producer.join()
        latencies = [x for out in outs for x in out]
        ids = [x[2] for x in latencies]
        finished = ("SELECT count(*) FROM taskline.jobs WHERE id = ANY(%s::uuid[]) "
                    "AND status IN ('succeeded', 'dead', 'cancelled')")
        wait_until(lambda: stack.sql(finished, ids)[0][0] >= len(ids), timeout=300, interval=1)
    during = [lat for sent, lat, _ in latencies if began <= sent <= ended]
    with tempfile.NamedTemporaryFile("w", suffix=".ids") as f:
        f.write("\n".join(ids))
        f.flush()
        checked = subprocess.run([python, str(Path(__file__).with_name("history_check.py")),
                                  stack.url, f.name], capture_output=True, text=True, check=True)
    out = {"migrate_rc": done.returncode, "migrate_s": round(ended - began, 1),
           "migrate_output": (done.stdout + done.stderr)[-2000:],
           "enqueues": len(latencies), "enqueues_during": len(during),
           "enqueue_max_s": round(max(x[1] for x in latencies), 3),
           "enqueue_max_during_s": round(max(during, default=0.0), 3),
           "enqueue_p99_during_s": round(sc.percentile(during, 99), 3) if during else None,
           "check": json.loads(checked.stdout)}
    print(f"history_soak migration: rc {out['migrate_rc']} in {out['migrate_s']} s; "
          f"{out['enqueues_during']} enqueues during it, max {out['enqueue_max_during_s']} s, "
          f"p99 {out['enqueue_p99_during_s']} s; check {out['check']}", flush=True)
    return out


def run(stack: Stack, jobs: int, rate: float, buckets: int, seconds: float, window_s: float,
        sample_s: float, pairs: int, migrate_with: str = "") -> dict[str, Any]:
    """Build, soak, then the rate pairs; with `migrate_with` (a newer checkout's interpreter)
    then the migration to its schema under load. Each part printed as it ends."""
    if not stack.private_postgres or stack.postgres_log is None:
        raise RuntimeError("history_soak needs the benchmark's private PostgreSQL (its log)")
    with psycopg.connect(stack.admin_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_autovacuum_min_duration = 0")
        conn.execute("SELECT pg_reload_conf()")
    built = build(stack, jobs, jobs / rate, buckets)
    print(f"history_soak built {built['jobs']:,} jobs in {built['build_s']:.0f} s "
          f"(partitioned: {built['partitioned']})", flush=True)
    result = soak(stack, built, rate, seconds, window_s, sample_s)
    for key in ("achieved_jobs_per_s", "wal_mib_per_hour", "maintenance_cpu_s_per_hour",
                "rows_deleted_per_hour", "partitions_dropped", "autovacuum_per_hour",
                "verdict"):
        print(f"history_soak {key}: {result.get(key)}", flush=True)
    result["rates"] = rate_pairs(stack, 4000, pairs)
    for metric, value in result["rates"].items():
        print(f"history_soak rate {metric} full/empty median {value['ratio_median']} "
              f"({value['ratio_min']} - {value['ratio_max']})", flush=True)
    if migrate_with:
        result["migration"] = migrate_under_load(stack, migrate_with)
    return {"built": built, **result}


def main() -> int:
    """`python bench/history.py`: the soak alone, with whichever checkout's code the
    interpreter's virtualenv holds (an older one too: this module imports only what it has)."""
    import argparse
    import json

    from stack import open_stack
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--buckets", type=int, default=40)
    parser.add_argument("--soak-s", type=float, default=1500.0)
    parser.add_argument("--window-s", type=float, default=1200.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--migrate-with", default="",
                        help="after the soak, `taskline migrate` with this interpreter (a newer "
                             "checkout's) under load, and check the jobs enqueued meanwhile")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with open_stack(shared_postgres=False) as stack:
        result = run(stack, args.jobs, args.rate, args.buckets, args.soak_s, args.window_s,
                     args.sample_s, args.pairs, args.migrate_with)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
