"""Ordering keys against real PostgreSQL and Redis: jobs of a queue with one `ordering_key`
start one at a time in enqueue order (priority does not reorder them), a retrying or not-yet-due
job keeps its place, a dead, cancelled or lapsed one gives the turn (pushed at once), a requeued
one goes to the back;
the plain claim never starts a keyed job; concurrent claimers never overlap a key; real workers
run a key's jobs in order; the API takes, shows and validates the field."""

from __future__ import annotations

import itertools
import threading
import uuid

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from taskline import transitions
from taskline.audit_verify import verify
from taskline.dispatch.keys import QueueKeys
from taskline.execution.outcomes import released_steps
from taskline.mirror import Mirror
from taskline.store.history import HistoryReader
from taskline.store.rows import Settlement
from taskline_maintenance.lapser import Lapser
from taskline_maintenance.ordering import OrderingGauges, OrderingResult
from taskline_maintenance.reaper import Reaper
from taskline_worker.held import RETRY_S, HeldWork
from tests.helpers import enqueue, fail, succeed, wait_for
from tests.integration import worker_handlers as th
from tests.integration.worker_handlers import running_worker

W = "w-order"


def keyed(store, n, key, queue="default", **kw):
    return [enqueue(store, None, "t.held", {"tag": f"{key}-{i}"}, queue=queue, push=False,
                    ordering_key=key, **kw) for i in range(n)]


def started(store, slots=10):
    return [c for c in store.claim_held(["default", "other"], slots, W, 30).claimed]


def test_plain_claim_refuses_keyed_jobs_as_held_and_writes_nothing(store):
    jobs = keyed(store, 2, "k")
    free = enqueue(store, None, "t.fast", push=False)
    won = store.claim_jobs([j.id for j in jobs] + [free.id], W, 30)
    assert [c.job.id for c in won] == [free.id]
    assert {r.id: r.limited for r in store.claim_refusals([j.id for j in jobs])} == {
        j.id: True for j in jobs}
    assert [store.get_job(j.id).attempts for j in jobs] == [0, 0]


def test_one_at_a_time_in_enqueue_order_whatever_the_priority(store):
    first = keyed(store, 1, "k", priority=1)[0]
    second = keyed(store, 1, "k", priority=9)[0]
    other = keyed(store, 1, "k2")[0]
    got = started(store)
    assert sorted(str(c.job.id) for c in got) == sorted([str(first.id), str(other.id)])
    assert started(store) == []  # the key's head runs: the one behind waits
    succeed(store, next(c for c in got if c.job.id == first.id).lease_id, W)
    assert [c.job.id for c in started(store)] == [second.id]


def test_the_same_key_in_two_queues_is_two_lines(store):
    a = keyed(store, 1, "k")[0]
    b = keyed(store, 1, "k", queue="other")[0]
    assert sorted(str(c.job.id) for c in started(store)) == sorted([str(a.id), str(b.id)])


def test_a_retrying_job_keeps_its_place_and_a_dead_one_gives_the_turn(store):
    head, behind = keyed(store, 2, "k", max_retries=2)
    claim = started(store)[0]
    fail(store, claim.lease_id, W, delay_s=60)
    assert store.get_job(head.id).status == "retrying"
    assert started(store) == []  # not due yet, still first in line
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET next_run_at = now() WHERE id = :id"),
                     {"id": head.id})
    store.promote_due(10)
    again = started(store)
    assert [c.job.id for c in again] == [head.id] and again[0].job.attempts == 2
    fail(store, again[0].lease_id, W)  # dead
    assert store.get_job(head.id).status == "dead"
    assert [c.job.id for c in started(store)] == [behind.id]


def test_a_requeued_dead_job_goes_to_the_back_of_its_line(store):
    head, second, third = keyed(store, 3, "k", max_retries=0)
    fail(store, started(store)[0].lease_id, W)
    assert store.requeue_dead_job(head.id) is not None
    order = []
    for _ in range(3):
        (claim,) = started(store)
        order.append(claim.job.id)
        succeed(store, claim.lease_id, W)
    assert order == [second.id, third.id, head.id]


