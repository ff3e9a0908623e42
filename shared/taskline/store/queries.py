"""Loads the named SQL in queries.sql once.

`-- name: x` starts a block; the comment line after it describes the query. A block named
`..._tail` is not a statement: see COMPOSED.
"""

from __future__ import annotations

import re
from importlib import resources

from sqlalchemy import TextClause, text

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
COMPOSED = {"settle_releasing": ("settle", "settle_releasing_tail")}
"""Statements built from another's text: (base, tail) -> the base's CTEs (all but its final
SELECT) followed by the tail, so the base's text is written once and both run the same SQL."""


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
    for name, (base, tail) in COMPOSED.items():
        if base in queries and tail in queries:
            ctes = queries[base].text[:queries[base].text.rindex("\nSELECT ")]
            queries[name] = text(ctes + queries.pop(tail).text)
    return queries
