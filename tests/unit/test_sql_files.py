"""The named SQL in files by aggregate: each store module runs the statements of its own files,
and a query name is defined once across all of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from taskline.store import queries
from taskline.store.queries import load_queries, query_files, sql_files

STORE = Path(queries.__file__).parent
OWN_FILES = {
    "store.py": {"jobs.sql", "attempts.sql", "flow.sql", "queues.sql", "maintenance.sql"},
    "deadletters.py": {"deadletters.sql"},
    # Cancelling a workflow's step is the job's own move (cancel_pending_job, cancel_running_job).
    "workflows.py": {"workflows.sql", "jobs.sql"},
    "schedules.py": {"schedules.sql"},
    "workers.py": {"workers.sql"},
    "audit.py": {"audit.sql"},
    # The audit judges a job against PostgreSQL's clock (database_now).
    "history.py": {"history.sql", "queues.sql"},
    "queries.py": {"attempts.sql"},  # COMPOSED: settle_releasing from settle's text
    "watching.py": {"jobs.sql"},  # a waiter's flag on the job's row (jobs.watched)
}
"""The SQL files whose statements each module of taskline.store names; a module not listed
names none."""


def _named_statements(module: Path, names: set[str]) -> set[str]:
    """The query names `module` spells as string literals (docstrings aside)."""
    tree = ast.parse(module.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in names and id(node) not in docstrings}


def test_each_store_module_runs_the_statements_of_its_own_files() -> None:
    where = query_files()
    for module in sorted(STORE.glob("*.py")):
        named = _named_statements(module, set(where))
        outside = {name: where[name] for name in named
                   if where[name] not in OWN_FILES.get(module.name, set())}
        assert not outside, f"taskline/store/{module.name} runs statements of other files"


def test_every_file_is_a_modules_own_and_every_module_names_its_files() -> None:
    where = query_files()
    owned = set().union(*OWN_FILES.values())
    assert owned == set(sql_files()), "a file of taskline/store/sql no module owns"
    for module, files in OWN_FILES.items():
        used = {where[name] for name in _named_statements(STORE / module, set(where))}
        assert used == files, f"taskline/store/{module}: its files are {sorted(used)}"


def test_a_name_defined_in_two_files_fails_to_load_naming_both() -> None:
    files = {"a.sql": "-- name: one\nSELECT 1;\n", "b.sql": "-- name: two\nSELECT 2;\n"}
    assert query_files(files) == {"one": "a.sql", "two": "b.sql"}
    files["b.sql"] += "-- name: one\nSELECT 3;\n"
    with pytest.raises(ValueError, match=r"'one' is defined in a\.sql and in b\.sql"):
        query_files(files)


def test_the_packaged_files_load_every_statement_once() -> None:
    loaded = load_queries()
    fragments = {name for name in query_files() if name.endswith(("_ctes", "_tail"))}
    composed = set(queries.COMPOSED)
    assert set(loaded) == set(query_files()) - fragments | composed
