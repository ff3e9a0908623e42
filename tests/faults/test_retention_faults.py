"""Retention killed mid-pass: a process running retention passes is SIGKILLed while it deletes,
and afterwards every job is either whole (its row, every event, its lease and, if dead, its DLQ
row) or gone with all of them. Nothing is ever half deleted, because each batch is one
statement and the foreign keys cascade inside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter

import psycopg
import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.faults

JOBS = 30_000
EVENTS_PER_JOB = 3
BATCH = 200
# Runs retention passes until killed: small batches, so the kill lands mid-pass.
PASSES = """
import sys
from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from taskline_maintenance.retention import Retention

settings = Settings.from_env(env={}, database_url=sys.argv[1], redis_url=sys.argv[2],
                             retain_succeeded_s=3600, retain_dead_s=3600, metrics_port=0)
retention = Retention(Store.connect(settings.database_url), Dispatcher(settings.redis_url),
                      settings, batch_size=int(sys.argv[3]))
while True:
    retention.run_once()
"""


def finished_history(url: str, jobs: int) -> None:
    """`jobs` jobs finished a day ago (every 10th dead), each with its events and a lease."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO taskline.jobs (id, type, queue, payload, priority, status, attempts, "
            "max_retries, timeout_s, created_at, updated_at, finished_at) "
            "SELECT gen_random_uuid(), 'echo', 'default', '{}', 5, "
            "CASE WHEN n %% 10 = 0 THEN 'dead' ELSE 'succeeded' END, 1, 0, 30, "
            "now() - interval '1 day', now() - interval '1 day', now() - interval '1 day' "
            "FROM generate_series(1, %s) AS n", (jobs,))
        conn.execute("INSERT INTO taskline.job_events (job_id, attempt, event) "
                     "SELECT id, e, 'x' FROM taskline.jobs, generate_series(1, %s) AS e",
                     (EVENTS_PER_JOB,))
        conn.execute("INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, "
                     "leased_until, released_at, outcome) "
                     "SELECT id, 1, 'w1', now(), now(), now(), 'succeeded' FROM taskline.jobs")
        conn.execute("INSERT INTO taskline.dead_letter_jobs (job_id, final_error, attempts) "
                     "SELECT id, 'boom', 1 FROM taskline.jobs WHERE status = 'dead'")


def count(url: str, sql: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


def per_job(url: str, table: str) -> Counter:
    with psycopg.connect(url, autocommit=True) as conn:
        return Counter({str(r[0]): r[1] for r in conn.execute(
            f"SELECT job_id, count(*) FROM taskline.{table} GROUP BY job_id")})


@pytest.mark.fast
@pytest.mark.timeout(180)
def test_a_pass_killed_mid_way_leaves_every_job_whole_or_gone(database_url, redis_url):
    finished_history(database_url, JOBS)
    with psycopg.connect(database_url, autocommit=True) as conn:
        everyone = {str(r[0]): r[1] for r in conn.execute("SELECT id, status FROM taskline.jobs")}
    proc = subprocess.Popen([sys.executable, "-c", PASSES, database_url, redis_url, str(BATCH)])
    try:
        # Kill once a few batches went, well before the last: the pass is mid-way.
        every = "SELECT count(*) FROM taskline.jobs"
        wait_for(lambda: count(database_url, every) <= JOBS - 5 * BATCH,
                 timeout=60, interval=0.01, message="retention to start deleting")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    with psycopg.connect(database_url, autocommit=True) as conn:
        left = {str(r[0]) for r in conn.execute("SELECT id FROM taskline.jobs")}
    events, leases = per_job(database_url, "job_events"), per_job(database_url, "job_leases")
    dead_letters = per_job(database_url, "dead_letter_jobs")
    assert 0 < len(left) < JOBS, "the kill must land mid-pass"
    # A deleted job's events and leases stay, unread, until their partition expires (0021).
    half = [job for job, status in everyone.items() if (
        (events[job], leases[job], dead_letters[job])
        != (EVENTS_PER_JOB, 1, int(status == "dead" and job in left)))]
    assert half == [], f"{len(half)} jobs half deleted, e.g. {half[:5]}"
