"""Strict reading of JSON request bodies, before any field is looked at.

Invariant: what leaves `read_json` can be stored in PostgreSQL's jsonb and parsed without
recursion trouble: the body is application/json, at most the configured size (chunked bodies
included), UTF-8, nested at most MAX_DEPTH levels (checked by a linear scan before parsing, so a
body 10,000 levels deep never reaches the recursive parser), with no duplicate keys, no NaN or
Infinity, no NUL characters and no lone surrogates in any key or string at any depth.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

from flask import Request
from gunicorn.http.errors import NoMoreData, ParseException

from taskline_producer.schemas.errors import (
    ApiError,
    DuplicateKey,
    InvalidFraming,
    InvalidJson,
    InvalidString,
    NestingTooDeep,
    NonFiniteNumber,
    PayloadTooLarge,
    UnsupportedMediaType,
)

MAX_DEPTH = 64
_CHUNK = 65536
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def read_json(request: Request, limit: int) -> Any:
    """The parsed body of `request`, or an ApiError saying why it cannot be accepted."""
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(details={"content_type": request.content_type})
    return parse(read_limited(request, limit))


def read_limited(request: Request, limit: int) -> bytes:
    """At most `limit` bytes of body; more is a 413 whether Content-Length was sent or not.

    A body the server cannot read to its end (broken chunks, fewer bytes than its
    Content-Length) is a 400 that closes the connection, never a 500 and never a job.
    """
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(details={"limit_bytes": limit})
    try:
        return _read_all(request, limit)
    except (ParseException, NoMoreData) as err:
        raise InvalidFraming(f"the request body is not framed as HTTP/1.1 requires: {err}",
                             {"reason": type(err).__name__}) from None


def _read_all(request: Request, limit: int) -> bytes:
    stream = request.stream
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(details={"limit_bytes": limit})
        chunks.append(chunk)
    data = b"".join(chunks)
    if request.content_length is not None and len(data) < request.content_length:
        raise InvalidFraming("the request body is shorter than its Content-Length",
                             {"content_length": request.content_length, "received": len(data)})
    return data


def parse(raw: bytes) -> Any:
    """Decode and parse a body under every rule in this module's docstring."""
    if not raw.strip():
        raise InvalidJson("the request body is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidJson("the request body is not UTF-8", {"position": err.start}) from None
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise NestingTooDeep(details={"max_depth": MAX_DEPTH})
    try:
        value = json.loads(text, object_pairs_hook=_unique_object, parse_constant=_no_constant,
                           parse_float=_finite_float)
    except ApiError:
        raise
    except ValueError as err:  # JSONDecodeError, and int() past its digit limit
        raise InvalidJson(f"the request body is not valid JSON: {err}") from None
    # Only a \u escape can put a NUL or a lone surrogate in a string: the parser refuses raw
    # control characters and UTF-8 cannot encode a surrogate. Most bodies have no escape.
    if "\\u" in text:
        check_strings(value)
    return value


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting in JSON `text`, brackets inside strings aside; no recursion."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def check_strings(value: Any) -> None:
    """Reject NUL and lone surrogates in every key and string (jsonb refuses both)."""
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, f"{path} (key)")
                stack.append((child, f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _check_text(text: str, path: str) -> None:
    found = _BAD_CHAR.search(text)
    if found:
        what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
        raise InvalidString(f"{path[:200]} contains {what}", {"path": path[:200]})


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):  # rare: find the first repeated key, in body order
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key[:100].encode("ascii", "backslashreplace").decode()
                raise DuplicateKey(f"duplicate key {shown!r}", {"key": shown})
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise NonFiniteNumber(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise NonFiniteNumber(f"{literal[:50]} does not fit in a double")
    return value
