"""Every curl example in README.md and docs/*.md, run as written against a live `taskline dev`
stack: placeholders (`<id>`, the example job id, the example cursor) become real ones in the
state the example needs, `localhost:8000` becomes the stack's address, and each answer's
status must be the one the example's comment shows (a trailing `# 200 ...`, or a comment line
just above the command). An example whose comment shows no status fails, so none goes unrun.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from taskline.settings import Settings
from taskline_cli.localservers import free_port
from tests.helpers import service_env, stop_process, wait_for
from tests.servers import new_database, running_postgres, running_redis

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")]

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_ID = "5d0c2f9e-8a9b-4c3e-9f51-0b6f3f1f2a10"  # the job id docs/api.md shows
_FENCE = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.M | re.S)
_STATUS = re.compile(r"\b([1-5]\d\d)\b")


@dataclass(frozen=True)
class Example:
    source: str            # file:line, for failure messages and test ids
    argv: tuple[str, ...]  # the curl command
    pipe: tuple[str, ...]  # what its output is piped into, if anything
    status: int | None     # what the docs show


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one shell line: the first `#` outside quotes starts the comment."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].strip(), line[index + 1:].strip()
    return line.strip(), ""


def _logical_lines(block: str, first_line: int) -> Iterator[tuple[int, str]]:
    """Lines with their backslash continuations joined, each with its line number."""
    pending, start = "", first_line
    for offset, line in enumerate(block.splitlines()):
        if not pending:
            start = first_line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def _commands(code: str) -> Iterator[tuple[list[str], list[str]]]:
    """(command, piped-into) for each `;`-separated command of a line."""
    lexer = shlex.shlex(code, posix=True, punctuation_chars=";|")
    lexer.whitespace_split = True
    command: list[list[str]] = [[]]
    for token in [*lexer, ";"]:
        if token == ";":
            if command[0]:
                yield command[0], command[1] if len(command) > 1 else []
            command = [[]]
        elif token == "|":
            command.append([])
        else:
            command[-1].append(token)


def _examples_in(path: Path) -> Iterator[Example]:
    text = path.read_text()
    for block in _FENCE.finditer(text):
        first_line = text.count("\n", 0, block.start(1)) + 1
        above = ""
        for number, line in _logical_lines(block.group(1), first_line):
            code, comment = _split_comment(line)
            if not code:
                above = comment
                continue
            found = _STATUS.search(comment or above)
            for argv, pipe in _commands(code):
                if argv[0] == "curl":
                    yield Example(f"{path.relative_to(ROOT)}:{number}", tuple(argv), tuple(pipe),
                                  int(found.group(1)) if found else None)
            above = ""


EXAMPLES = [example for path in DOCS for example in _examples_in(path)]


def test_the_docs_hold_curl_examples_to_run():
    sources = {example.source.split(":")[0] for example in EXAMPLES}
    assert {"README.md", "docs/api.md", "docs/dashboard.md"} <= sources
    assert len(EXAMPLES) >= 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`taskline dev` on private servers and a free port; its API base URL."""
    log = tmp_path_factory.mktemp("doc-examples") / "dev.log"
    with running_postgres() as postgres, running_redis() as redis_server:
        settings = Settings.from_env(env={}, database_url=new_database(postgres),
                                     redis_url=redis_server.url, shutdown_grace_s=2.0,
                                     backoff_base_s=0.2, backoff_max_s=1.0)
        bind = f"127.0.0.1:{free_port()}"
        with open(log, "wb") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "taskline_cli.main", "dev", "--bind",
                                     bind], env=service_env(settings), stdout=sink,
                                    stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: _answers(f"http://{bind}/readyz", proc, log), timeout=60,
                     message="the dev stack's API")
            yield f"http://{bind}"
        finally:
            stop_process(proc, timeout=30)


def _answers(url: str, proc: subprocess.Popen, log: Path) -> bool:
    assert proc.poll() is None, f"the dev stack exited:\n{log.read_text()}"
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _enqueue(base: str, body: dict) -> str:
    created = requests.post(f"{base}/api/v1/jobs", json=body, timeout=10)
    assert created.status_code == 201, created.text
    return created.json()["id"]


def _job_for(example: Example, base: str) -> str:
    """A job in the state the example needs: pending to cancel, dead to retry, else any."""
    if "DELETE" in example.argv or "-XDELETE" in example.argv:
        return _enqueue(base, {"type": "report", "delay_s": 600})
    if any(arg.endswith("/retry") for arg in example.argv):
        job_id = _enqueue(base, {"type": "simulate",
                                 "payload": {"fail_first": 1, "non_retryable": True}})
        wait_for(lambda: requests.get(f"{base}/api/v1/jobs/{job_id}", timeout=5)
                 .json()["status"] == "dead", timeout=30, message="the job to be dead")
        return job_id
    return _enqueue(base, {"type": "echo", "payload": {"example": example.source}})


def _cursor(base: str) -> str:
    for _ in range(2):
        _enqueue(base, {"type": "echo"})
    return requests.get(f"{base}/api/v1/jobs?limit=1", timeout=10).json()["next_cursor"]


def _as_run(example: Example, base: str) -> list[str]:
    """The example's argv with the stack's address and real ids in place of the docs' ones."""
    argv = [arg.replace("http://localhost:8000", base).replace("localhost:8000", base)
            for arg in example.argv]
    if any("<id>" in arg or EXAMPLE_ID in arg for arg in argv):
        job_id = _job_for(example, base)
        argv = [arg.replace("<id>", job_id).replace(EXAMPLE_ID, job_id) for arg in argv]
    if any("cursor=" in arg for arg in argv):
        cursor = _cursor(base)
        argv = [re.sub(r"cursor=[^&]*", f"cursor={cursor}", arg) for arg in argv]
    streaming = "-N" in argv or "-sN" in argv  # an event stream never ends on its own
    return [*argv, "--max-time", "3" if streaming else "30", "-w", "%{http_code}"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.source for e in EXAMPLES])
def test_the_example_answers_the_status_the_docs_show(example: Example, stack: str):
    assert example.status is not None, f"{example.source}: no status shown in its comment"
    done = subprocess.run(_as_run(example, stack), capture_output=True, text=True, timeout=60)
    body, status = done.stdout[:-3], int(done.stdout[-3:] or 0)
    assert status == example.status, f"{example.source}: {status} {body[:500]}"
    if example.pipe:
        piped = subprocess.run(list(example.pipe), input=body, capture_output=True, text=True,
                               timeout=30)
        assert piped.returncode == 0, f"{example.source}: `{' '.join(example.pipe)}` failed"
