"""The cause of a dead job (taskline.fingerprint): stable across errors that differ only in the
values they carry, distinct for different exception types and differently worded messages."""

from __future__ import annotations

import pytest

from taskline.fingerprint import cause, fingerprint


@pytest.mark.parametrize("errors", [
    ["ValueError: order 42 failed", "ValueError: order 7 failed", "ValueError: order -3.5 failed"],
    ["KeyError: 'user_42'", 'KeyError: "bob"', "KeyError: `x`"],
    ["TimeoutError: job 0b5e0f1e-2f4e-4c35-9a55-7d7a4d6a8e1f exceeded",
     "TimeoutError: job 9c3f6a2e-1a2b-4c3d-8e9f-0a1b2c3d4e5f exceeded"],
    ["MemoryError: at 0x7ffe12ab", "MemoryError: at 0xdeadbeef"],
    ["OSError: checksum 9f86d081884c7d65 mismatch", "OSError: checksum 2c26b46b68ffc68f mismatch"],
    ["ConnectionError: cannot reach 10.0.0.1:5432", "ConnectionError: cannot reach db-2:6432"],
    ["lease expired: worker host-a-123-ab12 stopped renewing",
     "lease expired: worker host-a-977-ff01 stopped renewing"],
    ["RuntimeError: boom", "RuntimeError:   boom  "],
])
def test_errors_differing_only_in_masked_values_share_a_fingerprint(errors):
    assert len({fingerprint(e) for e in errors}) == 1


@pytest.mark.parametrize("one, other", [
    ("ValueError: order 42 failed", "KeyError: order 42 failed"),
    ("ValueError: order 42 failed", "ValueError: payment 42 failed"),
    ("ValueError: bad", "ValueError: bad input"),
    ("S3Error: bucket gone", "S4Error: bucket gone"),
    (None, "RuntimeError"),
])
def test_different_causes_have_different_fingerprints(one, other):
    assert fingerprint(one) != fingerprint(other)


def test_the_cause_keeps_the_type_and_masks_the_values():
    assert cause("ValueError: row 5: bad value 3.14 for 'x' id 0b5e0f1e-2f4e-4c35-9a55-"
                 "7d7a4d6a8e1f") == "ValueError: row <n>: bad value <n> for <str> id <uuid>"
    assert cause("HTTP2Error: 503") == "HTTP2Error: <n>"
    assert len(fingerprint("x")) == 16 and int(fingerprint("x"), 16) >= 0
