"""`taskline audit verify` over large histories in `make bench`: wall time, CPU and peak memory
against the number of jobs, to show the audit linear in jobs and bounded in memory.

Invariant: the history audited is real. A template of TEMPLATE jobs is enqueued through the API
and run by a worker (leases, events and outcomes as production writes them, a few failing
into the DLQ); it is then copied in PostgreSQL, each copy with new job ids and its leases and
events rewired to them, until the database holds the size to audit. Each size is audited by
the real command in a process of its own (`taskline audit verify --json`), whose peak RSS and
CPU come from the kernel (wait4), and the audit must find no violation.

With `keep` the history lives in a private PostgreSQL cluster in a directory of its own that
outlives the run, so a large history is built once (`seed_only`, which may run beside other
work) and its audits timed later on an idle machine; a kept history only ever grows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cpu
import psycopg
import scenarios as sc
from stack import DB_NAME, Stack, wait_until

from taskline.localservers import PrivatePostgres
from taskline.store.queries import in_schema

TEMPLATE = 1000
COPY_BATCH = 100  # template copies per statement: 100,000 jobs
# A copy's id is a UUIDv7 as taskline.jobs.new_job_id makes them (leading 48 bits the Unix time
# in ms, version 7): later copies sort later and their rows lie where they were appended, as in
# a history the engine wrote. Random (v4) ids would scatter each page of the audit over the
# whole table, a layout production never has.
UUID7 = ("encode(set_byte(overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send("
         "(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 6, "
         "(get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112), 'hex')::uuid")


def _columns(stack: Stack, table: str, skip: tuple[str, ...], alias: str,
             shifted: bool) -> tuple[str, str]:
    """`table`'s columns but `skip`, and the values copying them from `alias` (each timestamp
    moved by the copy's `m.shift` when `shifted`)."""
    rows = [r for r in stack.sql(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        stack.schema, table) if r[0] not in skip]
    values = [f"{alias}.{name} + m.shift" if shifted and kind.startswith("timestamp")
              else f"{alias}.{name}" for name, kind in rows]
    return ", ".join(r[0] for r in rows), ", ".join(values)


def _copy_statement(stack: Stack, shifted: bool = False) -> str:
    """One statement writing `%(copies)s` copies of the `%(template)s` jobs with their leases
    and events. `shifted`: each copy's timestamps moved by `%(base)s + (g - 1) * %(step)s`
    seconds, g its number in the statement (bench/history.py spreads a history over time)."""
    jobs, jobs_v = _columns(stack, "jobs", ("id",), "j", shifted)
    leases, leases_v = _columns(stack, "job_leases", ("id", "job_id"), "l", shifted)
    events, events_v = _columns(stack, "job_events", ("id", "job_id"), "e", shifted)
    shift = ("make_interval(secs => %(base)s + (g - 1) * %(step)s) AS shift, "
             if shifted else "")
    return f"""
WITH m AS MATERIALIZED (
    SELECT old, {shift}{UUID7} AS new
    FROM (SELECT j.id AS old, g FROM taskline.jobs j CROSS JOIN generate_series(1, %(copies)s) g
          WHERE j.id = ANY(%(template)s::uuid[]) ORDER BY g, j.id) copies
), nj AS (
    INSERT INTO taskline.jobs (id, {jobs})
    SELECT m.new, {jobs_v} FROM m JOIN taskline.jobs j ON j.id = m.old ORDER BY m.new
), nl AS (
    INSERT INTO taskline.job_leases (job_id, {leases})
    SELECT m.new, {leases_v} FROM m JOIN taskline.job_leases l ON l.job_id = m.old
    ORDER BY m.new, l.id
)
INSERT INTO taskline.job_events (job_id, {events})
SELECT m.new, {events_v} FROM m JOIN taskline.job_events e ON e.job_id = m.old
ORDER BY m.new, e.id  -- a copy's events keep their order (the audit reads them by id)
"""


@contextmanager
def kept_stack(directory: Path, redis_url: str) -> Iterator[Stack]:
    """A stack whose PostgreSQL cluster lives in `directory` (made if absent) and is kept: it is
    stopped with a checkpoint, not killed, when the run ends."""
    pg = PrivatePostgres(directory / "pg")
    pg.init()
    pg.start()
    stack = Stack(pg.url(), redis_url)
    stack.private_postgres = True
    try:
        yield stack
    finally:
        stack.close_sql()
        pg.stop(timeout=600)


def _kept_template(stack: Stack) -> list[str] | None:
    """The template of a history already built: its jobs' UUIDv7 ids precede every copy's."""
    with psycopg.connect(stack.admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            (DB_NAME,)).fetchone():
            return None
    ids = [str(r[0]) for r in stack.sql(f"SELECT id FROM taskline.jobs ORDER BY id LIMIT "
                                        f"{TEMPLATE}")]
    return ids if len(ids) == TEMPLATE else None


def _template(stack: Stack) -> list[str]:
    """TEMPLATE jobs run to their end by a worker: 1 % dead after a retry, the rest succeeded."""
    sc._backlog(stack, TEMPLATE, failing_per_1000=10)
    with stack.workers(1, 16):
        wait_until(lambda: stack.count("succeeded", "dead") >= TEMPLATE, timeout=300,
                   interval=0.2)
    return [str(r[0]) for r in stack.sql("SELECT id FROM taskline.jobs")]


