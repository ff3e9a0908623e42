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
