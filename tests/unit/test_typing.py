"""The typed public API: `mypy --strict` accepts tests/typing/sample.py (as `make lint` runs
it) and refuses the same program with one misspelt keyword, so the check can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "typing" / "sample.py"


def mypy(path: Path, cache: Path) -> tuple[str, int]:
    out, err, code = api.run(["--strict", "--config-file", str(ROOT / "pyproject.toml"),
                              "--cache-dir", str(cache), str(path)])
    return out + err, code


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


def test_the_sample_program_passes_mypy_strict(cache: Path) -> None:
    output, code = mypy(SAMPLE, cache)
    assert code == 0, output


@pytest.mark.parametrize(("right", "wrong", "said"), [
    ('priority=7, max_retries=3', 'priorty=7, max_retries=3',
     'Unexpected keyword argument "priorty" for "enqueue"'),
    ('delay_s=5.0, idempotency_key="r-1"', 'delay=5.0, idempotency_key="r-1"',
     'Unexpected keyword argument "delay" for "enqueue" of "Handler"'),
    ('{"host": "db1"}, queue="pings"', '{"hots": "db1"}, queue="pings"',
     'Extra key "hots" for TypedDict "Ping"'),
    ('def resize(payload: Resize,', 'def resize(payload: Receipt,',
     'incompatible type "Callable[[Receipt, JobContext], None]"'),
])
def test_a_misspelt_keyword_or_payload_fails_the_check(cache: Path, tmp_path: Path,
                                                       right: str, wrong: str,
                                                       said: str) -> None:
    source = SAMPLE.read_text()
    assert source.count(right) == 1
    broken = tmp_path / "sample.py"
    broken.write_text(source.replace(right, wrong))
    output, code = mypy(broken, cache)
    assert code == 1 and said in output, output


def test_every_request_of_the_client_is_awaitable_for_a_type_checker() -> None:
    """AsyncClient inherits Client's requests (they return `_call`'s awaitable at run time);
    its TYPE_CHECKING block must declare each as `async`, or mypy would see a dict."""
    import ast

    tree = ast.parse((ROOT / "shared" / "taskline" / "client.py").read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def requests(cls: ast.ClassDef) -> set[str]:
        return {f.name for f in cls.body if isinstance(f, ast.FunctionDef)
                and not f.name.startswith("_") and "self._call(" in ast.unparse(f)}

    def awaited(cls: ast.ClassDef) -> set[str]:
        found = {f.name for f in cls.body if isinstance(f, ast.AsyncFunctionDef)}
        for node in cls.body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                found |= {f.name for f in node.body if isinstance(f, ast.AsyncFunctionDef)}
        return found

    assert requests(classes["Client"]) - awaited(classes["AsyncClient"]) == set()