def test_a_cancelled_job_gives_the_turn(store):
    head, behind = keyed(store, 2, "k")
    assert store.cancel_pending_job(head.id) is not None
    assert [c.job.id for c in started(store)] == [behind.id]


def test_a_scheduled_job_holds_the_ones_behind_it(store):
    head, behind = keyed(store, 2, "k")
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET status = 'scheduled', "
                          "next_run_at = now() + interval '1 hour' WHERE id = :id"),
                     {"id": head.id})
    assert started(store) == []
    assert store.get_job(behind.id).status == "queued"


def claim_and_succeed_until_done(store, name: str, errors: list[BaseException]) -> None:
    """Half the claimers take heads through the budgeted claim, half as a worker takes the ids
    Redis hands it (every queued id, in a shuffled order) through the keyed claim."""
    try:
        for _ in range(200):
            if name.endswith(("0", "2", "4")):
                claims = store.claim_held(["default"], 3, name, 30).claimed
            else:
                with store.transaction() as conn:
                    ids = [str(r.id) for r in conn.execute(text(
                        "SELECT id FROM taskline.jobs WHERE status = 'queued' "
                        "ORDER BY random()"))]
                claims = store.claim_keyed(ids, name, 30)
            for claim in claims:
                succeed(store, claim.lease_id, name)
    except BaseException as err:
        errors.append(err)


def leases_by_key(store) -> dict[str, list]:
    with store.transaction() as conn:
        rows = conn.execute(text(
            "SELECT j.ordering_key AS key, l.leased_at, l.released_at, j.created_at, j.id "
            "FROM taskline.job_leases l JOIN taskline.jobs j ON j.id = l.job_id "
            "ORDER BY j.ordering_key, l.leased_at")).all()
    found: dict[str, list] = {}
    for row in rows:
        found.setdefault(row.key, []).append(row)
    return found


def test_concurrent_claimers_never_overlap_a_key_nor_reorder_it(store):
    keys = [f"k{i}" for i in range(4)]
    for _ in range(10):
        for key in keys:
            keyed(store, 1, key)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=claim_and_succeed_until_done,
                                args=(store, f"w{i}", errors)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    leases = leases_by_key(store)
    assert sorted(leases) == keys and all(len(mine) == 10 for mine in leases.values())
    for mine in leases.values():
        for a, b in itertools.pairwise(mine):
            assert a.released_at is not None and a.released_at <= b.leased_at  # no overlap
            assert (a.created_at, str(a.id)) < (b.created_at, str(b.id))  # enqueue order


@pytest.mark.usefixtures("clean_handlers")
def test_workers_run_a_keys_jobs_in_order_one_at_a_time(settings, store, dispatcher):
    for i in range(8):
        for key in ("a", "b"):
            enqueue(store, dispatcher, "t.held", {"tag": f"{key}{i}", "sleep_s": 0.02},
                    ordering_key=key)
    turns = REGISTRY.get_sample_value("taskline_ordering_turns_total") or 0.0
    with running_worker(settings, concurrency=4), running_worker(settings, concurrency=4):
        wait_for(lambda: len(th.tags()) >= 16, timeout=30, message="every job ran")
    # Each success but a key's last passed the turn to the next job in its settle statement.
    assert REGISTRY.get_sample_value("taskline_ordering_turns_total") - turns == 14
    tags = th.tags()
    assert [t for t in tags if t.startswith("a")] == [f"a{i}" for i in range(8)]
    assert [t for t in tags if t.startswith("b")] == [f"b{i}" for i in range(8)]
    with store.transaction() as conn:
        overlaps = conn.execute(text(
            "SELECT count(*) FROM taskline.job_leases l JOIN taskline.jobs j ON j.id = l.job_id "
            "JOIN taskline.job_leases m ON m.id <> l.id JOIN taskline.jobs k ON k.id = m.job_id "
            "WHERE j.ordering_key = k.ordering_key AND m.leased_at >= l.leased_at "
            "AND m.leased_at < l.released_at")).scalar_one()
    assert overlaps == 0


