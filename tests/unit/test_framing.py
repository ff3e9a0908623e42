"""Where a request ends (taskline_producer.http.framing), fed byte by byte and in one piece: no
sockets, only the decisions the API's event loop acts on."""

from __future__ import annotations

import pytest

from taskline_producer.http.framing import HEAD_LIMIT, Framed, Refused, RequestFramer

HEAD = b"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
JOB = b'{"type": "echo"}'


def feed(data: bytes, limit: int = 1024, bytewise: bool = False) -> Framed | Refused | None:
    framer = RequestFramer(limit)
    pieces = [data[i:i + 1] for i in range(len(data))] if bytewise else [data]
    for piece in pieces:
        outcome = framer.feed(piece)
        if outcome is not None:
            return outcome
    return None


@pytest.mark.parametrize("bytewise", [False, True])
def test_a_whole_request_is_framed_with_what_follows_it(bytewise: bool) -> None:
    second = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
    message = HEAD + f"Content-Length: {len(JOB)}\r\n\r\n".encode() + JOB
    outcome = feed(message + second, bytewise=bytewise)
    assert isinstance(outcome, Framed) and outcome.complete
    assert outcome.message == message
    assert outcome.rest == (b"" if bytewise else second)


def test_a_chunked_body_ends_at_its_last_chunk() -> None:
    message = HEAD + b"Transfer-Encoding: chunked\r\n\r\n10\r\n" + JOB + b"\r\n0\r\n\r\n"
    outcome = feed(message)
    assert isinstance(outcome, Framed) and outcome.complete and outcome.message == message


def test_nothing_is_handed_on_before_the_body_is_whole() -> None:
    assert feed(HEAD + b"Content-Length: 100\r\n\r\n" + JOB) is None
    assert feed(HEAD + b"X-Slow: 1\r\n") is None


@pytest.mark.parametrize("chunks", [b"zz\r\n", b"-5\r\n", b"0x10\r\n",
                                    b"5\r\n" + JOB + b"\r\n", b"10\r\n" + JOB + b"0\r\n"])
def test_broken_chunks_are_refused_as_400(chunks: bytes) -> None:
    outcome = feed(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
    assert outcome == Refused(400, "invalid_framing", outcome.message)  # type: ignore[union-attr]


def test_other_codings_are_501_and_two_lengths_400() -> None:
    gzip = feed(HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n")
    assert isinstance(gzip, Refused) and (gzip.status, gzip.code) == (501, "not_implemented")
    both = feed(HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert isinstance(both, Refused) and both.status == 400


def test_a_head_past_the_limit_is_431() -> None:
    outcome = feed(b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"v" * HEAD_LIMIT + b"\r\n\r\n")
    assert isinstance(outcome, Refused) and outcome.status == 431


def test_a_body_cut_short_by_a_close_is_refused() -> None:
    framer = RequestFramer(1024)
    assert framer.feed(HEAD + b"Content-Length: 100\r\n\r\n" + JOB) is None
    outcome = framer.close()
    assert isinstance(outcome, Refused) and outcome.status == 400


def test_a_close_before_any_byte_is_nothing_to_answer() -> None:
    framer = RequestFramer(1024)
    assert not framer.started and framer.close() is None


def test_a_body_over_the_limit_is_handed_on_incomplete() -> None:
    declared = feed(HEAD + b"Content-Length: 5000\r\n\r\n", limit=1024)
    assert isinstance(declared, Framed) and not declared.complete
    chunked = feed(HEAD + b"Transfer-Encoding: chunked\r\n\r\n800\r\n" + b"x" * 2048, limit=1024)
    assert isinstance(chunked, Framed) and not chunked.complete and chunked.rest == b""


def test_expect_continue_is_noticed_once_the_head_is_read() -> None:
    framer = RequestFramer(1024)
    assert framer.feed(HEAD + b"Expect: 100-continue\r\nContent-Length: 16\r\n\r\n") is None
    assert framer.head_done and framer.expects_continue
    assert isinstance(framer.feed(JOB), Framed)


def test_empty_lines_before_a_request_are_ignored() -> None:
    outcome = feed(b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    assert isinstance(outcome, Framed) and outcome.message.startswith(b"GET")
