"""The cause of a dead job: a fingerprint of its final error, by which the DLQ groups its jobs.

Invariant: two errors that differ only in the values a message carries (numbers, ids, UUIDs,
hex, quoted values, hosts and ports) have one fingerprint; errors of different exception types
or differently worded messages have different ones. Pure: the store computes it when a job is
dead-lettered and stores it beside the error (dead_letter_jobs.fingerprint), so grouping never
parses errors again; migration 0015 fingerprints the dead jobs that were there before.
"""

from __future__ import annotations

import hashlib
import re

FINGERPRINT_CHARS = 16
"""Hex digits kept of the SHA-256 (64 bits: no collision among the causes of one DLQ)."""
MAX_CAUSE_CHARS = 1000
"""Only the head of a long message decides its cause (a dump of values would never match)."""
_TYPED = re.compile(r"([A-Za-z_][\w.]*): (.*)", re.S)
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|`[^`\n]*`")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)"
                  r"[0-9a-fA-F]{8,}\b")
_TOKEN = re.compile(r"[\w.:/@+-]+")
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?", re.I)
_TRAILING = ".:"


def _mask_token(match: re.Match[str]) -> str:
    """A word holding a digit is a value: a number, or an id (host-123, 10.0.0.1:5432, v2)."""
    word = match.group(0)
    core = word.rstrip(_TRAILING)
    if not any(c.isdigit() for c in core):
        return word
    shown = "<n>" if _NUMBER.fullmatch(core) else "<id>"
    return shown + word[len(core):]


def split(error: str | None) -> tuple[str, str]:
    """(exception type, message) of a stored error `Type: message`; ('', text) when it names
    no type (the reaper's `lease expired: ...`)."""
    text = (error or "").strip()
    typed = _TYPED.fullmatch(text)
    if typed and " " not in typed.group(1):
        return typed.group(1), typed.group(2)
    return "", text


def cause(error: str | None) -> str:
    """The error with its values masked: `Type: message` with <str>, <uuid>, <hex>, <n>, <id>."""
    kind, message = split(error)
    message = _QUOTED.sub("<str>", message[:MAX_CAUSE_CHARS])
    message = _UUID.sub("<uuid>", message)
    message = _HEX.sub("<hex>", message)
    message = _TOKEN.sub(_mask_token, message)
    message = " ".join(message.split())
    return f"{kind}: {message}" if kind else message


def fingerprint(error: str | None) -> str:
    """The cause's fingerprint: 16 hex digits, the same for errors of one cause."""
    return hashlib.sha256(cause(error).encode("utf-8")).hexdigest()[:FINGERPRINT_CHARS]
