"""Loads the named SQL in queries.sql once.

`-- name: x` starts a block; the comment line after it describes the query.
"""

from __future__ import annotations

import re
from importlib import resources

from sqlalchemy import TextClause, text

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(source: str | None = None) -> dict[str, TextClause]:
    """Parse `source` (default: the packaged queries.sql) into named, compiled statements."""
    if source is None:
        source = resources.files("taskline.store").joinpath("queries.sql").read_text()
    parts = _NAME.split(source)
    queries: dict[str, TextClause] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        queries[name] = text(sql.strip().rstrip(";"))
    return queries
