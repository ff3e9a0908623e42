"""Unit tests of taskline.access: token entries, quotas and JWT scope claims (pure)."""

from __future__ import annotations

import pytest

from taskline.access import (
    OPERATE,
    READ,
    SCOPES,
    WRITE,
    Quota,
    parse_quotas,
    parse_token,
    parse_tokens,
    scopes_of_claim,
)
from taskline.errors import ConfigError
from taskline.settings import Settings


def test_an_entry_is_split_at_its_first_two_colons() -> None:
    token = parse_token("ingest:s3cret:jobs:write+jobs:read", 1)
    assert (token.name, token.secret, token.scopes) == ("ingest", b"s3cret",
                                                        frozenset({WRITE, READ}))
    assert parse_token("ops:s3cret:jobs:operate", 2).scopes == {OPERATE}


def test_a_bare_token_keeps_every_scope_under_a_name_of_its_position() -> None:
    tokens = parse_tokens(["first", "named:second"])
    assert [(t.name, t.secret, t.scopes) for t in tokens] == [
        ("token-1", b"first", SCOPES), ("named", b"second", SCOPES)]


@pytest.mark.parametrize("entry", ["name:tok:jobs:admin", "name:tok:", "name::jobs:read",
                                   ":tok:jobs:read", "bad name:tok", "n:tok:jobs:read++"])
def test_entries_that_cannot_be_read_exactly_are_refused(entry: str) -> None:
    with pytest.raises(ConfigError):
        parse_token(entry, 1)


def test_two_entries_with_one_name_are_refused() -> None:
    with pytest.raises(ConfigError, match="more than once"):
        parse_tokens(["a:one", "a:two"])


def test_quotas() -> None:
    assert parse_quotas(["ingest=500/s", " batch = 60/m", "slow=10/h"]) == {
        "ingest": Quota(500, 1.0), "batch": Quota(60, 60.0), "slow": Quota(10, 3600.0)}
    assert str(Quota(500, 1.0)) == "500/s"
    for bad in (["ingest=500"], ["ingest=0/s"], ["ingest=500/d"], ["a=1/s", "a=2/s"],
                ["=5/s"], ["a b=5/s"], ["ingest=100001/s"]):
        with pytest.raises(ConfigError):
            parse_quotas(bad)


def test_the_scope_claim_is_space_separated_and_unknown_scopes_are_ignored() -> None:
    assert scopes_of_claim("jobs:read  openid jobs:write") == {READ, WRITE}
    assert scopes_of_claim(None) == frozenset()
    assert scopes_of_claim(["jobs:read"]) == frozenset()


def test_settings_turn_authentication_on_with_tokens_or_a_jwt_key() -> None:
    assert not Settings().auth_enabled
    assert Settings.from_env({"TASKLINE_API_TOKENS": "a:b:jobs:read"}).auth_enabled
    assert Settings.from_env({"TASKLINE_JWT_KEY": "k" * 32}).auth_enabled
    with pytest.raises(ConfigError, match="TASKLINE_API_TOKENS entry 1"):
        Settings.from_env({"TASKLINE_API_TOKENS": "a:b:jobs:nothing"})