def test_api_takes_shows_and_validates_the_ordering_key(client):
    made = client.post("/api/v1/jobs", json={"type": "t.held", "ordering_key": "acct-7"})
    assert made.status_code == 201, made.get_json()
    job_id = made.get_json()["id"]
    assert client.get(f"/api/v1/jobs/{job_id}").get_json()["ordering_key"] == "acct-7"
    batch = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t.held", "ordering_key": "acct-7"}, {"type": "t.held"}]})
    assert batch.status_code in (200, 201), batch.get_json()
    for bad in ("", "x" * 201, 7):
        answer = client.post("/api/v1/jobs", json={"type": "t.held", "ordering_key": bad})
        assert answer.status_code == 422
        assert "ordering_key" in str(answer.get_json()["error"])
    assert uuid.UUID(job_id)


def test_maintenance_exports_each_queues_keys_and_their_queued_jobs(store, settings):
    keyed(store, 3, "k")
    keyed(store, 1, "k2")
    keyed(store, 2, "k", queue="other")
    gauges = OrderingGauges(store, settings)
    assert gauges.run_once() == OrderingResult(keys=3, queued=6)

    def sample(name: str, queue: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"queue": queue})

    assert (sample("taskline_ordering_keys", "default"),
            sample("taskline_ordering_queued_jobs", "default")) == (2, 4)
    assert sample("taskline_ordering_queued_jobs", "other") == 2
    for claim in started(store):
        succeed(store, claim.lease_id, W)
    gauges.run_once()
    assert sample("taskline_ordering_queued_jobs", "default") == 2
    gauges.clear()
    assert sample("taskline_ordering_keys", "default") is None


@pytest.mark.usefixtures("clean_handlers")
def test_a_head_cancelled_while_its_line_waits_hands_the_turn_to_a_running_worker(
        settings, store, dispatcher):
    head = enqueue(store, dispatcher, "t.held", {"tag": "head"}, ordering_key="k")
    with store.transaction() as conn:  # not due for an hour: it keeps its place meanwhile
        conn.execute(text("UPDATE taskline.jobs SET status = 'scheduled', "
                          "next_run_at = now() + interval '1 hour' WHERE id = :id"),
                     {"id": head.id})
    enqueue(store, dispatcher, "t.held", {"tag": "next"}, ordering_key="k")
    with running_worker(settings, concurrency=2):
        wait_for(lambda: not dispatcher_holds(dispatcher), timeout=10,
                 message="the refused id left Redis")
        assert th.tags() == []
        assert store.cancel_pending_job(head.id) is not None
        wait_for(lambda: th.tags() == ["next"], timeout=10, message="the next one ran")


def dispatcher_holds(dispatcher) -> bool:
    return bool(dispatcher.client.llen(QueueKeys("default").ready(5)))


def test_the_audit_finds_no_overlap_in_what_the_engine_ran_and_reports_a_forged_one(store):
    for _ in range(3):
        keyed(store, 1, "k")
    for _ in range(3):
        for claim in started(store):
            succeed(store, claim.lease_id, W)
    reader = HistoryReader(store.engine)
    assert [v for v in verify(reader) if v.rule == "ordering_overlap"] == []
    a, b = keyed(store, 2, "forged")
    with store.transaction() as conn:  # b leased while a's lease is still open
        for job, offset in ((a, 0), (b, 1)):
            conn.execute(text(
                "INSERT INTO taskline.job_leases (job_id, attempt, worker_id, leased_at, "
                "leased_until) VALUES (:id, 1, 'w', now() + make_interval(secs => :s), "
                "now() + interval '1 hour')"), {"id": job.id, "s": offset})
    overlaps = [v for v in verify(reader) if v.rule == "ordering_overlap"]
    assert [v.job_id for v in overlaps] == [str(b.id)]
    assert str(a.id) in overlaps[0].message