def _execute(stack: Stack, statement: str, params: dict[str, Any] | None = None) -> None:
    """A statement that returns no rows, on a connection of its own."""
    with psycopg.connect(stack.url, autocommit=True) as conn:
        conn.execute(in_schema(statement, stack.schema), params)


def _grow(stack: Stack, template: list[str], statement: str, jobs: int) -> float:
    """Copy the template until the database holds `jobs` jobs; the seconds it took."""
    started = time.monotonic()
    have = stack.count("succeeded", "dead")
    if have >= jobs:
        return 0.0
    while have < jobs:
        copies = min(COPY_BATCH, (jobs - have) // len(template))
        if copies < 1:
            break
        _execute(stack, statement, {"copies": copies, "template": template})
        have += copies * len(template)
    for table in ("jobs", "job_leases", "job_events"):  # what autovacuum does after inserts
        _execute(stack, f"VACUUM (ANALYZE) taskline.{table}")
    return time.monotonic() - started


def _postgres_cpu(postmaster: int) -> cpu.Probe:
    """The cluster's CPU: its live processes', and that of the backends that have exited (the
    postmaster reaped them, so it is in its children's time), such as the audit's own."""
    tree = cpu.tree_cpu([postmaster])

    def probe() -> float:
        with open(f"/proc/{postmaster}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return tree() + (int(fields[13]) + int(fields[14])) * cpu.TICK_S

    return probe


def _audit(stack: Stack) -> dict[str, Any]:
    """One `taskline audit verify --json`: wall seconds, CPU seconds (the command's, from the
    kernel; PostgreSQL's and the whole machine's, sampled), peak RSS and its report."""
    probe_map: dict[str, cpu.Probe] = {"machine": cpu.machine_cpu_s}
    postmaster = stack.postmaster_pid()
    if postmaster:
        probe_map["postgres"] = _postgres_cpu(postmaster)
    with cpu.sampled(probe_map) as sampler:
        started, wall_started = time.monotonic(), time.time()
        proc = subprocess.Popen([sys.executable, "-m", "taskline_cli.main", "audit", "verify",
                                 "--json"], env=stack.env(), stdout=subprocess.PIPE)
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s, wall_ended = time.monotonic() - started, time.time()
    proc.returncode = os.waitstatus_to_exitcode(status)
    report = json.loads(out)
    if proc.returncode != 0 or report["violations"]:
        raise RuntimeError(f"audit verify exited {proc.returncode}: {report['violations'][:3]}")
    first, last = sampler.at(wall_started), sampler.at(wall_ended)
    return {"jobs": report["jobs"], "wall_s": wall_s,
            "cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_mib": usage.ru_maxrss / 1024,
            **{f"{name}_cpu_s": last[name] - first[name] for name in probe_map}}


def scaling(stack: Stack, sizes: list[int], keep: list[Path] | None = None,
            seed_only: bool = False) -> dict[str, Any]:
    """The audit at each of `sizes` jobs (ascending) on one growing history, kept in `keep`
    when it names one directory; when it names one per size, each size's history is the one
    kept in its directory (snapshots of one growing history). `seed_only` builds without
    auditing. The linearity is the time per million at the largest size over the smallest's."""
    if not keep:
        return _linearity(_scaling(stack, sizes, seed_only))
    if len(keep) == 1:
        with kept_stack(keep[0], stack.redis_url) as kept:
            return _linearity(_scaling(kept, sizes, seed_only))
    runs = []
    for size, directory in zip(sizes, keep, strict=True):
        with kept_stack(directory, stack.redis_url) as kept:
            runs += _scaling(kept, [size], seed_only)
    return _linearity(runs)


def _linearity(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    if len(runs) > 1:
        out["linearity"] = runs[-1]["s_per_million"] / runs[0]["s_per_million"]
        print(f"audit_verify linearity (s per million at {runs[-1]['jobs']:,} / at "
              f"{runs[0]['jobs']:,}): {out['linearity']:.2f}", flush=True)
    return out


def _scaling(stack: Stack, sizes: list[int], seed_only: bool) -> list[dict[str, Any]]:
    template = _kept_template(stack) or _template(stack)
    statement = _copy_statement(stack)
    runs = []
    for size in sizes:
        seeded_s = _grow(stack, template, statement, size)
        print(f"audit_verify {size:>10,} jobs  built in {seeded_s:7.1f} s", flush=True)
        if seed_only:
            continue
        run = _audit(stack)
        run["s_per_million"] = run["wall_s"] / run["jobs"] * 1e6
        run["cpu_s_per_million"] = run["cpu_s"] / run["jobs"] * 1e6
        runs.append(run)
        print(f"audit_verify {run['jobs']:>10,} jobs  {run['wall_s']:7.1f} s wall  "
              f"{run['cpu_s']:7.1f} s CPU  {run['max_rss_mib']:6.0f} MiB peak  "
              f"{run['s_per_million']:5.1f} s per million  (PostgreSQL "
              f"{run.get('postgres_cpu_s', 0):.1f} s CPU, machine {run['machine_cpu_s']:.1f} s)",
              flush=True)
    return runs
