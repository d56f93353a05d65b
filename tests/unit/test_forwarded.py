"""The client's address behind a proxy: X-Forwarded-For believed from trusted proxies only."""

from __future__ import annotations

import tomllib

import pytest

from ezat_compat.config import ConfigError, parse_config
from ezat_compat.server.forwarded import TrustedForwarded, client_address, parse_allow_list

LOOPBACK = parse_allow_list("127.0.0.1")
PROXIES = parse_allow_list("127.0.0.1, 10.0.0.0/8")

CASES = [
    # peer, X-Forwarded-For, allow list, the client's address
    ("127.0.0.1", "203.0.113.7", LOOPBACK, "203.0.113.7"),  # the proxy names the client
    ("127.0.0.1", None, LOOPBACK, "127.0.0.1"),  # the proxy's own request (a health check)
    ("198.51.100.9", "203.0.113.7", LOOPBACK, "198.51.100.9"),  # not from the proxy: ignored
    ("127.0.0.1", "6.6.6.6, 203.0.113.7", LOOPBACK, "203.0.113.7"),  # the client's own entry is not believed
    ("127.0.0.1", "6.6.6.6,203.0.113.7", PROXIES, "203.0.113.7"),
    ("127.0.0.1", "203.0.113.7, 10.1.2.3", PROXIES, "203.0.113.7"),  # two proxies: skip the inner one
    ("127.0.0.1", "10.1.2.3", PROXIES, "10.1.2.3"),  # every hop trusted: the leftmost
    ("127.0.0.1", "not-an-ip", LOOPBACK, "127.0.0.1"),  # malformed: keep the peer
    ("127.0.0.1", "2001:db8::1", LOOPBACK, "2001:db8::1"),
    ("198.51.100.9", "203.0.113.7", None, "203.0.113.7"),  # "*": every peer trusted
    ("127.0.0.1", "", LOOPBACK, "127.0.0.1"),
]


@pytest.mark.parametrize(("peer", "forwarded_for", "allow", "expected"), CASES)
def test_client_address(peer: str, forwarded_for: str | None, allow: object, expected: str) -> None:
    assert client_address(peer, forwarded_for, allow) == expected  # type: ignore[arg-type]


def test_the_middleware_rewrites_remote_addr_and_keeps_the_proxy() -> None:
    seen: dict[str, object] = {}

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        seen.update(environ)
        return [b""]

    wrapped = TrustedForwarded(app, "127.0.0.1")
    wrapped({"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "203.0.113.7"}, lambda *a: None)
    assert seen["REMOTE_ADDR"] == "203.0.113.7" and seen["ezat.proxy_addr"] == "127.0.0.1"


MODEL = """
[[models]]
id = "m"
aliases = []
price = { input = 1, output = 1 }
[[models.deployments]]
name = "d"
base_url = "http://127.0.0.1:1"
upstream_model = "m"
"""


def test_the_server_key_defaults_to_loopback_and_refuses_a_bad_entry() -> None:
    assert parse_config(tomllib.loads(MODEL), path="ezat.toml").server.forwarded_allow_ips == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"server\.forwarded_allow_ips: 'proxy\.lan' is not an IP"):
        parse_config(tomllib.loads('[server]\nforwarded_allow_ips = "127.0.0.1,proxy.lan"\n' + MODEL), path="ezat.toml")