def test_a_keyed_workflow_step_takes_its_place_when_released(client, store):
    made = client.post("/api/v1/workflows", json={"name": "w", "steps": [
        {"id": "a", "job": {"type": "t.held", "ordering_key": "k"}},
        {"id": "b", "job": {"type": "t.held", "ordering_key": "k"}, "after": ["a"]}]})
    assert made.status_code == 201, made.get_json()
    (a,) = started(store)
    assert a.job.step == "a" and a.job.ordering_key == "k"
    later = keyed(store, 1, "k")[0]  # enqueued after b was submitted, before b's release
    store.settle([Settlement(a.lease_id, W, transitions.succeeded(None), releases=True)])
    assert store.get_job(later.id).status == "queued"
    (first,) = started(store)
    assert first.job.id == later.id
    succeed(store, first.lease_id, W)
    (second,) = started(store)
    assert second.job.step == "b"


def test_a_large_batch_written_by_copy_keeps_its_order_within_a_key(client, store):
    jobs = [{"type": "t.held", "payload": {"n": n}, "ordering_key": "bulk"} for n in range(120)]
    answer = client.post("/api/v1/jobs/batch", json={"jobs": jobs})
    assert answer.status_code == 201, answer.get_json()
    order = []
    for _ in range(5):
        (claim,) = started(store)
        order.append(claim.job.payload["n"])
        assert claim.job.ordering_key == "bulk"
        succeed(store, claim.lease_id, W)
    assert order == [0, 1, 2, 3, 4]


def test_a_finished_head_passes_the_turn_in_its_settle_and_the_next_is_pushed(
        store, dispatcher):
    head, second, third = keyed(store, 3, "k")
    plain = enqueue(store, None, "t.fast", push=False)
    (claim,) = store.claim_keyed([str(j.id) for j in (second, head, third)], W, 30)
    assert claim.job.id == head.id  # only the head, whatever the order the ids came in
    assert store.claim_keyed([str(second.id)], W, 30) == []  # its head runs
    (row,) = succeed(store, claim.lease_id, W)
    assert row.turn is not None and (row.turn.id, row.turn.queue) == (second.id, "default")
    Mirror.of(dispatcher, store).follow(released_steps([row]), action="test")
    assert dispatcher.fetch("default", W, 10) == [str(second.id)]  # pushed after the commit
    assert store.claim_jobs([second.id], W, 30) == []  # the plain claim leaves it to the key's
    assert [c.job.id for c in store.claim_keyed([str(second.id)], W, 30)] == [second.id]
    (plain_claim,) = store.claim_jobs([plain.id], W, 30)
    assert succeed(store, plain_claim.lease_id, W)[0].turn is None  # no key, no lookup


def test_only_a_finished_head_passes_the_turn_and_only_to_a_queued_job(store):
    head, behind = keyed(store, 2, "k", max_retries=1)
    (claim,) = store.claim_keyed([str(head.id)], W, 30)
    assert fail(store, claim.lease_id, W, delay_s=0).turn is None  # retrying: keeps its place
    store.promote_due(10)
    (claim,) = store.claim_keyed([str(head.id), str(behind.id)], W, 30)
    snoozed = store.settle([Settlement(claim.lease_id, W, transitions.snoozed(0))])
    assert snoozed[0].turn is None  # a snooze keeps its place too
    store.promote_due(10)
    (claim,) = store.claim_keyed([str(head.id), str(behind.id)], W, 30)
    assert fail(store, claim.lease_id, W).turn.id == behind.id  # dead: the turn passes
    (claim,) = store.claim_keyed([str(behind.id)], W, 30)
    later = keyed(store, 1, "k")[0]
    with store.transaction() as conn:  # the next in line is not due: nothing to push
        conn.execute(text("UPDATE taskline.jobs SET status = 'scheduled', "
                          "next_run_at = now() + interval '1 hour' WHERE id = :id"),
                     {"id": later.id})
    stopped = store.settle([Settlement(claim.lease_id, W,
                                       transitions.cancelled_while_running("stop"))])
    assert stopped[0].status == "cancelled" and stopped[0].turn is None


