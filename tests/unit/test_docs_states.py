"""docs/states.md prints the lifecycle's table: it must list exactly the moves in the code."""

from __future__ import annotations

import re
from pathlib import Path

from taskline import transitions

DOC = Path(__file__).resolve().parents[2] / "docs" / "states.md"
ROW = re.compile(r"^\| `(\w+)` \| ([^|]+) \| `(\w+)` \| (\w+) \| ([^|]+) \| `(\w+)` \|", re.M)


def _names(cell: str) -> set[str]:
    cell = cell.strip()
    return set() if cell in ("(new)", "—") else {part.strip() for part in cell.split(",")}


def test_every_move_is_documented_as_the_code_defines_it():
    rows = {m[0]: m[1:] for m in ROW.findall(DOC.read_text())}
    assert set(rows) == set(transitions.MOVES)
    for name, move in transitions.MOVES.items():
        sources, event, target, outcomes, step = rows[name]
        assert _names(sources) == {s.value for s in move.sources}, name
        assert (event, target, step) == (move.event.value, move.target.value, move.step.value)
        assert _names(outcomes) == {o.value for o in move.outcomes}, name
