"""The public-address guard (Chat Completions reference, "Images and PDFs": public hosts only)."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from ezat_compat.upstream.netguard import (
    HostResolutionError,
    NonPublicAddressError,
    is_public_address,
    resolve_public,
)

NOT_PUBLIC = [
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback, end of 127/8"),
    ("10.0.0.1", "private 10/8"),
    ("172.16.0.1", "private 172.16/12"),
    ("172.31.255.255", "private 172.16/12, last"),
    ("192.168.1.1", "private 192.168/16"),
    ("169.254.169.254", "cloud metadata (link-local)"),
    ("100.64.0.1", "CGNAT 100.64/10"),
    ("100.127.255.254", "CGNAT, last"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "this network 0/8"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast SSDP"),
    ("240.0.0.1", "reserved 240/4"),
    ("255.255.255.255", "limited broadcast"),
    ("192.0.0.8", "IETF protocol assignments"),
    ("192.0.2.1", "TEST-NET-1"),
    ("198.51.100.1", "TEST-NET-2"),
    ("203.0.113.7", "TEST-NET-3"),
    ("198.18.0.1", "benchmarking"),
    ("192.88.99.1", "6to4 relay anycast"),
    ("::1", "IPv6 loopback"),
    ("::", "IPv6 unspecified"),
    ("fe80::1", "IPv6 link-local"),
    ("fe80::1%eth0", "IPv6 link-local with scope"),
    ("fc00::1", "ULA fc00::/7"),
    ("fd12::1", "ULA fd00::/8"),
    ("fec0::1", "site-local"),
    ("ff02::1", "IPv6 multicast"),
    ("ff0e::1", "IPv6 global multicast"),
    ("::ffff:127.0.0.1", "IPv4-mapped loopback"),
    ("::ffff:10.0.0.1", "IPv4-mapped private"),
    ("::ffff:169.254.169.254", "IPv4-mapped metadata"),
    ("::127.0.0.1", "IPv4-compatible (deprecated)"),
    ("64:ff9b::a00:1", "NAT64 of 10.0.0.1"),
    ("64:ff9b::7f00:1", "NAT64 of 127.0.0.1"),
    ("64:ff9b:1::808:808", "local-use NAT64 prefix"),
    ("2002:7f00:1::", "6to4 of 127.0.0.1"),
    ("2002:a9fe:a9fe::1", "6to4 of 169.254.169.254"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo, client 192.0.2.45"),
    ("2001:db8::1", "IPv6 documentation"),
    ("3fff::1", "IPv6 documentation (RFC 9637)"),
    ("2001:2::1", "IPv6 benchmarking"),
    ("100::1", "discard-only"),
    ("5f00::1", "SRv6 SIDs, outside 2000::/3"),
]

PUBLIC = [
    ("8.8.8.8", "Google DNS"),
    ("1.1.1.1", "Cloudflare DNS"),
    ("93.184.216.34", "example.com"),
    ("100.63.255.255", "just below CGNAT"),
    ("100.128.0.1", "just above CGNAT"),
    ("172.32.0.1", "just above 172.16/12"),
    ("223.255.255.254", "just below multicast"),
    ("2606:4700:4700::1111", "Cloudflare DNS v6"),
    ("2a00:1450:4001:80b::200e", "a global unicast v6"),
    ("::ffff:8.8.8.8", "IPv4-mapped public"),
    ("64:ff9b::808:808", "NAT64 of 8.8.8.8"),
    ("2002:808:808::1", "6to4 of 8.8.8.8"),
]


@pytest.mark.parametrize(("address", "why"), NOT_PUBLIC, ids=[why for _, why in NOT_PUBLIC])
def test_not_public(address, why):
    assert is_public_address(ipaddress.ip_address(address)) is False


@pytest.mark.parametrize(("address", "why"), PUBLIC, ids=[why for _, why in PUBLIC])
def test_public(address, why):
    assert is_public_address(ipaddress.ip_address(address)) is True


class FakeResolver:
    """getaddrinfo over a fixed table; unknown names fail like NXDOMAIN. Records every call."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    def __call__(self, host, port, family=0, type=0, proto=0, flags=0):
        self.calls.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answers = []
        for address in self.table[host]:
            if ":" in address:
                answers.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                answers.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return answers


