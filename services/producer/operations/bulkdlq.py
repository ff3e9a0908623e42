"""Bulk dead-letter moves: requeue or purge the dead jobs matching a filter, batch by batch.

Invariant: a call acts on at most `limit` dead jobs matching its filter, in batches of at most
`BATCH_SIZE`, each one short transaction holding its audit record (`FOR UPDATE SKIP LOCKED`, so
a batch never waits for rows another call holds, and conditional on the job still being dead,
the REQUEUE or PURGE move's source), and Redis follows each batch after its commit. So two
concurrent calls act on each job once, and a call stops starting batches after
`TIME_BUDGET_S`, well inside the API's 30 s request timeout, answering how many jobs still
match (`remaining`), which a caller requeues or purges by calling again. A purge deletes each
job whole (events, leases, DLQ row) through `Store.purge_dead`, the one place that does.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from taskline.metrics import DLQ_BULK
from taskline.store.rows import DeadChanged
from taskline.store.store import DeadFilter
from taskline.store.views import ApiStore
from taskline_producer.http import auth
from taskline_producer.operations import auditing
from taskline_producer.operations.backends import backends
from taskline_producer.schemas.bulkspec import BulkRequest

log = logging.getLogger(__name__)

BATCH_SIZE = 500
"""Jobs per transaction: each batch holds its row locks for a few milliseconds only."""
TIME_BUDGET_S = 10.0
"""No batch starts after this many seconds of a call; the answer's `remaining` says the rest."""
_FIRST = uuid.UUID(int=0)
ACTIONS = ("dlq.retry", "dlq.purge")
for _action in ACTIONS:  # 0, not "no data", on a dashboard before the first bulk operation
    DLQ_BULK.labels(action=_action)

Batch = Callable[[ApiStore, DeadFilter, uuid.UUID, int, Connection], Sequence[DeadChanged]]


def run_batches(store: ApiStore, bulk: BulkRequest, batch: Batch, action: str,
                follow: Callable[[Sequence[DeadChanged]], None]) -> int:
    """Run `batch` until `bulk.limit` jobs are done, a batch comes back short, or the time
    budget is spent; each batch commits with its audit record, then `follow` mirrors it."""
    done, after = 0, _FIRST
    started = time.monotonic()
    while done < bulk.limit and time.monotonic() - started < TIME_BUDGET_S:
        size = min(BATCH_SIZE, bulk.limit - done)
        with store.transaction() as conn:
            rows = batch(store, bulk.match, after, size, conn)
            if rows:
                auditing.record_in(conn, action, None, {**bulk.described(), "jobs": len(rows)})
        if rows:
            DLQ_BULK.labels(action=action).inc(len(rows))
            follow(rows)
        done += len(rows)
        if len(rows) < size:
            break
        after = max(row.id for row in rows)
    return done


def _requeue(store: ApiStore, match: DeadFilter, after: uuid.UUID, size: int,
             conn: Connection) -> Sequence[DeadChanged]:
    return store.requeue_dead_batch(match, after, size, auth.principal().name, conn)


def _purge(store: ApiStore, match: DeadFilter, after: uuid.UUID, size: int,
           conn: Connection) -> Sequence[DeadChanged]:
    return store.purge_dead(match, after, size, conn, auth.principal().name)


def _follow(rows: Sequence[DeadChanged]) -> None:
    """Mirror a committed batch in Redis; on failure reconciliation repairs Redis later."""
    backends().mirror.follow([step for row in rows for step in row.follows()],
                             action="dlq_bulk")


def _follow_purged(rows: Sequence[DeadChanged]) -> None:
    for row in rows:
        # One record per job, as retention logs its deletions: the row and its history are gone.
        log.info("job purged", extra={"action": "purged", "job_id": str(row.id),
                                      "queue": row.queue, "type": row.type, "status": "dead"})
    _follow(rows)


@dataclass(frozen=True)
class BulkDone:
    """Jobs a bulk call moved, and how many dead jobs still match its filter."""
    done: int
    remaining: int


def retry(bulk: BulkRequest) -> BulkDone:
    """Requeue matching dead jobs, each with a fresh retry budget."""
    store = backends().store
    done = run_batches(store, bulk, _requeue, "dlq.retry", _follow)
    log.info("dead jobs requeued in bulk", extra={"action": "dlq_retry", "jobs": done})
    return BulkDone(done, store.count_dead_matching(bulk.match))


def purge(bulk: BulkRequest) -> BulkDone:
    """Delete matching dead jobs with their events, leases and DLQ rows."""
    store = backends().store
    done = run_batches(store, bulk, _purge, "dlq.purge", _follow_purged)
    return BulkDone(done, store.count_dead_matching(bulk.match))
