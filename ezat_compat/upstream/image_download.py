"""One image URL's download: the HTTP exchange of each hop and its checks.

Chat Completions reference, "Images and PDFs": EZAT downloads http(s) image URLs itself, the
host must be a public address, 3 redirects at most, 10 MB per image. How one download stays
inside those bounds:

- every hop (redirects are followed here, at most ``max_redirects``) resolves its host once,
  refuses non-public addresses (``netguard``) and connects to exactly that address, with the
  ``Host`` header, TLS SNI and certificate check for the name (no DNS-rebinding window;
  ``pinning``);
- a URL the environment names a proxy for (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``) goes
  through that proxy, after the same guard; a name that doesn't resolve here is left to it;
- bodies are read in chunks against the per-image cap, the byte budget shared by the request's
  downloads and its wall-clock deadline (``Batch``).

Failures are raised as ``Refused`` (with the client-facing reason) or as the low-level error,
which ``reason_for`` maps to its reason.
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import ssl
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions

from ezat_compat.upstream.egress import TLSAdapter, environment_proxies, verifying_context
from ezat_compat.upstream.image_limits import (
    CONNECTION_FAILED,
    INVALID_URL,
    NOT_HTTP,
    NOT_PUBLIC,
    NOT_RESOLVED,
    UNEXPECTED,
    ImageLimits,
    Refused,
    could_not,
    over_total,
    timed_out,
    too_large,
    too_many_redirects,
)
from ezat_compat.upstream.image_shares import Batch
from ezat_compat.upstream.netguard import (
    HostResolutionError,
    NonPublicAddressError,
    Resolver,
    parse_ip_literal,
    resolve_public,
)
from ezat_compat.upstream.pinning import PinnedAdapter, Target

logger = logging.getLogger("ezat_compat.upstream.images")  # the image step logs under one name

_CHUNK = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# The four types the models take, named so content negotiation doesn't pick AVIF/JPEG XL.
_ACCEPT = "image/png,image/jpeg,image/gif,image/webp,*/*;q=0.1"


@dataclass(frozen=True)
class FetchedImage:
    """One downloaded image, ready for an Anthropic ``{"type": "base64"}`` image source."""

    media_type: str  # from the bytes' signature, never from content-type
    data_b64: str


def as_fetched(data: bytes, media_type: str) -> FetchedImage:
    return FetchedImage(media_type=media_type, data_b64=base64.b64encode(data).decode("ascii"))


def reason_for(err: BaseException, limits: ImageLimits) -> str:
    """The one map from low-level failures to reasons; order matters (ConnectTimeout is both)."""
    if isinstance(err, requests.Timeout | urllib3.exceptions.TimeoutError | TimeoutError):
        return timed_out(limits)
    if isinstance(err, requests.exceptions.InvalidURL | urllib3.exceptions.LocationValueError):
        return INVALID_URL
    if isinstance(err, requests.RequestException | urllib3.exceptions.HTTPError | http.client.HTTPException | OSError):
        return CONNECTION_FAILED
    logger.warning("unexpected error while downloading an image", exc_info=err)
    return UNEXPECTED


# ---------------------------------------------------------------- URLs


def url_problem(url: str) -> str | None:
    """The refusal reason for a URL that can't be fetched at all, before any I/O; else None."""
    try:
        parts = urlsplit(url)
        if parts.scheme.lower() not in _DEFAULT_PORTS:
            return NOT_HTTP
        port = parts.port  # raises ValueError when not a number in 0-65535
    except ValueError:
        return INVALID_URL
    return None if parts.hostname and port != 0 else INVALID_URL


def _redirect_location(response: requests.Response) -> str | None:
    """The ``Location`` of a redirect response (decoded as requests does), else None."""
    if response.status_code not in _REDIRECT_STATUSES or "location" not in response.headers:
        return None
    location = response.headers["location"]
    try:  # servers send UTF-8 bytes; http.client decoded them as Latin-1
        return location.encode("latin1").decode("utf8")
    except UnicodeError:
        return location


def _content_length(response: requests.Response) -> int | None:
    try:
        length = int(response.headers.get("content-length", ""))
    except ValueError:
        return None
    return length if length >= 0 else None


# ---------------------------------------------------------------- one download


