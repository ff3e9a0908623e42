"""The workers' statements: registry and heartbeats, declared job types, and the maintenance
leader's lease."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from taskline.store.aggregate import Aggregate


class Workers(Aggregate):
    def upsert_worker(self, worker_id: str, hostname: str, pid: int, queues: Sequence[str],
                      concurrency: int, metrics_port: int | None = None,
                      cpus: Sequence[int] | None = None) -> None:
        self._run("upsert_worker", {"id": worker_id, "hostname": hostname, "pid": pid,
                                    "queues": list(queues), "concurrency": concurrency,
                                    "metrics_port": metrics_port,
                                    "cpus": None if cpus is None else list(cpus)})

    def heartbeat_worker(self, worker_id: str, active_jobs: int) -> None:
        self._run("heartbeat_worker", {"id": worker_id, "active_jobs": active_jobs})

    def stop_worker(self, worker_id: str) -> None:
        self._run("stop_worker", {"id": worker_id})

    def declare_types(self, worker_id: str, types: Sequence[Mapping[str, Any]],
                      ttl_s: float) -> None:
        """Replace `worker_id`'s declared types (each {"type", "queue", "schema"}) in one
        transaction, and forget those of workers unseen for `ttl_s` seconds."""
        with self.transaction() as conn:
            self._run("forget_declared_types", {"worker_id": worker_id, "ttl_s": ttl_s}, conn)
            if types:
                self._run("declare_types", {"worker_id": worker_id,
                                            "types": json.dumps(list(types))}, conn)

    def declared_schemas(self, ttl_s: float) -> dict[str, list[Any]]:
        """Type -> each payload schema (None: any payload) declared by a worker seen within
        `ttl_s` seconds; a type no such worker declared is absent."""
        schemas: dict[str, list[Any]] = {}
        for row in self._run("declared_schemas", {"ttl_s": ttl_s}):
            schemas.setdefault(row.type, []).append(row.schema)
        return schemas

    def list_declared_types(self, ttl_s: float) -> list[Any]:
        """(type, queue, schema, workers, last_seen) rows, newest first within each type."""
        return self._run("list_declared_types", {"ttl_s": ttl_s})

    def list_workers(self, within_s: float) -> list[dict]:
        return [dict(r._mapping) for r in self._run("list_workers", {"within_s": within_s})]

    def mark_silent_workers_stopped(self, silent_s: float) -> list[str]:
        return [r.id for r in self._run("mark_silent_workers_stopped", {"silent_s": silent_s})]

    def acquire_leader(self, name: str, holder: str, ttl_s: float) -> bool:
        return bool(self._run("acquire_leader", {"name": name, "holder": holder,
                                                 "ttl_s": ttl_s}))

    def release_leader(self, name: str, holder: str) -> None:
        self._run("release_leader", {"name": name, "holder": holder})
