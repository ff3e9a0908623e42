"""`python bench/library_pairs.py --before DIR --after DIR`: interleaved pairs of the library's
single enqueue, `taskline.enqueue(conn, ...)` inside the caller's transaction, between two
checkouts.

bench/pairs.py drives each checkout's own bench/run.py, which an older checkout may lack the
scenario for (or import modules since moved); this runner needs only what the library has made
public since it had an in-transaction enqueue: `taskline.enqueue(conn, type)` on a psycopg
`Connection` and on a SQLAlchemy `Connection`. Each run of a side is this script started with
that checkout's virtualenv (`<tree>/.venv/bin/python`, so it imports that checkout's taskline)
in a producer mode, against a fresh database migrated by that checkout's own `taskline
migrate`, dropped afterwards. The producer enqueues `--warmup` jobs, then `--jobs` jobs one per
transaction (`with conn.transaction():` on psycopg, `with conn.begin():` on SQLAlchemy, both on
the psycopg 3 driver), or with `--batch N` N to a transaction through `taskline.enqueue_many`,
and reports jobs/s, its own CPU per job (user and system, `time.process_time`) and its
PostgreSQL backend's (/proc). No maintenance runs: the jobs stay owed to Redis in the outbox,
the same on both sides. Pairs alternate which side runs first.

Usage: python bench/library_pairs.py --before DIR --after DIR [--pairs 7] [--jobs 3000]
           [--warmup 200] [--batch 1] [--out bench-results/library_pairs.json] [--opcodes N]
`--opcodes N` times nothing: each side counts the Python bytecode instructions of N calls per
kind of connection (after `--warmup`), per call, a count the machine's load does not move.
Ratios are after / before for jobs/s and before / after for CPU, so above 1 is better in every
row. Environment: BENCH_DATABASE_URL (an admin connection; default the local server as root).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opcodes import count_opcodes
from pairs import alternating, compared, report

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgresql://root@127.0.0.1:5432/postgres")
NOOP = "bench.noop"
KINDS = ("psycopg", "sqlalchemy")


# --- the producer, run with one checkout's virtualenv --------------------------------------

def _backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


Measure = Callable[[Callable[[], None], int, int, int], dict[str, float]]
"""How a producer measures its calls: (enqueue one call's jobs, backend pid, warmup calls,
calls) -> figures per call."""


def _timed(enqueue_one: Any, backend: int, warmup: int, calls: int) -> dict[str, float]:
    for _ in range(warmup):
        enqueue_one()
    pg, cpu, wall = _backend_cpu(backend), time.process_time(), time.perf_counter()
    for _ in range(calls):
        enqueue_one()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"jobs_per_s": calls / wall, "cpu_us": cpu / calls * 1e6,
            "pg_cpu_us": (_backend_cpu(backend) - pg) / calls * 1e6}


def _per_job(figures: dict[str, float], batch: int) -> dict[str, float]:
    """Per-call figures of calls of `batch` jobs as per-job ones (opcodes stay per call)."""
    scale = {"jobs_per_s": batch, "cpu_us": 1 / batch, "pg_cpu_us": 1 / batch}
    return {name: value * scale.get(name, 1) for name, value in figures.items()}


def _enqueue(conn: Any, batch: int) -> None:
    """One call's jobs: `taskline.enqueue`, or `enqueue_many` of `batch` no-op jobs."""
    import taskline
    if batch == 1:
        taskline.enqueue(conn, NOOP)
    else:
        taskline.enqueue_many(conn, [{"type": NOOP}] * batch)


def _opcodes(enqueue_one: Any, backend: int, warmup: int, calls: int) -> dict[str, float]:
    """Python bytecode instructions per call (bench/opcodes.py)."""
    for _ in range(warmup):
        enqueue_one()

    def run() -> None:
        for _ in range(calls):
            enqueue_one()

    return {"opcodes_per_call": count_opcodes(run) / calls}


def _on_psycopg(url: str, warmup: int, calls: int, measure: Measure,
                batch: int) -> dict[str, float]:
    import psycopg

    with psycopg.connect(url) as conn:
        backend = conn.info.backend_pid

        def one() -> None:
            with conn.transaction():
                _enqueue(conn, batch)

        return measure(one, backend, warmup, calls)


def _on_sqlalchemy(url: str, warmup: int, calls: int, measure: Measure,
                   batch: int) -> dict[str, float]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()

        def one() -> None:
            with conn.begin():
                _enqueue(conn, batch)

        result = measure(one, backend, warmup, calls)
    engine.dispose()
    return result


