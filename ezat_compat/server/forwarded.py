"""The client's address behind a reverse proxy, trusted from the proxy only.

gunicorn's ``forwarded_allow_ips`` names the proxies whose forwarding headers it believes, but
gunicorn itself never rewrites ``REMOTE_ADDR`` from ``X-Forwarded-For`` (its access log's ``%(h)s``
is always the peer). ``TrustedForwarded`` does that one thing with the same list (``[server]
forwarded_allow_ips``): when the peer is a trusted proxy, ``REMOTE_ADDR`` becomes the rightmost
``X-Forwarded-For`` entry that is not itself a trusted proxy (what the nearest proxy saw; entries
to its left were sent by the client and prove nothing). From any other peer the header is ignored.
``client_address`` is the pure decision, tested by a table.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

from ezat_compat.config import Network, parse_allow_list

__all__ = ["Network", "TrustedForwarded", "client_address", "parse_allow_list", "trusted"]

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def trusted(address: str, allow: tuple[Network, ...] | None) -> bool:
    if allow is None:
        return True
    try:
        ip = ipaddress.ip_address(address.strip().removeprefix("[").split("]")[0])
    except ValueError:
        return False
    return any(ip in network for network in allow)


def client_address(peer: str, forwarded_for: str | None, allow: tuple[Network, ...] | None) -> str:
    """The client's address: ``peer`` unless ``peer`` is a trusted proxy that passed
    ``X-Forwarded-For``; then its rightmost entry that is not a trusted proxy (or the leftmost
    when every entry is trusted). A malformed rightmost entry keeps the peer."""
    if not forwarded_for or not trusted(peer, allow):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _is_ip(hop):
            return peer
        if not trusted(hop, allow):
            return hop
    return hops[0] if hops else peer


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


class TrustedForwarded:
    """WSGI middleware: ``REMOTE_ADDR`` is the client's address (``client_address``); the proxy's
    own address is kept as ``ezat.proxy_addr``."""

    def __init__(self, app: WSGIApp, allow_ips: str) -> None:
        self.app = app
        self.allow = parse_allow_list(allow_ips)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        peer = environ.get("REMOTE_ADDR") or ""
        client = client_address(peer, environ.get("HTTP_X_FORWARDED_FOR"), self.allow)
        if client != peer:
            environ["ezat.proxy_addr"] = peer
            environ["REMOTE_ADDR"] = client
        return self.app(environ, start_response)
