"""How the gateway leaves the network: a deployment's proxy, the CAs it trusts and its client
certificate, resolved once per process from the configuration and the environment.

The environment is read as every ``requests`` program reads it (``requests.utils``):
``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY`` in either case, ``REQUESTS_CA_BUNDLE`` then
``CURL_CA_BUNDLE`` for the CA bundle (certifi's otherwise). A deployment's settings come first:

- ``proxy = "http://user:pass@host:3128"`` is used whatever the environment says; ``proxy = ""``
  means no proxy at all; without the key, the environment decides (``NO_PROXY`` included);
- ``ca_file`` (the deployment's, and ``[gateway] ca_file`` for every deployment) is trusted in
  addition to the bundle, never instead of it;
- ``client_cert`` and ``client_key`` (PEM files) are presented to an upstream that asks for a
  client certificate (mTLS); a ``client_cert`` holding both needs no ``client_key``.

``describe`` says what applies in words an operator reads (``check-config``), the proxy's
password masked; ``check_files`` names the first file that is missing or unreadable.
"""

from __future__ import annotations

import http.client
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.adapters import DEFAULT_POOLBLOCK, HTTPAdapter
from requests.utils import get_environ_proxies
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ezat_compat.cooperative import readable_now
from ezat_compat.domain import Deployment

CA_BUNDLE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")  # requests' own order (sessions.py)


@dataclass(frozen=True)
class Egress:
    """The egress of one deployment: ``proxies`` as requests takes them (scheme -> proxy URL;
    empty: connect directly), the CA bundle and the extra CA files, the client certificate."""

    proxies: Mapping[str, str]
    ca_bundle: str
    extra_ca_files: tuple[str, ...] = ()
    client_cert: str = ""
    client_key: str = ""

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying client context: the bundle, the extra CAs, the client certificate.
        Raises ``OSError``/``ssl.SSLError`` for a file that can't be read or used."""
        context = ssl.create_default_context(cafile=self.ca_bundle)
        for path in self.extra_ca_files:
            context.load_verify_locations(cafile=path)
        if self.client_cert:
            context.load_cert_chain(self.client_cert, self.client_key or None)
        return context


def verifying_context(extra_ca_files: Sequence[str] = (), *, ca_bundle: str | None = None) -> ssl.SSLContext:
    """A verifying client context on ``ca_bundle`` (default: the environment's or certifi's)
    plus ``extra_ca_files`` (the image downloads': ``[gateway] ca_file``)."""
    bundle = ca_bundle or default_ca_bundle()
    return Egress(proxies={}, ca_bundle=bundle, extra_ca_files=tuple(extra_ca_files)).ssl_context()


def trusting_session(extra_ca_files: Sequence[str] = ()) -> requests.Session:
    """A ``requests`` Session for the gateway's own calls that go to no deployment (the spend
    alerts' webhooks): the environment's proxies (``HTTPS_PROXY``/``NO_PROXY``, requests'
    ``trust_env``) and CA bundle, plus ``extra_ca_files`` (``[gateway] ca_file``) for https."""
    session = requests.Session()
    if extra_ca_files:
        session.mount("https://", TLSAdapter(verifying_context(extra_ca_files), pool_maxsize=4))
    return session


class _ReuseChecked:
    """urllib3's check before a kept connection is used again (``is_connected``: anything to read
    on an idle connection means the server closed or broke it), asked of the OS
    (``cooperative.readable_now``): urllib3 asks with ``poll``, which under gevent's patches is
    a turn of the event loop on every request that reuses a connection."""

    sock: Any

    @property
    def is_connected(self) -> bool:
        sock = self.sock
        if sock is None:
            return False
        try:
            return not readable_now(sock)
        except (OSError, ValueError):  # closed meanwhile
            return False


# The buffer an upstream answer is read through (http.client's default: 8 KB). Every open stream
# holds one, so an idle stream's memory is much of it: 4 KB hold 1,000 idle streams in 46.2 KB
# each where 8 KB took 49.0 (6 KB: 47.8). A burst of a long answer takes more reads (about 5 % more
# CPU per stream the simulator sends at once; an answer paced by the model takes one read an event
# either way): bench/RESULTS.md, "The upstream answer's read buffer".
ANSWER_READ_BUFFER = 4 * 1024


class _AnswerSocket:
    """A connection's socket as ``http.client.HTTPResponse`` takes it: all it asks of it is its
    reader (``makefile("rb")``), made here with a buffer of ``ANSWER_READ_BUFFER`` bytes."""

    __slots__ = ("_sock",)

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def makefile(self, mode: str) -> Any:
        return self._sock.makefile(mode, buffering=ANSWER_READ_BUFFER)


class _Answer(http.client.HTTPResponse):
    """http.client's answer, read through a buffer of ``ANSWER_READ_BUFFER`` bytes (the
    connections' ``response_class``, which urllib3 instantiates with the connection's socket)."""

    def __init__(self, sock: Any, debuglevel: int = 0, method: str | None = None, url: str | None = None) -> None:
        super().__init__(_AnswerSocket(sock), debuglevel, method, url)  # type: ignore[arg-type]


class _CheckedHTTPConnection(_ReuseChecked, HTTPConnection):
    response_class = _Answer


class _CheckedHTTPSConnection(_ReuseChecked, HTTPSConnection):
    response_class = _Answer


class _CheckedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


CHECKED_POOLS: dict[str, type] = {"http": _CheckedHTTPPool, "https": _CheckedHTTPSPool}


class TLSAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose https connections use one TLS context (the egress's CAs and
    client certificate), through requests' extension points for subclasses: a custom
    ``SSLContext`` in the pool key (``build_connection_pool_key_attributes``), connections
    whose reuse check costs one system call and whose answers are read through a buffer of
    ``ANSWER_READ_BUFFER`` bytes (``init_poolmanager``), and
    ``cert_verify`` leaving the CAs to that context (requests' own would load certifi's bundle
    into it again at every new connection). ``context`` None: plain http only (an http origin
    needs none, and loading a CA bundle costs tens of milliseconds)."""

    def __init__(self, context: ssl.SSLContext | None, *, pool_maxsize: int, pool_block: bool = True) -> None:
        self._context = context
        super().__init__(pool_connections=4, pool_maxsize=pool_maxsize, pool_block=pool_block, max_retries=0)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = DEFAULT_POOLBLOCK, **pool_kwargs: Any
    ) -> None:
        """requests' pool manager, its pools of connections checked by the OS before reuse
        (``_ReuseChecked``)."""
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = CHECKED_POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """requests' manager for ``proxy``, its pools checked as ``init_poolmanager``'s (a SOCKS
        proxy's pools are urllib3's SOCKS pools: left as they are)."""
        made = proxy not in self.proxy_manager
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if made and not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = CHECKED_POOLS
        return manager

    def cert_verify(self, conn: Any, url: str, verify: bool | str, cert: Any) -> None:
        if self._context is None or not url.lower().startswith("https"):
            super().cert_verify(conn, url, verify, cert)
            return
        conn.cert_reqs = "CERT_REQUIRED"  # always verified: the context holds the CAs and the client certificate
        conn.ca_certs = None
        conn.ca_cert_dir = None

    def build_connection_pool_key_attributes(
        self, request: requests.PreparedRequest, verify: bool | str, cert: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        if self._context is not None and host_params.get("scheme") == "https":
            for name in ("ca_certs", "ca_cert_dir", "cert_file", "key_file"):
                pool_kwargs.pop(name, None)  # all in the context
            pool_kwargs["ssl_context"] = self._context
        return host_params, pool_kwargs


def default_ca_bundle(environ: Mapping[str, str] | None = None) -> str:
    """``REQUESTS_CA_BUNDLE``, else ``CURL_CA_BUNDLE``, else certifi's bundle (what requests trusts)."""
    env = os.environ if environ is None else environ
    for name in CA_BUNDLE_VARIABLES:
        if env.get(name):
            return env[name]
    import certifi

    return str(certifi.where())


def egress_of(deployment: Deployment, gateway_ca_file: str = "") -> Egress:
    """The egress settings that apply to ``deployment`` (see the module docstring)."""
    if deployment.proxy is None:
        proxies = environment_proxies(deployment.base_url)
    elif deployment.proxy == "":
        proxies = {}
    else:
        proxies = {"http": deployment.proxy, "https": deployment.proxy}
    extra = tuple(p for p in (gateway_ca_file, deployment.ca_file) if p)
    return Egress(
        proxies=proxies,
        ca_bundle=default_ca_bundle(),
        extra_ca_files=extra,
        client_cert=deployment.client_cert,
        client_key=deployment.client_key,
    )


def environment_proxies(url: str) -> dict[str, str]:
    """The proxies the environment names for ``url`` ({} when ``NO_PROXY`` bypasses it), as
    requests reads them (``os.environ``, either case)."""
    return dict(get_environ_proxies(url))


def proxy_for(egress: Egress, url: str) -> str:
    """The proxy a request to ``url`` goes through ("" for none)."""
    scheme = urlsplit(url).scheme.lower()
    return egress.proxies.get(scheme) or egress.proxies.get("all") or ""


def masked(proxy: str) -> str:
    """A proxy URL with its password replaced by ``***``."""
    parts = urlsplit(proxy)
    if parts.password is None:
        return proxy
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def describe(egress: Egress, url: str) -> list[str]:
    """What applies to a call to ``url``, one ``name: value`` line each (no secret)."""
    proxy = proxy_for(egress, url)
    lines = [f"proxy: {masked(proxy) if proxy else 'none (direct)'}", f"CA bundle: {egress.ca_bundle}"]
    if egress.extra_ca_files:
        lines.append("also trusted: " + ", ".join(egress.extra_ca_files))
    if egress.client_cert:
        cert = egress.client_cert + (f" (key {egress.client_key})" if egress.client_key else "")
        lines.append(f"client certificate: {cert}")
    else:
        lines.append("client certificate: none")
    return lines


def missing_file(egress: Egress) -> str | None:
    """The first file the egress names that is missing or unreadable, in one line; None when
    every one can be read."""
    named = [("CA bundle", egress.ca_bundle)] + [("ca_file", p) for p in egress.extra_ca_files]
    if egress.client_cert:
        named.append(("client_cert", egress.client_cert))
    if egress.client_key:
        named.append(("client_key", egress.client_key))
    for what, path in named:
        if not os.path.isfile(path):
            return f"{what} {path}: no such file"
        if not os.access(path, os.R_OK):
            return f"{what} {path}: not readable"
    return None


def check_files(egress: Egress) -> str | None:
    """The first problem with a file the egress names, in one line; None when all can be used."""
    problem = missing_file(egress)
    if problem is not None:
        return problem
    try:
        egress.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        return f"the TLS files can't be used: {exc}"
    return None
