"""Flagging the jobs a waiter watches (`jobs.watched`, migration 0028), so that the commit that
finishes one signals it on `<schema>_finished`: what the API's waits and `taskline.wait` run
before they read the state they wait on (taskline.finishing).

Invariant: it never deadlocks with the statements that finish jobs. One statement flags every
candidate whose row it can lock at once and skips those another transaction holds (a settle
of a batch holding a workflow's steps, say); each skipped row is then flagged by a statement of
its own, which waits for that row while holding no other lock, so it cannot close a cycle. Run
both in autocommit: a flag committed before a finish makes that finish signal; a finish
committed first is what the waiter's read then sees.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from taskline.jobs import TERMINAL

Run = Callable[[str, dict[str, Any]], list]
"""Runs a named statement in autocommit and returns its rows."""

FINISHED = sorted(status.value for status in TERMINAL)


def watch_finish(run: Run, job_ids: Iterable[uuid.UUID | str] = (),
                 workflow_ids: Iterable[uuid.UUID | str] = ()) -> None:
    """Flag the unfinished jobs `job_ids` and the unfinished steps of `workflow_ids`."""
    params = {"ids": [str(i) for i in job_ids], "workflow_ids": [str(i) for i in workflow_ids],
              "finished": FINISHED}
    for row in run("watch_finish", params):
        run("watch_finish_one", {"id": row.id, "finished": FINISHED})
