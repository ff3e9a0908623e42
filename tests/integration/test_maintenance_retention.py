"""Retention against real PostgreSQL and Redis: exactly the expired finished jobs go, each with
its events, leases, DLQ row and Redis entries; every unfinished job stays however old it is;
`finished_at` is set by terminal transitions only; jobs finished before migration 0004 expire by
`updated_at`; a pass repeats batches until nothing expired is left."""

from __future__ import annotations

import time
import uuid

from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline import transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.jobs import Status
from taskline.store.store import Store
from taskline_maintenance.retention import Retention
from tests.helpers import enqueue, fail, succeed

KEYS = QueueKeys("default")
HOUR_S = 3600.0
RETAINED = {"retain_succeeded_s": HOUR_S, "retain_cancelled_s": HOUR_S, "retain_dead_s": HOUR_S}


def claimed(store: Store, dispatcher: Dispatcher, **kw):
    job = enqueue(store, dispatcher, **kw)
    assert dispatcher.fetch(kw.get("queue", "default"), "w1", 1) == [str(job.id)]
    (claim,) = store.claim_jobs([job.id], "w1", 600)
    return claim


def succeeded_job(store, dispatcher) -> uuid.UUID:
    claim = claimed(store, dispatcher)
    assert succeed(store, claim.lease_id, "w1", {"ok": True})
    dispatcher.ack([("default", str(claim.job.id))], "w1")
    return claim.job.id


def dead_job(store, dispatcher) -> uuid.UUID:
    claim = claimed(store, dispatcher, max_retries=0)
    rows = fail(store, claim.lease_id, "w1")
    dispatcher.follow([rows.committed(transitions.DEAD)])
    return claim.job.id


def cancelled_job(store, dispatcher) -> uuid.UUID:
    # Not pushed: a cancel leaves ready-list copies for the claim to refuse, and the helpers
    # here fetch the next id expecting their own.
    job = enqueue(store, dispatcher, push=False)
    assert store.cancel_pending_job(job.id)
    return job.id


def backdate(store: Store, ids, *, days: int = 365, stamp: bool = True) -> None:
    """Make jobs `days` old: created, last changed and (if it finished, or `stamp` says the
    column is there at all) finished that long ago. stamp=False: finished by a release before
    migration 0004, which left finished_at NULL."""
    with store.transaction() as conn:
        conn.execute(text(
            "UPDATE taskline.jobs SET created_at = now() - make_interval(days => :d), "
            "updated_at = now() - make_interval(days => :d), "
            "finished_at = CASE WHEN :stamp THEN now() - make_interval(days => :d) END "
            "WHERE id = ANY(:ids)"), {"d": days, "ids": list(ids), "stamp": stamp})


def remaining(store: Store, ids) -> dict[str, set[str]]:
    """Which of `ids` still have a row in each table."""
    found = {}
    with store.transaction() as conn:
        for table, column in (("jobs", "id"), ("job_events", "job_id"),
                              ("job_leases", "job_id"), ("dead_letter_jobs", "job_id")):
            rows = conn.execute(text(f"SELECT DISTINCT {column} FROM taskline.{table} "
                                     f"WHERE {column} = ANY(:ids)"), {"ids": list(ids)})
            found[table] = {str(r[0]) for r in rows}
    return found


def finished_at(store: Store, job_id) -> object:
    with store.transaction() as conn:
        return conn.execute(text("SELECT finished_at FROM taskline.jobs WHERE id = :id"),
                            {"id": job_id}).scalar_one()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_finished_at_is_set_by_terminal_transitions_only(store, dispatcher):
    done, dead, cancelled = (succeeded_job(store, dispatcher), dead_job(store, dispatcher),
                             cancelled_job(store, dispatcher))
    assert all(finished_at(store, j) is not None for j in (done, dead, cancelled))
    retrying = claimed(store, dispatcher)
    assert fail(store, retrying.lease_id, "w1", delay_s=60)
    assert finished_at(store, retrying.job.id) is None
    assert store.requeue_dead_job(dead)
    assert finished_at(store, dead) is None


def unfinished_jobs(store: Store, dispatcher: Dispatcher) -> list[uuid.UUID]:
    """One job in every unfinished state: queued in a paused queue no worker serves, delayed a
    year, running, retrying a year from now, and a dead job requeued."""
    unserved = enqueue(store, dispatcher, queue="paused").id
    store.pause_queue("paused", None)
    delayed = enqueue(store, dispatcher, push=False).id
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'scheduled', "
                          "next_run_at = now() + interval '1 year' WHERE id = :id"),
                     {"id": delayed})
    running = claimed(store, dispatcher).job.id
    retry = claimed(store, dispatcher)
    assert fail(store, retry.lease_id, "w1", delay_s=365 * 86400)
    requeued = dead_job(store, dispatcher)
    job = store.requeue_dead_job(requeued)
    dispatcher.follow([transitions.Committed(transitions.REQUEUE, str(job.id), job.queue,
                                             job.priority)])
    return [unserved, delayed, running, retry.job.id, requeued]


