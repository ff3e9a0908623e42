"""deploy/Dockerfile keeps the image's promises without a Docker engine to build it: a builder
stage and a slim final stage, no compiler or source tree in the final stage, a non-root user,
and an exec-form ENTRYPOINT so signals reach `taskline` itself (graceful shutdown needs that)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile as stages of (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "deploy" / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
    return stages


@pytest.fixture(scope="module")
def final() -> list[tuple[str, str]]:
    return _stages()[-1]


def test_two_stages_ending_on_python_slim():
    stages = _stages()
    assert len(stages) >= 2
    assert stages[-1][0] == ("FROM", "python:3.11-slim")


def test_final_stage_takes_only_the_built_venv(final):
    copies = [args for instruction, args in final if instruction in ("COPY", "ADD")]
    assert copies and all(args.startswith("--from=") for args in copies)
    runs = " ".join(args for instruction, args in final if instruction == "RUN")
    assert not re.search(r"\b(gcc|build-essential|apt-get install|pip install)\b", runs)


def test_runs_as_a_non_root_user(final):
    users = [args for instruction, args in final if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_entrypoint_is_exec_form_taskline(final):
    (entrypoint,) = [args for instruction, args in final if instruction == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["taskline"]


def test_dockerignore_keeps_local_state_out_of_the_context():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".data"} <= ignored