def test_a_head_dead_on_its_expired_last_lease_passes_the_turn_through_the_reaper(
        store, dispatcher, settings):
    head, behind = keyed(store, 2, "k", max_retries=0)
    assert [c.job.id for c in store.claim_keyed([str(head.id)], W, 0.2)] == [head.id]
    reaper = Reaper(store, dispatcher, settings)
    wait_for(lambda: reaper.run_once().dead_lettered, message="the head dead-lettered")
    assert dispatcher.fetch("default", W, 10) == [str(behind.id)]  # its turn, pushed
    assert [c.job.id for c in store.claim_keyed([str(behind.id)], W, 30)] == [behind.id]


def test_the_api_pushes_only_a_keys_head_the_others_wait_for_their_turn(
        client, store, dispatcher):
    made = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t.held", "ordering_key": "k", "payload": {"n": n}} for n in range(3)]
        + [{"type": "t.held", "ordering_key": "other"}, {"type": "t.held"}]})
    assert made.status_code == 201, made.get_json()
    ids = [item["job"]["id"] for item in made.get_json()["jobs"]]
    later = client.post("/api/v1/jobs", json={"type": "t.held", "ordering_key": "k"})
    assert later.status_code == 201
    assert sorted(dispatcher.fetch("default", W, 10)) == sorted([ids[0], ids[3], ids[4]])
    assert store.get_job(later.get_json()["id"]).status == "queued"


def test_a_keyed_job_claimed_from_redis_that_ends_makes_the_budgeted_claim_look_within_1s(
        store, dispatcher):
    now = [100.0]
    held = HeldWork(store, dispatcher, W, ["default"], 30, clock=lambda: now[0])
    assert held.claim(4) == [] and not held.due()  # nothing waits: no look
    assert not held.timed()  # no limit: a loop waits for the keyed look in Redis, not asleep
    held.keyed_started(["job-1"])
    held.ended([transitions.Committed(transitions.SUCCEED, "job-1", "default", 5, W)])
    assert not held.due() and held.wait_s(5.0) == pytest.approx(RETRY_S)
    now[0] += RETRY_S
    assert held.due()  # the backstop for a job its settle could not see
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO taskline.flow_limits (scope, concurrency) "
                          "VALUES ('type:t.held', 1)"))
    now[0] += RETRY_S  # the limits are read again at most once a second
    held.due()
    assert held.timed()  # a budget may free at an instant: a short wait is slept out on time


def test_a_head_cancelled_before_it_ran_passes_the_turn_through_the_api(
        client, store, dispatcher):
    made = client.post("/api/v1/jobs/batch", json={"jobs": [
        {"type": "t.held", "ordering_key": "k", "payload": {"n": n}} for n in range(3)]})
    head, second, third = [item["job"]["id"] for item in made.get_json()["jobs"]]
    assert dispatcher.fetch("default", W, 10) == [head]  # the head alone, now out of ready
    assert client.delete(f"/api/v1/jobs/{third}").status_code == 200
    assert dispatcher.fetch("default", W, 10) == []  # behind the head: no turn passes
    turns = REGISTRY.get_sample_value("taskline_ordering_turns_total") or 0.0
    assert client.delete(f"/api/v1/jobs/{head}").status_code == 200
    assert dispatcher.fetch("default", W, 10) == [second]  # its turn, pushed at once
    assert REGISTRY.get_sample_value("taskline_ordering_turns_total") == turns + 1


