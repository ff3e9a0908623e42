"""The audit's job shape (taskline.audit_verify.Page): what the rules about one job read of a job
with at most one lease is exactly what its shape holds, so a shape judged clean once is clean
for every job that has it, and the audit may skip their rows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from taskline.audit_verify import job_violations

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# What the reader puts in a shape (taskline.store.history: status, attempts; each event's
# name and recorded state; each lease's attempt, outcome and whether released_at is NULL),
# and the ids the rules name a violation by.
SHAPED = {"job": {"id", "status", "attempts"}, "event": {"id", "event", "recorded"},
          "lease": {"id", "attempt", "outcome", "released_at"}}


class Recording(dict):
    """A row that notes each key the rules read of it."""

    def __init__(self, kind: str, read: set[tuple[str, str]], **row: object) -> None:
        super().__init__(row)
        self.kind, self.read = kind, read

    def __getitem__(self, key: str) -> object:
        self.read.add((self.kind, key))
        return super().__getitem__(key)

    def get(self, key: str, default: object = None) -> object:
        self.read.add((self.kind, key))
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add((self.kind, str(key)))
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        self.read.add((self.kind, "*"))  # a rule reading every field: no shape covers it
        return super().__iter__()


def history(end: str, outcome: str, read: set[tuple[str, str]]) -> tuple:
    job = Recording("job", read, id="j", status=end, attempts=1, type="t", queue="q",
                    created_at=T0, limit_key=None, run_when=None, ordering_key=None)
    events = [Recording("event", read, id=n, event=name, recorded=None, cause=None, attempt=1,
                        created_at=T0 + timedelta(seconds=n), xid="7")
              for n, name in enumerate(["enqueued", "claimed",
                                        "succeeded" if end == "succeeded" else "dead_lettered"])]
    lease = Recording("lease", read, id=1, attempt=1, outcome=outcome, worker_id="w",
                      leased_at=T0, leased_until=T0 + timedelta(seconds=30),
                      released_at=T0 + timedelta(seconds=2))
    return job, events, [lease]


@pytest.mark.parametrize(("end", "outcome", "clean"), [
    ("succeeded", "succeeded", True), ("dead", "failed", True), ("succeeded", "failed", False)])
def test_the_rules_about_one_job_read_only_what_its_shape_holds(end, outcome, clean):
    read: set[tuple[str, str]] = set()
    assert (job_violations(*history(end, outcome, read)) == []) is clean
    outside = {(kind, key) for kind, key in read if key not in SHAPED[kind]}
    assert not outside, f"the rules read {sorted(outside)}: add them to the reader's shape"
