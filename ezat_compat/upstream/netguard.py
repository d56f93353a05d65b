"""The public-address guard: which hosts the gateway may connect to on a client's behalf.

Image URLs come from clients (Chat Completions reference, "Images and PDFs": "The host must be
a public address"), so every host they name is resolved here and refused when any of its
addresses is loopback, private, link-local (cloud metadata at 169.254.169.254), CGNAT,
multicast, reserved, documentation or benchmarking space. Callers then connect to the one
address this module returned, never to a fresh DNS answer, so a name that rebinds between the
check and the connection can't reach an internal host.

    AddressCheckError
    ├── HostResolutionError      the name has no address: tell the client, don't retry
    └── NonPublicAddressError    an address is not public: refuse, never connect

Both are internal: callers turn them into their own client-facing error text.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Called like ``socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)``; returns its 5-tuples.
Resolver = Callable[..., Sequence[tuple[Any, ...]]]


class AddressCheckError(Exception):
    """A host can't be used for an outgoing connection. Don't connect; report the reason."""

    def __init__(self, message: str, *, host: str) -> None:
        super().__init__(message)
        self.host = host


class HostResolutionError(AddressCheckError):
    """The host name has no address (or isn't a valid name). Retrying won't help soon."""


class NonPublicAddressError(AddressCheckError):
    """The host is, or resolves to, an address that isn't public. Never connect to it."""

    def __init__(self, message: str, *, host: str, address: str) -> None:
        super().__init__(message, host=host)
        self.address = address


# IPv4 special-purpose blocks (IANA registry, RFC 6890) that must not be reached. Every row
# is refused; the comment says why.
_IPV4_NOT_PUBLIC: tuple[ipaddress.IPv4Network, ...] = tuple(
    ipaddress.IPv4Network(net)
    for net in (
        "0.0.0.0/8",  # "this network", incl. the unspecified 0.0.0.0 (RFC 791)
        "10.0.0.0/8",  # private (RFC 1918)
        "100.64.0.0/10",  # shared address space, carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, incl. cloud metadata 169.254.169.254 (RFC 3927)
        "172.16.0.0/12",  # private (RFC 1918)
        "192.0.0.0/24",  # IETF protocol assignments (RFC 6890)
        "192.0.2.0/24",  # documentation TEST-NET-1 (RFC 5737)
        "192.88.99.0/24",  # 6to4 relay anycast, deprecated (RFC 7526)
        "192.168.0.0/16",  # private (RFC 1918)
        "198.18.0.0/15",  # benchmarking (RFC 2544)
        "198.51.100.0/24",  # documentation TEST-NET-2 (RFC 5737)
        "203.0.113.0/24",  # documentation TEST-NET-3 (RFC 5737)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, incl. the limited broadcast 255.255.255.255
    )
)

# IPv6: only global unicast (2000::/3) can be public. Everything outside it is refused —
# ::, ::1, IPv4-compatible ::a.b.c.d, 100::/64 discard, fc00::/7 ULA, fe80::/10 link-local,
# fec0::/10 site-local, ff00::/8 multicast, 64:ff9b:1::/48 local NAT64 — except the two forms
# below that embed an IPv4 address, which are judged by that address.
_IPV6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_IPV6_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known NAT64 prefix (RFC 6052)
_IPV6_NOT_PUBLIC: tuple[ipaddress.IPv6Network, ...] = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "2001::/23",  # IETF protocol assignments: benchmarking, ORCHID… (Teredo is judged first)
        "2001:db8::/32",  # documentation (RFC 3849)
        "3fff::/20",  # documentation (RFC 9637)
    )
)


def is_public_address(ip: IPAddress) -> bool:
    """True when ``ip`` is a public unicast address the gateway may connect to.

    IPv6 addresses that carry an IPv4 address — IPv4-mapped ``::ffff:a.b.c.d``, NAT64
    ``64:ff9b::/96``, 6to4 ``2002::/16`` and Teredo ``2001::/32`` (server and client) — are
    public only when the IPv4 address they carry is. A scope id (``fe80::1%eth0``) is ignored.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        return not any(ip in net for net in _IPV4_NOT_PUBLIC)
    ip = ipaddress.IPv6Address(int(ip))  # drops the scope id
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        return all(is_public_address(v4) for v4 in embedded)
    if ip not in _IPV6_GLOBAL_UNICAST:
        return False
    return not any(ip in net for net in _IPV6_NOT_PUBLIC)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...] | None:
    """The IPv4 address(es) an IPv6 address stands for, or None when it carries none."""
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    if ip in _IPV6_NAT64:
        return (ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF),)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo
    return None


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address when ``host`` is an IP literal (``203.0.113.5``, ``::1``, ``[::1]``), else None.

    Only canonical literals count; forms such as ``127.1`` or ``2130706433`` are names to the
    resolver, which turns them into addresses that are then checked like any other answer.
    """
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def resolve_public(host: str, port: int, *, allow_private: bool, resolver: Resolver | None = None) -> str:
    """Resolve ``host`` and return the one IP address (a string) to connect to.

    ``host`` is a name or an IP literal (brackets around IPv6 are accepted). Every address the
    resolver answers is checked, and the host is refused if ANY of them is not public — a name
    that mixes a public and a private answer is refused — so connect only to the returned
    address: resolving again could give another answer (DNS rebinding).

    ``allow_private=True`` (config ``allow_private_image_hosts``, tests only) skips the public
    check but still resolves once and returns the address to pin.

    ``resolver`` defaults to ``socket.getaddrinfo`` looked up at call time, so gevent's
    monkey-patched resolver is used even when this module was imported before patching.

    Raises ``HostResolutionError`` when the host has no address and ``NonPublicAddressError``
    when one of its addresses isn't public.
    """
    literal = parse_ip_literal(host)
    if literal is None and not allow_private and is_localhost_name(host):
        # RFC 6761 section 6.3: these names are loopback; refused without asking a resolver
        # (a busy one made the refusal wait for the download deadline).
        raise NonPublicAddressError(f"{host} is a loopback name, not a public address", host=host, address="127.0.0.1")
    addresses = [literal] if literal is not None else _resolve(host, port, resolver or socket.getaddrinfo)
    if not allow_private:
        for address in addresses:
            if not is_public_address(address):
                raise NonPublicAddressError(
                    f"{host} resolves to {address}, which is not a public address",
                    host=host,
                    address=str(address),
                )
    return str(addresses[0])


def is_localhost_name(host: str) -> bool:
    """``localhost`` and its subdomains (``a.localhost``), in any case, with or without the final
    dot: names RFC 6761 section 6.3 reserves for loopback addresses."""
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def _resolve(host: str, port: int, resolver: Resolver) -> list[IPAddress]:
    """Every IPv4/IPv6 address of ``host``, in the resolver's order (RFC 6724 preference)."""
    try:
        answers = resolver(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as err:  # gaierror, bad IDNA label, NUL in name
        raise HostResolutionError(f"{host} could not be resolved: {err}", host=host) from err
    addresses: list[IPAddress] = []
    for family, _type, _proto, _canonname, sockaddr in answers:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            address = ipaddress.ip_address(sockaddr[0])
        except ValueError as err:
            raise HostResolutionError(f"{host} resolved to an unreadable address {sockaddr[0]!r}", host=host) from err
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise HostResolutionError(f"{host} has no IPv4 or IPv6 address", host=host)
    return addresses