def test_a_head_that_lapsed_passes_the_turn_and_one_behind_it_passes_none(store, dispatcher):
    head, second, third = keyed(store, 3, "k")
    plain = enqueue(store, None, "t.held", push=False)
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET expires_at = now() - interval '1 second' "
                          "WHERE id = ANY(:ids)"), {"ids": [second.id, plain.id]})
    lapser = Lapser(store, dispatcher)
    assert lapser.run_once().lapsed == 2
    assert dispatcher.fetch("default", W, 10) == []  # the lapsed one stood behind the head
    with store.transaction() as conn:
        conn.execute(text("UPDATE taskline.jobs SET expires_at = now() - interval '1 second' "
                          "WHERE id = :id"), {"id": head.id})
    assert lapser.run_once().lapsed == 1
    assert dispatcher.fetch("default", W, 10) == [str(third.id)]  # its turn, pushed at once
    assert [c.job.id for c in store.claim_keyed([str(third.id)], W, 30)] == [third.id]


def test_a_claim_explained_takes_what_the_plain_claim_takes_and_says_why_not_the_rest(store):
    head, behind = keyed(store, 2, "k")
    plain, taken = enqueue(store, None, "t.fast", push=False), enqueue(store, None, "t.fast",
                                                                        push=False)
    store.claim_jobs([taken.id], "someone-else", 30)
    ids = [str(j.id) for j in (head, plain, behind, taken)]
    won, refused = store.claim_jobs_explained(ids, W, 30)
    assert [c.job.id for c in won] == [plain.id]
    # The refusals read after the claim: the keyed ones, not the one it took nor the lost one.
    assert {r.id: (r.keyed, r.paused) for r in refused} == {head.id: (True, False),
                                                            behind.id: (True, False)}
    (claim,) = store.claim_keyed([str(head.id), str(behind.id)], W, 30)
    assert claim.job.id == head.id


def settle_turning(store, claim, most=1, queues=("default",)):
    return store.settle_turning([Settlement(claim.lease_id, W, transitions.succeeded(None))],
                                worker_id=W, lease_s=30, queues=list(queues), most=most)


def test_a_finished_head_starts_its_keys_next_job_in_its_own_statement(store):
    head, second, third = keyed(store, 3, "k")
    (claim,) = store.claim_keyed([str(head.id)], W, 30)
    (row,), (started,) = settle_turning(store, claim)
    assert row.status == "succeeded" and row.turn is None  # started here: nothing to push
    assert started.job.id == second.id and started.job.ordering_key == "k"
    assert store.get_job(second.id).status == "running" and started.lease_id is not None
    assert store.claim_keyed([str(third.id)], W, 30) == []  # its key runs: one at a time
    (row,), claims = settle_turning(store, started, most=0)  # no slot held: pushed instead
    assert claims == [] and row.turn is not None and row.turn.id == third.id
    (claim,) = store.claim_keyed([str(third.id)], W, 30)
    (row,), claims = settle_turning(store, claim)
    assert claims == [] and row.turn is None  # the line is empty


def test_a_turn_is_not_started_in_place_past_a_gate_or_ahead_of_an_urgent_plain_job(store):
    head, second = keyed(store, 2, "k")
    (claim,) = store.claim_keyed([str(head.id)], W, 30)
    (row,), claims = settle_turning(store, claim, queues=("other",))  # not a queue served here
    assert claims == [] and row.turn.id == second.id
    (claim,) = store.claim_keyed([str(second.id)], W, 30)
    third = keyed(store, 1, "k")[0]
    urgent = enqueue(store, None, "t.fast", push=False, priority=9)
    (row,), claims = settle_turning(store, claim)  # it would overtake a more urgent job
    assert claims == [] and row.turn.id == third.id
    store.claim_jobs([urgent.id], W, 30)
    (claim,) = store.claim_keyed([str(third.id)], W, 30)
    fourth = keyed(store, 1, "k")[0]
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO taskline.queue_pauses (queue) VALUES ('default')"))
    (row,), claims = settle_turning(store, claim)  # its queue is paused
    assert claims == [] and row.turn.id == fourth.id
    assert store.get_job(fourth.id).status == "queued"
