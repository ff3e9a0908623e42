"""The fault checker's unique and debounce invariants (tests/faults/uniquecheck.py) fail on
the histories they exist to catch, and pass on a clean one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.faults.uniquecheck import debounce_violations, unique_violations

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _rows(rows: list[dict]) -> Any:
    return lambda sql, params=(): rows


def _job(job_id: str, created_s: float, finished_s: float | None) -> dict:
    return {"id": job_id, "queue": "q", "unique_key": "k",
            "created_at": T0 + timedelta(seconds=created_s),
            "finished_at": None if finished_s is None else T0 + timedelta(seconds=finished_s)}


def test_unique_jobs_in_sequence_are_clean() -> None:
    assert unique_violations(_rows([_job("a", 0, 1), _job("b", 1, 2), _job("c", 3, None)])) == []


def test_a_second_job_while_the_first_is_unfinished_is_a_violation() -> None:
    assert len(unique_violations(_rows([_job("a", 0, None), _job("b", 1, None)]))) == 1
    assert len(unique_violations(_rows([_job("a", 0, 5), _job("b", 1, 6)]))) == 1


def _debounced(job_id: str, arrivals: list[str], ran: list[str] | None,
               status: str = "succeeded") -> dict:
    payloads = [{"arrival": a} for a in arrivals]
    result = None if ran is None else {"coalesced": [{"arrival": a} for a in ran]}
    return {"id": job_id, "status": status, "coalesced": payloads, "result": result}


def test_debounce_clean() -> None:
    rows = [_debounced("j1", ["a", "b"], ["a", "b"]), _debounced("j2", ["c"], None, "queued")]
    acked = [{"arrival": "a", "job_id": "j1"}, {"arrival": "b", "job_id": "j1"},
             {"arrival": "c", "job_id": "j2"}, {"arrival": "lost", "job_id": None}]
    assert debounce_violations(_rows(rows), acked) == []


def test_debounce_violations_are_found() -> None:
    rows = [_debounced("j1", ["a", "b"], ["a"]), _debounced("j2", ["b"], ["b"])]
    acked = [{"arrival": "a", "job_id": "j2"}, {"arrival": "gone", "job_id": "j1"}]
    found = debounce_violations(_rows(rows), acked)
    assert any("ran with 1 payloads but holds 2" in v for v in found)  # a payload missed
    assert any("arrival b is in jobs" in v for v in found)  # one arrival in two jobs
    assert any("arrival a was answered with job j2" in v for v in found)
    assert any("arrival gone" in v for v in found)  # acknowledged, held by none
