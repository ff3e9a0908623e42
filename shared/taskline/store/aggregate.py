"""What every aggregate of the store runs on: named statements and transactions.

`Store` (taskline.store.store) is one class over every aggregate (jobs, dead letters,
workflows, schedules, workers, audit), each a mixin of its own module built on `Aggregate`;
`Store` provides these members, and callers keep calling `Store`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection


class Aggregate:
    """The members of `Store` an aggregate's statements use."""

    schema: str
    max_queues: int

    def _run(self, name: str, params: dict[str, Any], conn: Connection | None = None) -> list:
        raise NotImplementedError

    def _refusing(self, rows: list) -> list:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError
