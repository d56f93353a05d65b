"""The console behind a reverse proxy that serves it under a prefix or over TLS.

``ForwardedPrefix`` wraps the app's WSGI callable outside ``TrustedForwarded`` (it must see the
proxy's own address). For a console path (``/console`` and below) from a trusted peer
(``trusted``: app.py passes the test of ``[server] forwarded_allow_ips``), it takes
``X-Forwarded-Prefix`` as ``SCRIPT_NAME`` (so ``url_for`` writes the links, the cookies' path and
the IdP's redirect URI with the prefix), ``X-Forwarded-Proto`` (http or https) as the URL scheme
and ``X-Forwarded-Host`` as the host. From any other peer, or on any other path, the headers are
ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
_PREFIX = re.compile(r"^(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)*$")  # path segments, no trailing slash
_HOST = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")
CONSOLE_PREFIX = "/console"


def _first(value: str) -> str:
    return value.split(",")[0].strip()


class ForwardedPrefix:
    """The WSGI middleware of the module docstring."""

    def __init__(self, app: WSGIApp, trusted: Callable[[str], bool]) -> None:
        self.app = app
        self.trusted = trusted

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if (path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")) and self.trusted(
            environ.get("REMOTE_ADDR", "")
        ):
            prefix = _first(environ.get("HTTP_X_FORWARDED_PREFIX", "")).rstrip("/")
            if prefix and _PREFIX.match(prefix):
                environ["SCRIPT_NAME"] = prefix
            proto = _first(environ.get("HTTP_X_FORWARDED_PROTO", "")).lower()
            if proto in ("http", "https"):
                environ["wsgi.url_scheme"] = proto
            host = _first(environ.get("HTTP_X_FORWARDED_HOST", ""))
            if host and _HOST.match(host):
                environ["HTTP_HOST"] = host
        return self.app(environ, start_response)