def produce(url: str, warmup: int, jobs: int, opcodes: bool, batch: int = 1) -> dict[str, Any]:
    """Both kinds of connection, one after the other, timed (or their opcodes counted); checks
    every job was written. `warmup` and `jobs` are rounded down to whole calls of `batch`."""
    measure = _opcodes if opcodes else _timed
    import psycopg

    import taskline
    warmup_calls, calls = warmup // batch, jobs // batch
    out: dict[str, Any] = {"taskline": str(Path(taskline.__file__).resolve().parent)}
    for kind, on in (("psycopg", _on_psycopg), ("sqlalchemy", _on_sqlalchemy)):
        out[kind] = _per_job(on(url, warmup_calls, calls, measure, batch), batch)
    with psycopg.connect(url) as conn:
        written = conn.execute("SELECT count(*) FROM taskline.jobs").fetchone()
    expected = 2 * (warmup_calls + calls) * batch
    if written is None or written[0] != expected:
        raise RuntimeError(f"{written} jobs written, {expected} enqueued")
    return out


# --- the pairs -------------------------------------------------------------------------------

def _admin(statement: str) -> None:
    import psycopg
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


def run_side(tree: Path, warmup: int, jobs: int, opcodes: bool = False,
             batch: int = 1) -> dict[str, Any]:
    """One run of `tree`'s code on a fresh database its own `taskline migrate` made."""
    return run_in_tree(tree, Path(__file__), "--produce",
                       ["--warmup", str(warmup), "--jobs", str(jobs), "--batch", str(batch),
                        *(["--count-opcodes"] if opcodes else [])])


def run_in_tree(tree: Path, script: Path, mode: str, args: list[str]) -> dict[str, Any]:
    """`script mode <url> *args` run with `tree`'s virtualenv (so it imports that checkout's
    taskline) against a fresh database `tree`'s own `taskline migrate` made, dropped after; the
    JSON object its last line prints, which names the taskline it imported (checked)."""
    name = f"taskline_pair_{uuid.uuid4().hex[:10]}"
    url = urlunsplit(urlsplit(ADMIN_URL)._replace(path="/" + name))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TASKLINE_") and k not in ("DATABASE_URL", "REDIS_URL")}
    _admin(f'CREATE DATABASE "{name}"')
    try:
        subprocess.run([str(tree / ".venv" / "bin" / "taskline"), "migrate"], check=True,
                       env={**env, "DATABASE_URL": url}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with tempfile.TemporaryDirectory() as cwd:  # nothing imported from a working directory
            answer = subprocess.run(
                [str(tree / ".venv" / "bin" / "python"), str(script.resolve()), mode, url,
                 *args], env=env, cwd=cwd, capture_output=True, text=True)
        if answer.returncode != 0:
            raise RuntimeError(f"{script.name} on {tree} failed:\n{answer.stderr[-2000:]}")
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    result: dict[str, Any] = json.loads(answer.stdout.splitlines()[-1])
    if not Path(result["taskline"]).is_relative_to(tree.resolve()):
        raise RuntimeError(f"{tree}'s virtualenv imported taskline from {result['taskline']}")
    return result


def _flat(result: dict[str, Any]) -> dict[str, float]:
    return {f"{kind} {metric}": value for kind in KINDS for metric, value in result[kind].items()}


def ratio(name: str, before: float, after: float) -> float:
    return after / before if name.endswith("jobs_per_s") else before / after


def summarize(pairs: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in pairs[0]["after"]:
        ratios = [ratio(name, p["before"][name], p["after"][name]) for p in pairs]
        summary[name] = compared(ratios, (p["before"][name] for p in pairs),
                                 (p["after"][name] for p in pairs))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1,
                        help="jobs per call: above 1, taskline.enqueue_many of that many")
    parser.add_argument("--out", type=Path, default=Path("bench-results/library_pairs.json"))
    parser.add_argument("--opcodes", type=int, default=0, metavar="N",
                        help="count the Python bytecode instructions of N calls instead")
    parser.add_argument("--produce", metavar="DATABASE_URL", help=argparse.SUPPRESS)
    parser.add_argument("--count-opcodes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        print(json.dumps(produce(args.produce, args.warmup, args.jobs, args.count_opcodes,
                                 args.batch)))
        return 0
    if args.before is None or args.after is None:
        parser.error("--before and --after are required")
    if args.opcodes:
        for side in ("before", "after"):
            counted = run_side(getattr(args, side), args.warmup, args.opcodes, opcodes=True,
                               batch=args.batch)
            print(f"{side}: " + ", ".join(f"{kind} {counted[kind]['opcodes_per_call']:,.0f}"
                                          for kind in KINDS) + " opcodes per call", flush=True)
        return 0
    pairs: list[dict[str, dict[str, float]]] = []
    for n in range(args.pairs):
        runs = {side: _flat(run_side(getattr(args, side), args.warmup, args.jobs,
                                     batch=args.batch))
                for side in alternating(n)}
        pairs.append(runs)
        print(f"pair {n + 1}: " + json.dumps({k: round(ratio(k, runs["before"][k], v), 3)
                                             for k, v in runs["after"].items()}), flush=True)
    report(summarize(pairs), pairs, args.out, width=28)
    return 0


if __name__ == "__main__":
    sys.exit(main())
