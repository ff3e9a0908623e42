"""Hand-back: gives jobs this worker holds back to their queue without counting an attempt.

Invariant: PostgreSQL first, then Redis. A released lease puts its job back to `queued` (the
attempt is not counted) and its id at the head of its ready list. An id left in this worker's
processing lists that was never claimed goes back only if PostgreSQL says the job is still
`queued`; ids of jobs that are anyone else's, terminal, waiting elsewhere or absent are acked
away; ids of jobs still running under this worker's lease stay for the reaper.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from taskline import transitions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.execution.attempts import Attempt
from taskline.jobs import Status, parse_job_id
from taskline.mirror import Mirror
from taskline.store.rows import Settlement
from taskline.store.views import WorkerStore

log = logging.getLogger(__name__)


class Handback:
    """Releases leases at shutdown and sweeps fetched-but-unclaimed ids back."""

    def __init__(self, store: WorkerStore, dispatcher: Dispatcher, worker_id: str,
                 queues: Sequence[str]) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._mirror = Mirror.of(dispatcher, store)
        self._worker_id = worker_id
        self._queues = list(queues)

    def release(self, attempts: Sequence[Attempt]) -> int:
        """Release these leases and requeue their jobs; returns how many were released."""
        rows = self._store.settle([Settlement(a.lease_id, self._worker_id,
                                              transitions.handed_back()) for a in attempts])
        # Workers claiming from PostgreSQL are notified when Redis cannot take the ids.
        self._mirror.follow([row.committed(transitions.HAND_BACK) for row in rows],
                            action="hand_back")
        by_id = {a.job_id: a for a in attempts}
        for row in rows:
            log.info("job handed back", extra=by_id[str(row.id)].log_extra("released"))
        return len(rows)

    def sweep(self) -> int:
        """Return unclaimed ids from this worker's processing lists; returns how many."""
        returned = 0
        for queue in self._queues:
            for partition in self._dispatcher.partitions_of(queue):
                key = QueueKeys(queue, partition).processing(self._worker_id)
                ids = self._dispatcher.list_range(key, 0, -1)
                if ids:
                    returned += self._sweep_ids(queue, ids, partition)
        return returned

    def _sweep_ids(self, queue: str, ids: list[str], partition: int) -> int:
        valid = [i for i in ids if parse_job_id(i) is not None]
        rows = self._store.statuses(valid)
        returned, seen, drop = 0, set(), []
        for job_id in ids:
            row = rows.get(job_id) if job_id not in seen else None
            seen.add(job_id)
            if row is not None and row.status == Status.QUEUED:
                returned += self._dispatcher.requeue(queue, row.priority, job_id,
                                                     self._worker_id, always=False,
                                                     partition=partition)
            elif row is None or not self._ours(row):
                drop.append((queue, job_id))
        self._dispatcher.ack(drop, self._worker_id, partition=partition)
        if returned or drop:
            log.info("processing list swept", extra={"action": "sweep", "queue": queue,
                                                      "worker": self._worker_id,
                                                      "returned": returned, "dropped": len(drop)})
        return returned

    def _ours(self, row: Any) -> bool:
        return row.status == Status.RUNNING and row.lease_worker == self._worker_id
