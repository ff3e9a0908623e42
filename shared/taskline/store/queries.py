"""Loads the named SQL of the files in sql/ (one per aggregate) once per schema.

Every `*.sql` file of taskline/store/sql is loaded, and a query name is unique across them
(loading fails on a name defined twice), so a statement is found by its name alone and a
file holds the statements of one aggregate. `-- name: x` starts a block; the comment line
after it describes the query. A block named `..._tail` is not a statement: see COMPOSED. Nor
is one named `..._ctes`: a fragment of CTEs that statements take in where a line reads
`-- include: <name>`, so it is written once (in any file).

Every relation in the SQL files is written qualified by the default schema (`taskline.jobs`)
and every notification channel with its name (`'taskline_enqueued'`); loading for another
TASKLINE_SCHEMA rewrites both, so each statement names the schema itself and none depends on
a connection's `search_path` (an application's connection, or one behind a transaction
pooler, where session state is not ours to set).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources

from sqlalchemy import TextClause, text

DEFAULT_SCHEMA = "taskline"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_QUALIFIED = re.compile(rf"(?<![\w.]){DEFAULT_SCHEMA}\.(?=[a-z_])")
_INCLUDE = re.compile(r"^-- include: (\w+)\s*$", re.MULTILINE)
_CHANNEL = re.compile(rf"'{DEFAULT_SCHEMA}_(enqueued\w*)'")
COMPOSED = {"settle_releasing": ("settle", "settle_releasing_tail"),
            "settle_turning": ("settle", "settle_turning_tail")}
"""Statements built from another's text: (base, tail) -> the base's CTEs (all but its final
SELECT) followed by the tail, so the base's text is written once and both run the same SQL."""


def channel(schema: str, name: str) -> str:
    """The notification channel `name` (`enqueued`, `enqueued_jobs`) of the installation in
    `schema`: two installations in one database never hear each other's signals."""
    return f"{schema}_{name}"


def in_schema(sql: str, schema: str) -> str:
    """`sql`, written for the default schema, rewritten for `schema`."""
    if schema == DEFAULT_SCHEMA:
        return sql
    sql = _QUALIFIED.sub(f"{schema}.", sql)
    return _CHANNEL.sub(lambda m: f"'{channel(schema, m.group(1))}'", sql)


def sql_files() -> dict[str, str]:
    """{file name: text} of the packaged SQL files (taskline/store/sql/*.sql), by name."""
    folder = resources.files("taskline.store").joinpath("sql")
    found = (entry for entry in folder.iterdir() if entry.name.endswith(".sql"))
    return {entry.name: entry.read_text() for entry in sorted(found, key=lambda e: e.name)}


def packaged_sql() -> str:
    """The text of every packaged SQL file, one after the other (what load_queries parses)."""
    return "\n".join(sql_files().values())


def query_files(files: Mapping[str, str] | None = None) -> dict[str, str]:
    """{query name: the file defining it} over `files` (default: the packaged ones); a
    ValueError naming both files when a name is defined in two."""
    where: dict[str, str] = {}
    for file, source in (sql_files() if files is None else files).items():
        for name in _NAME.findall(source):
            if name in where:
                raise ValueError(f"query {name!r} is defined in {where[name]} and in {file}")
            where[name] = file
    return where


def load_queries(source: str | None = None,
                 schema: str = DEFAULT_SCHEMA) -> dict[str, TextClause]:
    """Parse `source` (default: the packaged SQL files, none defining a name another defines)
    into named, compiled statements for the installation in `schema`."""
    if source is None:
        files = sql_files()
        query_files(files)
        source = "\n".join(files.values())
    parts = _NAME.split(source)
    queries: dict[str, TextClause] = {}
    blocks = list(zip(parts[1::2], parts[2::2], strict=True))
    fragments = {name: body for name, body in blocks if name.endswith("_ctes")}
    for name, body in blocks:
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        if name in fragments:
            continue
        body = _INCLUDE.sub(lambda m: fragments[m.group(1)], body)
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        queries[name] = text(in_schema(sql.strip().rstrip(";"), schema))
    for name, (base, tail) in COMPOSED.items():
        if base in queries and tail in queries:
            ctes = queries[base].text[:queries[base].text.rindex("\nSELECT ")]
            queries[name] = text(ctes + queries.pop(tail).text)
    return queries


@functools.cache
def queries_for(schema: str) -> dict[str, TextClause]:
    """The packaged queries for `schema`, parsed once per process and schema."""
    return load_queries(schema=schema)
