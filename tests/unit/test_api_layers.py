"""The API's routes read, and change nothing but through a use case.

lint-imports keeps `taskline.store` and `taskline.dispatch` out of the routes' imports; this
test covers what an import contract cannot see, the store and dispatcher the routes reach
through `backends()`: no transaction, no Mirror, and only reading methods.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROUTES = Path(__file__).resolve().parents[2] / "services" / "producer" / "routes"
READS = ("get_", "list_", "newest_", "dlq_groups", "queue_counts", "paused_queues",
         "workflow_step", "known_queues", "ping")


def _reached(tree: ast.AST) -> list[tuple[str, str]]:
    """(holder, member) for every `<x>.store.<member>`, `<x>.dispatcher.<member>` and
    `store.<member>` (a local bound to the store) in a module."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        holder = node.value
        if isinstance(holder, ast.Attribute) and holder.attr in ("store", "dispatcher", "mirror"):
            found.append((holder.attr, node.attr))
        elif isinstance(holder, ast.Name) and holder.id == "store":
            found.append(("store", node.attr))
        elif node.attr == "mirror":
            found.append(("mirror", ""))
    return found


def test_routes_change_nothing_but_through_a_use_case() -> None:
    changes = {}
    for path in sorted(ROUTES.glob("*.py")):
        for holder, member in _reached(ast.parse(path.read_text())):
            if holder == "mirror" or not member.startswith(READS):
                changes.setdefault(path.name, []).append(f"{holder}.{member}")
    assert changes == {}, "move these into a use case (taskline_producer.operations)"


def test_the_check_sees_a_change_made_in_a_route() -> None:
    tree = ast.parse("def f():\n    b = backends()\n    with b.store.transaction() as c:\n"
                     "        b.store.pause_queue('q', None, c)\n    b.mirror.follow([])\n")
    assert sorted(_reached(tree)) == [("mirror", ""), ("mirror", "follow"),
                                      ("store", "pause_queue"), ("store", "transaction")]
