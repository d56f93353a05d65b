"""Pinned, watched connections: one HTTP exchange sent to a checked IP, cut from another thread.

The image fetcher (``images``) resolves and checks a host itself (``netguard``); this module
makes sure the exchange then goes to exactly that address and can be stopped at any phase:

- ``PinnedAdapter`` connects to ``Target.ip`` with TLS SNI and the certificate check for
  ``Target.host`` (no second DNS lookup, so no DNS-rebinding window); the caller sets the
  ``Host`` header from ``Target.host_header``;
- ``Watch`` keeps a ``dup()`` of every socket the adapter opens, so ``Watch.abort()`` from the
  waiting thread wakes a read blocked anywhere (TLS handshake, status line, headers, body).

Use one adapter and one watch per exchange; close the adapter, then ``release()`` the watch.
"""

from __future__ import annotations

import socket
import ssl
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ezat_compat.upstream.egress import TLSAdapter


@dataclass(frozen=True)
class Target:
    """Where one hop goes: the URL's scheme, host name and port, and the checked IP to dial."""

    scheme: str
    host: str  # as in the URL (IDNA-encoded), without brackets
    port: int
    explicit_port: bool
    ip: str

    @property
    def host_header(self) -> str:
        """The ``Host`` header for this hop: the name (IPv6 in brackets), with the port if the URL gave one."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.explicit_port else host


def _shutdown(sock: socket.socket) -> None:
    with suppress(OSError, ValueError):
        sock.shutdown(socket.SHUT_RDWR)


class Watch:
    """The sockets of one HTTP exchange, so that another thread can cut them at any phase.

    Each socket is kept as a ``dup()`` taken right after the TCP connect: shutting the dup
    down wakes a read blocked in the TLS handshake, the status line, the headers or the body
    (thread or greenlet), which the deadline alone would not, since a server can drip.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._aborted = False

    def register(self, sock: socket.socket) -> None:
        """Keep a dup of a new socket; it is cut at once if the watch was already aborted."""
        dup = sock.dup()
        with self._lock:
            self._socks.append(dup)
            aborted = self._aborted
        if aborted:
            _shutdown(dup)

    def abort(self) -> None:
        """Shut down every socket of the exchange, now and any opened later (safe from any thread)."""
        with self._lock:
            self._aborted = True
            socks = list(self._socks)
        for sock in socks:
            _shutdown(sock)

    def release(self) -> None:
        """Close the dups; call once the exchange is over and its adapter closed."""
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            sock.close()


class _Watched:
    """Registers every new socket with the download's watch (so the deadline can cut it)."""

    def __init__(self, *args: Any, watch: Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        self._watch.register(sock)
        return sock


class _WatchedHTTPConnection(_Watched, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    pass


class _PinnedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _PinnedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class PinnedAdapter(TLSAdapter):
    """Sends one exchange to ``target.ip``, never to a new DNS answer for ``target.host``.

    The pool is keyed by the checked IP; ``server_hostname`` gives TLS its SNI and certificate
    check for the name, against ``context``'s CAs; the caller sets the ``Host`` header. One
    adapter per exchange: its connection is closed with the response, so a connection never
    outlives its watch.
    """

    def __init__(self, target: Target, watch: Watch, context: ssl.SSLContext) -> None:
        super().__init__(context, pool_maxsize=1)
        self._target = target
        self._pinned: HTTPConnectionPool
        if target.scheme == "https":
            self._pinned = _PinnedHTTPSPool(
                target.ip, target.port, maxsize=1, server_hostname=target.host, ssl_context=context, watch=watch
            )
        else:
            self._pinned = _PinnedHTTPPool(target.ip, target.port, maxsize=1, watch=watch)

    def get_connection_with_tls_context(
        self,
        request: requests.PreparedRequest,
        verify: bool | str | None,
        proxies: dict[str, str] | None = None,
        cert: Any = None,
    ) -> HTTPConnectionPool:
        return self._pool_for(request.url or "")

    # requests before 2.32.2 calls one of these instead: they must pin too, never fall back.
    def get_connection(self, url: str, proxies: dict[str, str] | None = None) -> HTTPConnectionPool:
        return self._pool_for(url)

    def _get_connection(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> HTTPConnectionPool:
        return self._pool_for(request.url or "")

    def _pool_for(self, url: str) -> HTTPConnectionPool:
        parts = urlsplit(url)
        if (parts.scheme, parts.hostname) != (self._target.scheme, self._target.host):
            raise requests.exceptions.InvalidURL(f"{url} is not the pinned target")
        return self._pinned

    def close(self) -> None:
        super().close()
        self._pinned.close()