class Downloader:
    """Downloads one URL's bytes, redirects included: one per ``ImageFetcher``, shared by its workers.

    ``allow_private`` lets URLs reach loopback and private hosts (tests only), still pinned to
    the checked address; ``resolver`` replaces ``socket.getaddrinfo`` (tests); ``ca_certs``
    names a CA bundle to trust instead of the default one, ``extra_ca_files`` CAs trusted
    besides it; ``pool_size`` is the proxied adapter's pool (the fetcher's thread count).
    """

    def __init__(
        self,
        *,
        allow_private: bool,
        resolver: Resolver | None,
        user_agent: str,
        ca_certs: str | None,
        extra_ca_files: Sequence[str],
        pool_size: int,
    ) -> None:
        self._allow_private = allow_private
        self._resolver = resolver
        self._user_agent = user_agent
        self._ca_certs = ca_certs
        self._extra_ca_files = tuple(extra_ca_files)
        self._pool_size = pool_size
        self._tls: tuple[int, ssl.SSLContext, TLSAdapter] | None = None  # made once per process

    def download_bytes(self, batch: Batch, url: str) -> bytes:
        """Runs on the pool: the body of ``url`` after its redirects. Raises ``Refused``,
        ``Cancelled``, or the low-level error (see ``reason_for``)."""
        for _hop in range(batch.limits.max_redirects + 1):
            with self._exchange(batch, url) as response:
                location = _redirect_location(response)
                if location is not None:
                    url = urljoin(response.url, location)
                    continue
                if response.status_code != 200:
                    raise Refused(could_not(f"HTTP {response.status_code}"))
                return self._read_body(batch, response)
        raise Refused(too_many_redirects(batch.limits))

    def _tls_for_this_process(self) -> tuple[ssl.SSLContext, TLSAdapter]:
        """The TLS context of downloads and the adapter of proxied ones, made once per process."""
        tls = self._tls
        if tls is None or tls[0] != os.getpid():
            context = verifying_context(self._extra_ca_files, ca_bundle=self._ca_certs)
            tls = self._tls = (
                os.getpid(),
                context,
                TLSAdapter(context, pool_maxsize=self._pool_size, pool_block=False),
            )
        return tls[1], tls[2]

    @contextmanager
    def _exchange(self, batch: Batch, url: str) -> Iterator[requests.Response]:
        """GET ``url`` on a connection to its checked address, or through the proxy the
        environment names for it; yields the response (headers read)."""
        target, request, proxies = self._prepare(url)
        batch.check()
        remaining = batch.remaining()
        context, proxied = self._tls_for_this_process()
        if proxies:
            response = proxied.send(request, stream=True, timeout=(remaining, remaining), verify=True, proxies=proxies)
            try:
                yield response
            finally:
                response.close()
            return
        with batch.watch() as watch:
            adapter = PinnedAdapter(target, watch, context)
            try:
                response = adapter.send(request, stream=True, timeout=(remaining, remaining), verify=True)
                try:
                    yield response
                finally:
                    response.close()
            finally:
                adapter.close()

    def _prepare(self, url: str) -> tuple[Target, requests.PreparedRequest, dict[str, str]]:
        """Check the URL, resolve and check its host, and build the GET for it (and the
        proxies it goes through: none, or the environment's)."""
        problem = url_problem(url)  # redirect targets get the same checks as the client's URLs
        if problem is not None:
            raise Refused(problem)
        request = requests.PreparedRequest()
        request.prepare(
            method="GET",
            url=url,
            headers={
                "User-Agent": self._user_agent,
                "Accept": _ACCEPT,
                "Accept-Encoding": "identity",  # the byte caps count what we sniff and send
                "Connection": "close",
            },
        )
        parts = urlsplit(request.url or "")  # IDNA-encoded: what we resolve is what we name
        scheme, host = parts.scheme.lower(), parts.hostname or ""
        port = parts.port or _DEFAULT_PORTS[scheme]
        proxies = {k: v for k, v in environment_proxies(request.url or "").items() if k in (scheme, "all")}
        try:
            ip = resolve_public(host, port, allow_private=self._allow_private, resolver=self._resolver)
        except HostResolutionError:
            if not proxies or parse_ip_literal(host) is not None:
                raise Refused(NOT_RESOLVED) from None
            ip = ""  # the proxy resolves it
        except NonPublicAddressError:
            raise Refused(NOT_PUBLIC) from None
        target = Target(scheme=scheme, host=host, port=port, explicit_port=parts.port is not None, ip=ip)
        if not proxies:
            request.headers["Host"] = target.host_header
        return target, request, proxies

    def _read_body(self, batch: Batch, response: requests.Response) -> bytes:
        """Read the body in chunks, stopping as soon as a cap or the deadline is passed."""
        limits = batch.limits
        length = _content_length(response)
        if length is not None and length > limits.max_image_bytes:
            raise Refused(too_large(limits))
        if length is not None and not batch.fits(length):
            raise Refused(over_total(limits))
        body = bytearray()
        while True:
            batch.check()
            chunk = response.raw.read1(_CHUNK, decode_content=False)  # returns what one read gives
            if not chunk:
                return bytes(body)
            if len(body) + len(chunk) > limits.max_image_bytes:
                raise Refused(too_large(limits))
            if not batch.reserve(len(chunk)):
                raise Refused(over_total(limits))
            body += chunk
