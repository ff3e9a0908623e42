"""Configuration cannot drift: every environment variable the code reads (the Settings fields,
plus each `os.environ` / `os.getenv` read in shared/, services/ and migrations/, found by
walking the syntax tree) is documented in `.env.example` and in the README's configuration
table, and neither documents a variable nothing reads. `.env.example` may also name the
variables docker-compose.yml interpolates (read by Compose, not by taskline). Documented
defaults are the code's defaults."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from taskline.settings import Settings, env_names

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("shared", "services", "migrations")
# Read by the code, deliberately not taskline settings; each with the reason.
NOT_SETTINGS = {
    "NO_COLOR": "the no-color.org convention, honoured by `taskline dev`'s console output",
}
_ENVIRON_CALLS = {("os", "environ", "get"), ("os", "getenv"), ("environ", "get")}


def _dotted(node: ast.AST) -> tuple[str, ...]:
    """`os.environ.get` as ("os", "environ", "get"); () for anything that is not a name chain."""
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return (*inner, node.attr) if inner else ()
    return ()


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "string" assignments, so `os.environ.get(SOME_ENV)` resolves."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _read_key(node: ast.AST) -> ast.AST | None:
    """The key expression of an environment read, or None when `node` is not one."""
    if isinstance(node, ast.Call) and _dotted(node.func) in _ENVIRON_CALLS and node.args:
        return node.args[0]
    if isinstance(node, ast.Subscript) and _dotted(node.value)[-1:] == ("environ",):
        return node.slice
    if (isinstance(node, ast.Compare) and len(node.comparators) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and _dotted(node.comparators[0])[-1:] == ("environ",)):
        return node.left
    return None


def scan(path: Path) -> tuple[set[str], list[str]]:
    """Variables read in one file, and reads whose variable is not a literal (listed)."""
    tree = ast.parse(path.read_text(), str(path))
    constants = _constants(tree)
    names, unresolved = set(), []
    for node in ast.walk(tree):
        key = _read_key(node)
        if key is None:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        elif isinstance(key, ast.Name) and key.id in constants:
            names.add(constants[key.id])
        else:
            unresolved.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return names, unresolved


def _scan_code() -> tuple[set[str], list[str]]:
    names, unresolved = set(), []
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found, vague = scan(path)
            names |= found
            unresolved += vague
    return names, unresolved


def code_variables() -> set[str]:
    """Every variable the code reads, less the deliberate non-settings."""
    return (set(env_names()) | _scan_code()[0]) - set(NOT_SETTINGS)


def env_example() -> dict[str, str]:
    """`.env.example` as NAME -> value: `NAME=value` lines, and `# NAME=value` lines for
    variables documented but deliberately left unset; other comment lines are prose."""
    pairs = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.fullmatch(r"#? ?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            pairs[match[1]] = match[2]
    return pairs


def readme_table() -> dict[str, str]:
    """The README's `## Configuration` table as variable -> default cell."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3:
            for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]):
                rows[name] = cells[1]
    return rows


def compose_variables() -> set[str]:
    """Variables docker-compose.yml interpolates (`${NAME}`, `${NAME:-default}`, nested too)."""
    return set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", (ROOT / "docker-compose.yml").read_text()))


def test_the_scan_finds_reads_outside_settings():
    # Guards the tests below: these are read with os.environ in the CLI and the api server.
    names, _ = _scan_code()
    assert {"TASKLINE_URL", "TASKLINE_TOKEN", "PROMETHEUS_MULTIPROC_DIR", "NO_COLOR"} <= names


def test_every_read_names_its_variable_literally():
    # A read through a computed name would escape this test: keep names greppable.
    assert _scan_code()[1] == []


def test_env_example_documents_every_variable_the_code_reads():
    assert code_variables() - set(env_example()) == set()


def test_env_example_documents_nothing_that_is_not_read():
    extra = set(env_example()) - code_variables() - compose_variables()
    assert extra == set()


def test_env_example_leaves_the_multiprocess_dir_unset():
    # Compose passes .env to every taskline service; prometheus-client switches to multiprocess
    # files as soon as the variable exists (even empty), which the worker must not do.
    lines = (ROOT / ".env.example").read_text().splitlines()
    assert not any(line.startswith("PROMETHEUS_MULTIPROC_DIR=") for line in lines)


def test_every_compose_variable_is_in_env_example():
    assert compose_variables() - set(env_example()) == set()


def test_readme_table_lists_exactly_the_variables_the_code_reads():
    documented = set(readme_table())
    assert (code_variables() - documented, documented - code_variables()) == (set(), set())


def test_env_example_values_are_the_settings_defaults():
    defaults = Settings()
    for field, name in zip(Settings.__dataclass_fields__, env_names(), strict=True):
        parsed = Settings.from_env({name: env_example()[name]})
        assert getattr(parsed, field) == getattr(defaults, field), name


def _shown(value: object) -> str:
    if isinstance(value, bool):  # as the environment writes it
        return str(value).lower()
    if isinstance(value, tuple):
        return "(empty"
    if isinstance(value, float):  # whole seconds as integers: 2592000, not 2.592e+06
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)


@pytest.mark.parametrize(("field", "name"), zip(Settings.__dataclass_fields__, env_names(),
                                                strict=True))
def test_readme_defaults_are_the_settings_defaults(field: str, name: str):
    cell = readme_table()[name].replace("`", "")
    assert cell.startswith(_shown(getattr(Settings(), field))), (name, cell)