RESOLVER = FakeResolver(
    {
        "public.test": ["93.184.216.34"],
        "dual.test": ["2606:4700:4700::1111", "1.1.1.1"],
        "private.test": ["10.0.0.1"],
        "mixed.test": ["93.184.216.34", "10.0.0.1"],
        "mixed-last.test": ["93.184.216.34", "8.8.8.8", "::1"],
        "empty.test": [],
    }
)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("public.test", "93.184.216.34"),
        ("dual.test", "2606:4700:4700::1111"),
        ("8.8.8.8", "8.8.8.8"),
        ("2606:4700:4700::1111", "2606:4700:4700::1111"),
        ("[2606:4700:4700::1111]", "2606:4700:4700::1111"),
    ],
    ids=["name", "first-answer-of-two", "v4-literal", "v6-literal", "bracketed-v6-literal"],
)
def test_resolve_public_returns_the_address_to_pin(host, expected):
    assert resolve_public(host, 443, allow_private=False, resolver=RESOLVER) == expected


@pytest.mark.parametrize(
    "host",
    ["private.test", "mixed.test", "mixed-last.test", "127.0.0.1", "[::1]", "169.254.169.254", "::ffff:10.0.0.1"],
    ids=[
        "name-to-10/8",
        "one-public-one-private",
        "private-last-of-three",
        "v4-loopback",
        "v6-loopback",
        "metadata",
        "mapped-private",
    ],
)
def test_resolve_public_refuses_any_non_public_answer(host):
    with pytest.raises(NonPublicAddressError):
        resolve_public(host, 80, allow_private=False, resolver=RESOLVER)


@pytest.mark.parametrize("host", ["nowhere.test", "empty.test"])
def test_resolve_public_unresolvable(host):
    with pytest.raises(HostResolutionError):
        resolve_public(host, 80, allow_private=False, resolver=RESOLVER)


def test_resolver_errors_other_than_gaierror_are_resolution_errors():
    def broken(host, port, **kwargs):
        raise UnicodeError("label too long")

    with pytest.raises(HostResolutionError):
        resolve_public("a" * 64 + ".test", 80, allow_private=False, resolver=broken)


def test_ip_literals_are_not_sent_to_the_resolver():
    resolver = FakeResolver({})
    assert resolve_public("8.8.8.8", 80, allow_private=False, resolver=resolver) == "8.8.8.8"
    assert resolver.calls == []


def test_non_canonical_ipv4_forms_are_resolved_then_checked():
    # "127.1" is not an IP literal to ipaddress, but getaddrinfo turns it into 127.0.0.1.
    resolver = FakeResolver({"127.1": ["127.0.0.1"]})
    with pytest.raises(NonPublicAddressError):
        resolve_public("127.1", 80, allow_private=False, resolver=resolver)


def test_allow_private_skips_the_check_but_still_resolves_once():
    resolver = FakeResolver({"private.test": ["10.0.0.1"]})
    assert resolve_public("private.test", 80, allow_private=True, resolver=resolver) == "10.0.0.1"
    assert resolver.calls == ["private.test"]
    with pytest.raises(HostResolutionError):
        resolve_public("nowhere.test", 80, allow_private=True, resolver=resolver)


def test_the_refusal_names_the_address():
    with pytest.raises(NonPublicAddressError) as caught:
        resolve_public("mixed.test", 80, allow_private=False, resolver=RESOLVER)
    assert caught.value.address == "10.0.0.1"
    assert caught.value.host == "mixed.test"


@pytest.mark.parametrize("host", ["localhost", "LocalHost.", "images.localhost"])
def test_localhost_names_are_refused_without_resolving(host: str) -> None:
    """RFC 6761 section 6.3: loopback by definition. A resolver that is slow (a busy machine's
    thread pool) made the refusal wait for the download deadline; it is never asked now."""

    def resolver(*_: object, **__: object) -> list[object]:
        raise AssertionError("the resolver was asked")

    with pytest.raises(NonPublicAddressError):
        resolve_public(host, 80, allow_private=False, resolver=resolver)  # type: ignore[arg-type]
