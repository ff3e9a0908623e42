"""The fault checker's own lifecycle model: it judges histories, and agrees with the product's
table without being derived from it (a disagreement means one of the two is wrong)."""

from __future__ import annotations

from taskline import transitions
from tests.faults.checker import LEGAL, transition_violations


def history(*events: str | tuple[str, str]) -> list[dict]:
    rows = []
    for n, item in enumerate(events, start=1):
        name, status = item if isinstance(item, tuple) else (item, None)
        rows.append({"id": n, "event": name, "detail": {"status": status} if status else None})
    return rows


def test_a_legal_history_ending_in_the_current_state_passes():
    events = history("enqueued", "claimed", ("recovered", "queued"), "claimed",
                     "retry_scheduled", "promoted", "claimed", "cancel_requested", "succeeded")
    assert transition_violations({"status": "succeeded"}, events) == []
    dead_then_requeued = history("scheduled", "promoted", "claimed", ("recovered", "dead"),
                                 "requeued", "claimed", "released")
    assert transition_violations({"status": "queued"}, dead_then_requeued) == []


def test_an_illegal_move_is_caught():
    (problem,) = transition_violations({"status": "succeeded"},
                                       history("enqueued", "succeeded"))
    assert "illegal transition: succeeded" in problem and "queued" in problem
    (twice,) = transition_violations({"status": "succeeded"}, history(
        "enqueued", "claimed", "succeeded", "succeeded"))
    assert "illegal" in twice


def test_a_history_that_ends_elsewhere_than_the_row_is_caught():
    (problem,) = transition_violations({"status": "dead"}, history("enqueued", "claimed"))
    assert "ends in state running but the job is dead" in problem
    (recorded,) = transition_violations({"status": "queued"}, history(
        "enqueued", "claimed", ("recovered", "limbo")))
    assert "records state limbo" in recorded


def test_the_checker_and_the_product_agree_on_every_move():
    product = {(None if s is None else s.value, e.value): {t.value for t in targets}
               for (s, e), targets in transitions.TABLE.items()}
    assert product == {key: set(targets) for key, targets in LEGAL.items()}
