"""Every place outside taskline.jobs that spells out the job states agrees with `Status`.

A state added in one place only fails here, and the failing assertion names the place to touch.
The places that cannot be generated from `Status` (a frozen migration, the OpenAPI document,
the dashboard's script, SQL the planner matches by text) are read as text and compared.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from taskline import transitions
from taskline.jobs import CANCELLABLE, REDIS_HOME, TERMINAL, Status
from taskline.store import schema
from taskline.store.queries import packaged_sql
from taskline.uniquespec import UNFINISHED
from taskline_producer.schemas import shapes

ROOT = Path(__file__).resolve().parents[2]
STATES = {s.value for s in Status}
SQL = re.sub(r"--[^\n]*", "", packaged_sql())
DASHBOARD = (ROOT / "services" / "producer" / "static" / "dashboard.js").read_text()
OPENAPI = json.loads((ROOT / "services" / "producer" / "openapi.json").read_text())
API_DOCS = (ROOT / "docs" / "api.md").read_text()
QUOTED = re.compile(r"'(\w+)'")


def _js_list(pattern: str) -> list[str]:
    found = re.search(pattern, DASHBOARD)
    assert found, f"dashboard.js: {pattern!r} not found"
    return json.loads(found.group(1))


def test_every_state_has_a_redis_home_and_a_move_into_it() -> None:
    assert set(REDIS_HOME) == set(Status), "taskline.jobs.REDIS_HOME: one home per state"
    targets = {move.target for move in transitions.MOVES.values()}
    assert set(Status) <= targets, "taskline.transitions: a move into every state"


def test_the_check_constraint_lists_the_states() -> None:
    check = next(c for c in schema.jobs.constraints if c.name == "jobs_status_allowed")
    assert set(QUOTED.findall(str(check.sqltext))) == STATES, "taskline.store.schema CHECK"
    migration, states = _newest_migration_check()
    assert set(QUOTED.findall(states)) == STATES, (
        f"migrations/versions/{migration}: a new state needs a migration that replaces "
        "the CHECK constraint jobs_status_allowed (NOT VALID, then VALIDATE)")


def _newest_migration_check() -> tuple[str, str]:
    """(file, state list) of the newest migration that sets the CHECK, read from its upgrade
    (its downgrade restores an older list)."""
    found = None
    for path in sorted((ROOT / "migrations" / "versions").glob("*.py")):
        upgrade = path.read_text().split("def downgrade")[0]
        if "jobs_status" in upgrade and "CHECK" in upgrade:
            for states in re.findall(r"\('scheduled',[^)]*\)", upgrade):
                found = (path.name, states)
    assert found is not None
    return found


def test_the_openapi_job_status_enum_is_the_states_in_their_order() -> None:
    enum = OPENAPI["components"]["schemas"]["JobStatus"]["enum"]
    assert enum == [s.value for s in Status], "services/producer/openapi.json JobStatus"


def test_the_dashboard_knows_every_state() -> None:
    stages = _js_list(r"const STAGES = (\[[^\]]*\]);")
    assert sorted(stages) == sorted(STATES), "static/dashboard.js STAGES"
    counted = _js_list(r"for \(const stage of (\[[^\]]*\]).*setCount")
    assert sorted(counted) == sorted(shapes.STATUSES), "static/dashboard.js applyQueues"
    cancel = _js_list(r"if \((\[[^\]]*\])\.includes\(job\.status\)\) \{\s*const cancel")
    assert {Status(s) for s in cancel} == CANCELLABLE, "static/dashboard.js cancel button"


def test_queue_counts_cover_every_state_but_success_and_cancellation() -> None:
    # Finished successes and cancellations are history, not a queue's contents.
    assert set(shapes.STATUSES) == STATES - {"succeeded", "cancelled"}, (
        "taskline_producer.schemas.shapes.STATUSES")
    counts = OPENAPI["components"]["schemas"]["StatusCounts"]
    assert sorted(counts["required"]) == sorted(shapes.STATUSES), "openapi.json StatusCounts"
    assert sorted(counts["properties"]) == sorted(shapes.STATUSES), "openapi.json StatusCounts"


def test_the_api_docs_list_every_state_as_a_filter() -> None:
    row = re.search(r"^\| `status` \| one of `([^`]*)` \|$", API_DOCS, re.M)
    assert row, "docs/api.md: the `status` filter row"
    assert row.group(1).split() == [s.value for s in Status], "docs/api.md status filter"


def test_unique_keys_hold_while_unfinished_by_default() -> None:
    assert set(UNFINISHED) == {s.value for s in Status if s not in TERMINAL}


def test_state_literals_in_sql_are_states() -> None:
    compared = re.findall(r"status\s*(?:=|<>|!=)\s*'(\w+)'", SQL)
    listed = [name for group in re.findall(r"status\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", SQL)
              for name in QUOTED.findall(group)]
    assert compared and listed
    assert set(compared + listed) <= STATES, "taskline/store/sql: an unknown state"
    for text in (schema.PENDING_SQL, schema.TERMINAL_SQL):
        assert set(QUOTED.findall(text)) <= STATES, "taskline.store.schema"


def test_every_status_assignment_takes_its_target_from_the_transitions_table() -> None:
    """`SET status = 'x'` would be a move the table does not know: targets are parameters
    (`:target`, `:cascade_target`, `:release_target` from a Move), the settle document built
    from the table, or the row's own status."""
    assignments = re.findall(r"(?:\bSET\s+|,\s*)(?:\w+\.)?status\s*=\s*(CASE\b.*?\bEND|[^,\n]+)",
                             SQL, re.S)
    assert len(assignments) >= 10
    for value in assignments:
        assert not set(QUOTED.findall(value)) & STATES, f"taskline/store/sql: SET status = {value}"
