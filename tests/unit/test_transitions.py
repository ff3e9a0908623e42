"""The lifecycle's table and constructors (pure), and the SQL that must agree with them."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from taskline import transitions as t
from taskline.jobs import PENDING, Backoff, Event, Outcome, Status
from taskline.store.queries import load_queries, packaged_sql

SQL = packaged_sql()
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"
# The fence's rule spelled out, within one string (a quote or a semicolon ends the search).
FENCE = re.compile(r"released_at IS NULL[^;\"]*?status = 'running'\) IS TRUE[^;\"]*?"
                   r"attempts = l\.attempt")
FENCE_VIEWS = ("live_leases", "live_leases_by_id")


def test_every_pair_of_the_table_has_one_target_but_recovery() -> None:
    ambiguous = {key for key, targets in t.TABLE.items() if len(targets) > 1}
    assert ambiguous == {(Status.RUNNING, Event.RECOVERED)}
    assert t.TABLE[(Status.RUNNING, Event.RECOVERED)] == {Status.QUEUED, Status.DEAD}


def test_terminal_states_leave_only_by_a_requeue_of_the_dead_or_by_expiry() -> None:
    terminal = (Status.SUCCEEDED, Status.CANCELLED, Status.DEAD)
    leaving = {(source, event) for (source, event) in t.TABLE if source in terminal}
    assert leaving == {(Status.DEAD, Event.REQUEUED), (Status.DEAD, Event.PURGED)} | {
        (s, Event.EXPIRED) for s in terminal}


def test_only_finished_jobs_expire_and_only_into_the_deleted_pseudo_state() -> None:
    assert t.EXPIRE.sources == {Status.SUCCEEDED, Status.CANCELLED, Status.DEAD}
    assert {key: targets for key, targets in t.TABLE.items() if t.Gone.DELETED in targets} == {
        **{(s, Event.EXPIRED): {t.Gone.DELETED} for s in t.EXPIRE.sources},
        (Status.DEAD, Event.PURGED): {t.Gone.DELETED}}
    assert [s for s in Status if t.expirable(s)] == [Status.SUCCEEDED, Status.DEAD,
                                                     Status.CANCELLED]
    assert "deleted" not in {s.value for s in Status}  # no row, and no API filter, holds it
    assert not t.EXPIRE.ends_attempt and not t.EXPIRE.finishes


def test_only_a_dead_job_is_purged_and_redis_forgets_it_from_the_dlq() -> None:
    assert t.PURGE.sources == {Status.DEAD} and t.PURGE.target is t.Gone.DELETED
    assert t.PURGE.step is t.Step.FORGET and not t.PURGE.ends_attempt
    assert t.status_after("purged") == "deleted"


def test_finished_at_is_stamped_by_exactly_the_moves_into_a_terminal_state() -> None:
    stamping = {name for name, move in t.MOVES.items() if move.finishes}
    assert stamping == {"succeed", "dead", "recover_dead", "stop_cancelled", "cancel", "lapse"}
    queries = {name: str(q) for name, q in load_queries().items()}
    assert "finished_at = now()" in queries["cancel_pending_job"]
    assert "finished_at = now()" in queries["lapse_due"]
    assert "finished_at = NULL" in queries["requeue_dead_job"]
    assert "finished_at = CASE WHEN CAST(leases.s ->> 'finishes' AS boolean) THEN now() END" in (
        queries["settle"])
    assert t.SUCCEED.finishes and "finished_at = now()" in queries["settle_succeeded"]


def test_only_unstarted_jobs_are_cancelled_outright_and_new_jobs_start_pending_or_waiting(
) -> None:
    assert t.CANCEL.sources == PENDING | {Status.WAITING}
    assert {m.target for m in t.CREATED.values()} == {Status.QUEUED, Status.SCHEDULED,
                                                      Status.WAITING}
    assert dict(t.FIRST_EVENTS) == {"queued": "enqueued", "scheduled": "scheduled",
                                    "waiting": "waiting"}


def test_a_waiting_step_is_in_no_redis_structure_until_unblocked() -> None:
    assert Status.WAITING not in PENDING and not Status.WAITING.terminal
    assert t.WAIT.step is t.Step.NONE and t.UNBLOCK.step is t.Step.PUSH
    assert t.TABLE[(Status.WAITING, Event.UNBLOCKED)] == {Status.QUEUED}
    assert t.status_after("unblocked") == "queued" and t.status_after("waiting") == "waiting"


@pytest.mark.parametrize("build", [
    lambda: t.Transition(t.SUCCEED),  # an attempt-ending move without its outcome
    lambda: t.Transition(t.SUCCEED, Outcome.FAILED),
    lambda: t.Transition(t.RETRY, Outcome.LOST, delay_s=1.0),
    lambda: t.Transition(t.DEAD, Outcome.FAILED, delay_s=1.0),  # only a retry has a delay
    lambda: t.Transition(t.RETRY, Outcome.FAILED),
    lambda: t.Transition(t.CANCEL, Outcome.CANCELLED),  # a pending cancel ends no attempt
])
def test_inconsistent_transitions_cannot_be_built(build) -> None:
    with pytest.raises(ValueError):
        build()


def test_constructors_fix_status_event_outcome_and_dlq_row() -> None:
    cases = [
        (t.succeeded({"n": 1}), Status.SUCCEEDED, Event.SUCCEEDED, Outcome.SUCCEEDED, False),
        (t.retry("e", 2.0, reason="r"), Status.RETRYING, Event.RETRY_SCHEDULED, Outcome.FAILED,
         False),
        (t.dead("e", outcome=Outcome.TIMEOUT, reason="r"), Status.DEAD, Event.DEAD_LETTERED,
         Outcome.TIMEOUT, True),
        (t.recovered("w", last=False), Status.QUEUED, Event.RECOVERED, Outcome.LOST, False),
        (t.recovered("w", last=True), Status.DEAD, Event.RECOVERED, Outcome.LOST, True),
        (t.handed_back(), Status.QUEUED, Event.RELEASED, Outcome.RELEASED, False),
        (t.cancelled_while_running("c"), Status.CANCELLED, Event.CANCELLED, Outcome.CANCELLED,
         False),
    ]
    for transition, status, event, outcome, dead_letter in cases:
        assert (transition.target, transition.event, transition.outcome,
                transition.move.dead_letter) == (status, event, outcome, dead_letter)
    assert t.recovered("w-1", last=True).detail == {"cause": "lease_expired", "status": "dead"}
    assert t.handed_back().move.refunds_attempt and not t.handed_back().move.writes_error


def test_decide_retry_counts_attempts_at_claim() -> None:
    backoff = Backoff(1, 2, 10)
    assert t.decide_retry(1, 2, backoff, "e").move is t.RETRY
    assert t.decide_retry(2, 2, backoff, "e").move is t.RETRY
    final = t.decide_retry(3, 2, backoff, "e")
    assert final.move is t.DEAD and "exhausted" in final.reason
    assert t.decide_retry(1, 0, backoff, "e").move is t.DEAD


def test_decide_retry_non_retryable_override_and_backoff() -> None:
    backoff = Backoff(1, 2, 10)
    assert t.decide_retry(1, 5, backoff, "e", retryable=False).move is t.DEAD
    override = t.decide_retry(1, 5, backoff, "e", delay_override_s=42)
    assert override.delay_s == 42 and override.detail["delay_s"] == 42
    jittered = t.decide_retry(2, 5, backoff, "e", rng=random.Random(3))
    assert jittered.delay_s == Backoff(1, 2, 10).delay(2, random.Random(3))
    timed_out = t.decide_retry(1, 5, backoff, "e", outcome=Outcome.TIMEOUT, detail={"x": 1})
    assert timed_out.outcome is Outcome.TIMEOUT and timed_out.detail["x"] == 1


def test_the_reaper_decides_by_the_same_rule_as_a_failed_attempt() -> None:
    backoff = Backoff(1, 2, 10)
    for attempts, max_retries in [(1, 0), (1, 3), (3, 3), (4, 3), (9, 3)]:
        failed_dead = t.decide_retry(attempts, max_retries, backoff, "e").move is t.DEAD
        recovered_dead = t.decide_recovery(attempts, max_retries, "w").move is t.RECOVER_DEAD
        assert failed_dead == recovered_dead == t.exhausted(attempts, max_retries)


def test_status_after_comes_from_the_table() -> None:
    assert t.status_after("retry_scheduled") == "retrying"
    assert t.status_after("released") == "queued"
    assert t.status_after("recovered", "dead") == "dead"
    assert t.status_after("cancel_requested") is None


def test_the_attempt_fence_and_the_dlq_upsert_are_written_once_in_sql() -> None:
    migrations = "\n".join(p.read_text() for p in sorted(MIGRATIONS.glob("*.py")))
    assert len(FENCE.findall(SQL)) == 0, (
        "taskline/store/sql spells the fence out: use live_leases_by_id")
    spelled = list(FENCE.finditer(migrations))
    assert spelled, "the migrations define the fence"
    for match in spelled:
        before = migrations[:match.start()]
        view = before.rsplit("CREATE OR REPLACE VIEW ", 1)[1]
        assert view.split()[0] in FENCE_VIEWS and '"' not in view, (
            "a migration spells the fence out other than as its view's definition")
    assert SQL.count("INSERT INTO taskline.dead_letter_jobs") == 1
    ended = [name for name, q in load_queries().items()
             if "released_at = clock_timestamp()" in str(q)]
    # settle_releasing and settle_turning are settle's own text, composed at load time
    # (taskline.store.queries), with a workflow step's release or a key's next start in place of
    # its final SELECT.
    # settle_succeeded is settle's special case for a batch of plain successes: its effects
    # are held to settle's by tests/integration/test_settle_succeeded.py.
    assert sorted(ended) == ["settle", "settle_releasing", "settle_succeeded",
                             "settle_turning"], "only settle ends an attempt"


def test_literal_states_in_sql_agree_with_the_table() -> None:
    queries = {name: str(q) for name, q in load_queries().items()}
    assert "status = 'queued'" in queries["claim_jobs"]
    assert t.CLAIM.source_names == ["queued"]
    promote = re.search(r"status IN \(([^)]*)\)", queries["promote_due"]).group(1)
    assert sorted(re.findall(r"'(\w+)'", promote)) == t.PROMOTE.source_names
    for name in ("expire_finished", "oldest_finished"):  # never an unfinished job
        for states in re.findall(r"status IN \(([^)]*)\)", queries[name]):
            assert sorted(re.findall(r"'(\w+)'", states)) == t.EXPIRE.source_names, name


def test_committed_of_is_what_its_init_builds_unnamed_fields_at_their_defaults() -> None:
    move = t.CREATED[Status.QUEUED]
    built = t.Committed.of({"move": move, "job_id": "j", "queue": "q", "priority": 3,
                            "due_ms": None})
    assert built == t.Committed(move, "j", "q", 3, due_ms=None)
    assert (built.worker_id, built.left) == (None, None)
