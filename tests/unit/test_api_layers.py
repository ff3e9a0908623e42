"""The API's routes call operations, never the store, the dispatcher or the Mirror.

lint-imports keeps `taskline.store` and `taskline.dispatch` out of the routes' imports; this
test covers what an import contract cannot see, the store, dispatcher and Mirror a route could
reach through `backends()`: a change goes through a use case (taskline_producer.operations),
a read through taskline_producer.operations.reads.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROUTES = Path(__file__).resolve().parents[2] / "services" / "producer" / "routes"


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


def test_routes_reach_no_backend_but_through_an_operation() -> None:
    reached = {}
    for path in sorted(ROUTES.glob("*.py")):
        for holder, member in _reached(ast.parse(path.read_text())):
            reached.setdefault(path.name, []).append(f"{holder}.{member}")
    assert reached == {}, "move these into taskline_producer.operations (reads for a read)"


def test_the_check_sees_a_change_made_in_a_route() -> None:
    tree = ast.parse("def f():\n    b = backends()\n    with b.store.transaction() as c:\n"
                     "        b.store.pause_queue('q', None, c)\n    b.mirror.follow([])\n")
    assert sorted(_reached(tree)) == [("mirror", ""), ("mirror", "follow"),
                                      ("store", "pause_queue"), ("store", "transaction")]
