"""docs/api.md's examples, run against the API in the order the page shows them: every request of
an `example` block answers its documented status, and every `answer` block is the body of the
request before it, byte for byte, after the normalisation the page's Conventions describe
(ids the n-th new one of the page, instants as `<instant>`, ages as `<age>`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from flask.testing import FlaskClient

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
BLOCK = re.compile(r"^```\w+ (example|answer)\n(.*?)^```$", re.M | re.S)
STATUS = re.compile(r"^#\s*(\d{3})\b")
BASE = "http://localhost:8000"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?=\+00:00|Z)")
AGE = re.compile(r'("\w+_age_s":)(?:[0-9.e-]+|null)')


@dataclass
class Request:
    """One curl command of an example block, with the status its comment documents."""

    line: int
    status: int
    method: str = "GET"
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    answer: str | None = None


def _request(line: int, command: str, status: int) -> Request:
    """The request of `command` (curl with -X, -H, -d and the URL; other flags ignored)."""
    request = Request(line, status)
    words = iter(shlex.split(command, comments=True)[1:])
    for word in words:
        if word == "-X":
            request.method = next(words)
        elif word == "-H":
            name, value = next(words).split(":", 1)
            request.headers[name] = value.strip()
        elif word == "-d":
            request.body = next(words)
            request.method = request.method if request.method != "GET" else "POST"
        elif word.startswith(BASE):
            request.path = word[len(BASE):]
    assert request.path, f"docs/api.md:{line}: no URL in {command!r}"
    return request


def _commands(text: str) -> list[tuple[int, str]]:
    """The lines of a shell block, each continued line (ending in `\\`) joined to the next, with
    the offset of its first line."""
    joined: list[tuple[int, str]] = []
    continued = False
    for offset, line in enumerate(text.split("\n")):
        if continued:
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
        else:
            joined.append((offset, line))
        continued = line.endswith("\\")
    return joined


def _example(start: int, text: str) -> list[Request]:
    """The curl commands of an example block, each with the status of its `# NNN` comment (on
    its own line before it, or after it)."""
    requests, pending = [], None
    for offset, line in _commands(text):
        stripped = line.strip()
        if stripped.startswith("#"):
            found = STATUS.match(stripped)
            pending = int(found.group(1)) if found else pending
        elif stripped:
            comment = re.search(r"\s#\s*(\d{3})\b", stripped)
            status = int(comment.group(1)) if comment else pending
            assert status, f"docs/api.md:{start + offset}: an example without its status"
            requests.append(_request(start + offset, stripped, status))
            pending = None
    return requests


def documented() -> list[Request]:
    """Every example request of docs/api.md in page order, each with its answer if shown."""
    source = DOC.read_text()
    requests: list[Request] = []
    for block in BLOCK.finditer(source):
        start = source.count("\n", 0, block.start()) + 2
        if block.group(1) == "example":
            requests += _example(start, block.group(2))
        else:
            assert requests and requests[-1].answer is None, f"docs/api.md:{start}: whose answer?"
            requests[-1].answer = "".join(block.group(2).split("\n")) + "\n"
    return requests


class Ids:
    """The page's ids and the API's: the n-th new id an answer shows stands for the n-th new
    id the API answered, and a request naming a documented id sends the API's."""

    def __init__(self) -> None:
        self.real: dict[str, str] = {}

    def sent(self, text: str) -> str:
        return UUID.sub(lambda m: self.real.get(m.group(), m.group()), text)

    def answered(self, body: str, documented: str) -> str:
        """`body` with each of its ids as the page names it (paired by position)."""
        page = dict(zip(self.real.values(), self.real.keys(), strict=True))
        for real, shown in zip(UUID.findall(body), UUID.findall(documented), strict=False):
            if real not in page and shown not in self.real:
                self.real[shown], page[real] = real, shown
        return UUID.sub(lambda m: page.get(m.group(), m.group()), body)


def normalised(body: str) -> str:
    return AGE.sub(r"\1<age>", INSTANT.sub("<instant>", body))


def wrapped(body: str, width: int = 100) -> str:
    """`body` cut after commas into lines of at most `width`, as an answer block shows it."""
    lines, line = [], ""
    for part in re.split(r"(?<=,)(?! )", body.rstrip("\n")):  # not inside a text
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
    return "\n".join([*lines, line])


def test_the_page_has_examples_with_answers() -> None:
    requests = documented()
    assert len(requests) >= 20
    assert sum(r.answer is not None for r in requests) >= 12


def test_every_documented_example_answers_as_documented(client: FlaskClient) -> None:
    ids = Ids()
    for request in documented():
        answer = client.open(ids.sent(request.path), method=request.method,
                             headers=request.headers,
                             data=None if request.body is None else ids.sent(request.body))
        body = answer.get_data(as_text=True)
        where = f"docs/api.md:{request.line} {request.method} {request.path}"
        assert answer.status_code == request.status, f"{where}: {answer.status_code} {body}"
        if request.answer is not None:
            got = normalised(ids.answered(body, request.answer))
            assert got == normalised(request.answer), f"{where} answers\n{wrapped(got)}"
