"""What a request waiting with `wait_s` asks before it reads: that the finish it waits for be
signalled at the commit that finishes it (`jobs.watched`; taskline.store.watching).

A job's finish is signalled only when someone asked: an unwatched job's finish costs the
trigger's WHEN test and nothing else. Asking twice is a statement that changes nothing.
"""

from __future__ import annotations

import uuid

from taskline_producer.operations.backends import backends


def watch_job(job_id: uuid.UUID) -> None:
    backends().store.watch_finish(job_ids=[job_id])


def watch_workflow(workflow_id: uuid.UUID) -> None:
    """Every step not finished yet: whichever finishes last ends the workflow."""
    backends().store.watch_finish(workflow_ids=[workflow_id])