def test_exactly_the_expired_finished_jobs_go_whole(store, dispatcher, settings, client):
    expired = [succeeded_job(store, dispatcher), dead_job(store, dispatcher),
               cancelled_job(store, dispatcher)]
    unstamped = succeeded_job(store, dispatcher)
    recent = [succeeded_job(store, dispatcher), dead_job(store, dispatcher)]
    unfinished = unfinished_jobs(store, dispatcher)
    backdate(store, expired)
    backdate(store, [unstamped], stamp=False)
    # A year old and stamped finished (as a requeue by a release before 0004 would leave them),
    # yet not finished: the state decides, never the age.
    backdate(store, unfinished, stamp=True)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.dead_letter_jobs SET failed_at = now() - interval "
                          "'1 year'"))
    before = {s: sample("taskline_retention_deleted_total", status=s)
              for s in ("succeeded", "dead", "cancelled")}
    gone = {str(j) for j in [*expired, unstamped]}
    kept = {str(j) for j in [*recent, *unfinished]}

    result = Retention(store, dispatcher, settings.replace(**RETAINED)).run_once()

    assert result.deleted == {Status.SUCCEEDED: 2, Status.CANCELLED: 1, Status.DEAD: 1}
    left = remaining(store, gone | kept)
    # The deleted jobs' events and leases stay until their partition expires (0021).
    assert left["jobs"] == kept and left["job_events"] == kept | gone
    assert left["job_leases"] - gone == {str(j) for j in [*recent, *unfinished]} - {
        str(unfinished[0]), str(unfinished[1])}  # the unserved and delayed jobs never ran
    assert left["dead_letter_jobs"] == {str(recent[1])}
    assert dispatcher.list_range(KEYS.dlq, 0, -1) == [str(recent[1])]
    assert client.get(f"/api/v1/jobs/{expired[0]}").status_code == 404
    assert client.get(f"/api/v1/jobs/{recent[0]}").status_code == 200
    assert {s: sample("taskline_retention_deleted_total", status=s) - before[s]
            for s in before} == {"succeeded": 2, "dead": 1, "cancelled": 1}
    assert sample("taskline_retention_oldest_finished_age_seconds", status="succeeded") < 60
    assert sample("taskline_retention_seconds", status="dead") == HOUR_S
    assert not Retention(store, dispatcher, settings.replace(**RETAINED)).run_once().changed


def test_zero_keeps_a_status_forever(store, dispatcher, settings):
    jobs = [succeeded_job(store, dispatcher), cancelled_job(store, dispatcher)]
    backdate(store, jobs, days=3650)
    keep_cancelled = settings.replace(**{**RETAINED, "retain_cancelled_s": 0})

    result = Retention(store, dispatcher, keep_cancelled).run_once()

    assert Status.CANCELLED not in result.deleted
    assert remaining(store, jobs)["jobs"] == {str(jobs[1])}
    age = sample("taskline_retention_oldest_finished_age_seconds", status="cancelled")
    assert age > 3600 * 24 * 3000


def test_a_pass_repeats_batches_until_nothing_expired_remains(store, dispatcher, settings):
    jobs = [succeeded_job(store, dispatcher) for _ in range(5)]
    backdate(store, jobs)

    result = Retention(store, dispatcher, settings.replace(**RETAINED), batch_size=2).run_once()

    assert result.deleted[Status.SUCCEEDED] == 5 and result.batches == 3 + 1 + 1
    assert remaining(store, jobs)["jobs"] == set()


def test_a_pass_rests_between_batches_as_long_as_the_last_one_took(store, dispatcher, settings):
    jobs = [succeeded_job(store, dispatcher) for _ in range(5)]
    backdate(store, jobs)
    rests: list[float] = []

    retention = Retention(store, dispatcher, settings.replace(**RETAINED), batch_size=2,
                          rest=rests.append)
    started = time.monotonic()
    result = retention.run_once()
    elapsed = time.monotonic() - started

    assert result.deleted[Status.SUCCEEDED] == 5
    # Three succeeded batches (2, 2, 1): a rest before the second and the third, none before
    # the first or after the short one; each as long as a batch took, so together less than
    # the pass itself.
    assert len(rests) == 2 and all(r > 0 for r in rests)
    assert sum(rests) < elapsed


def test_a_pass_stops_between_batches_when_leadership_is_lost(store, dispatcher, settings):
    jobs = [succeeded_job(store, dispatcher) for _ in range(4)]
    backdate(store, jobs)
    answers = iter([True, False])

    retention = Retention(store, dispatcher, settings.replace(**RETAINED), batch_size=2,
                          active=lambda: next(answers, False))
    result = retention.run_once()

    assert result.deleted[Status.SUCCEEDED] == 2
    assert len(remaining(store, jobs)["jobs"]) == 2


def test_redis_entries_of_deleted_jobs_are_removed_and_others_kept(store, dispatcher, settings):
    dead = [dead_job(store, dispatcher) for _ in range(3)]
    stale = cancelled_job(store, dispatcher)
    dispatcher.schedule("default", str(stale), 1)  # left by a crash before its Redis step
    backdate(store, [dead[0], dead[1], stale])

    Retention(store, dispatcher, settings.replace(**RETAINED)).run_once()

    assert dispatcher.list_range(KEYS.dlq, 0, -1) == [str(dead[2])]
    assert dispatcher.client.zrange(KEYS.scheduled, 0, -1) == []
