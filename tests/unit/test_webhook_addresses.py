"""Address vetting of the webhook handler: every non-public range is refused, IPv4 addresses
hidden in IPv6 forms are judged by what they carry, the allow-list opens only what it names.

Resolution goes through the real getaddrinfo, with numeric hosts only (and `localhost`), so
these tests send no traffic anywhere.
"""

from __future__ import annotations

import ipaddress

import pytest

from taskline.errors import ConfigError, NonRetryableError
from taskline.handlers.webhook import (
    AddressPolicy,
    AddressRefused,
    configure,
    current_policy,
    embedded_ipv4,
    is_public,
    vet,
)
from taskline.settings import Settings

REFUSED = [
    # IPv4 special-purpose ranges
    "0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.254",
    "127.0.0.1", "127.255.255.254", "169.254.0.1", "169.254.169.254", "172.16.0.1",
    "172.31.255.255", "192.0.0.8", "192.0.2.1", "192.88.99.1", "192.168.1.1", "198.18.0.1",
    "198.51.100.7", "203.0.113.9", "224.0.0.1", "239.255.255.250", "240.0.0.1",
    "255.255.255.255",
    # IPv6: unspecified, loopback, ULA, link-local, site-local, multicast, documentation,
    # discard, IETF protocol assignments
    "::", "::1", "fc00::1", "fd12:3456::1", "fe80::1", "febf::1", "fec0::1", "ff02::1",
    "ff0e::1", "2001:db8::1", "3fff::1", "100::1", "2001:2::1", "2001:10::1", "5f00::1",
    # IPv4-mapped, IPv4-translated and IPv4-compatible forms
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:0:127.0.0.1",
    "::127.0.0.1", "::10.0.0.1", "::8.8.8.8",
    # NAT64 well-known prefix carrying a private address, and the local-use prefix whole
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::c0a8:101", "64:ff9b:1::808:808",
    # 6to4 carrying loopback / private / metadata addresses
    "2002:7f00:1::", "2002:a00:1::1", "2002:a9fe:a9fe::1", "2002:c0a8:101::",
    # Teredo: client 127.0.0.1 obfuscated as 80ff:fffe; client 10.0.0.1 as f5ff:fffe;
    # and a public client behind a private Teredo server
    "2001:0:4136:e378:8000:63bf:80ff:fffe", "2001:0:4136:e378:8000:63bf:f5ff:fffe",
    "2001:0:a00:1:8000:63bf:f7f7:f7f7",
]

PUBLIC = [
    "8.8.8.8", "1.1.1.1", "93.184.216.34", "100.63.255.255", "100.128.0.1", "172.15.255.255",
    "172.32.0.1", "192.169.0.1", "2606:4700:4700::1111", "2a00:1450:4001:81b::200e",
    "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, public server and client 8.8.8.8
]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert is_public(ipaddress.ip_address(address)) is False


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_public(ipaddress.ip_address(address)) is True


@pytest.mark.parametrize(("address", "carried"), [
    ("::ffff:127.0.0.1", ["127.0.0.1"]),
    ("64:ff9b::a9fe:a9fe", ["169.254.169.254"]),
    ("2002:7f00:1::", ["127.0.0.1"]),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", ["65.54.227.120", "127.0.0.1"]),
    ("2606:4700:4700::1111", []),
])
def test_embedded_ipv4_is_decoded(address: str, carried: list[str]) -> None:
    assert [str(a) for a in embedded_ipv4(ipaddress.IPv6Address(address))] == carried


@pytest.mark.parametrize("host", ["2130706433", "0177.0.0.1", "0x7f.1", "127.1", "0x7f000001",
                                  "localhost", "127.0.0.1", "::1", "::ffff:127.0.0.1",
                                  "169.254.169.254", "0", "0.0.0.0"])
def test_vet_refuses_loopback_spelled_any_way(host: str) -> None:
    with pytest.raises(AddressRefused, match="not a public address"):
        vet(host, 80, AddressPolicy())


def test_refusal_dead_letters_the_job() -> None:
    assert issubclass(AddressRefused, NonRetryableError)


@pytest.mark.parametrize("host", ["8.8.8.8", "2606:4700:4700::1111", "134744072"])
def test_vet_returns_the_vetted_public_address(host: str) -> None:
    address = vet(host, 443, AddressPolicy())
    assert is_public(ipaddress.ip_address(address))


def test_allow_list_cidr_opens_only_its_range() -> None:
    policy = AddressPolicy.from_entries(["127.0.0.0/8", "fd00::/8"])
    assert vet("2130706433", 80, policy) == "127.0.0.1"
    assert vet("fd00::5", 80, policy) == "fd00::5"
    with pytest.raises(AddressRefused):
        vet("10.0.0.1", 80, policy)
    with pytest.raises(AddressRefused):
        vet("169.254.169.254", 80, policy)


def test_allow_list_host_names_match_exactly_or_by_dot_suffix() -> None:
    policy = AddressPolicy.from_entries(["localhost.", ".svc.cluster.local"])
    assert policy.allows_host("LOCALHOST")
    assert policy.allows_host("hooks.ns.svc.cluster.local")
    assert not policy.allows_host("svc.cluster.local.evil.example")
    assert not policy.allows_host("notlocalhost")
    assert vet("localhost", 80, policy) in ("127.0.0.1", "::1")


def test_allow_list_rejects_garbage() -> None:
    with pytest.raises(ConfigError, match="neither a CIDR nor a host name"):
        AddressPolicy.from_entries(["http://x/"])


def test_configure_reads_the_allow_list_from_settings() -> None:
    before = current_policy()
    try:
        configure(Settings(webhook_allow=("127.0.0.1/32",)))
        assert current_policy().allows("x", ipaddress.ip_address("127.0.0.1"))
        assert not current_policy().allows("x", ipaddress.ip_address("127.0.0.2"))
    finally:
        configure(Settings(webhook_allow=tuple(str(n) for n in before.networks)
                           + before.hostnames))
