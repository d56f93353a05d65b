"""The upstream client: one urllib3 connection pool per process, one exception map.

Low-level failures become the ``UpstreamError`` subtree of ``errors.py`` here and nowhere
else: refused or reset connections ``UpstreamConnectError``, no answer in time
``UpstreamTimeoutError``, a non-2xx answer ``UpstreamStatusError``, a stream that broke after
it started ``UpstreamStreamError``.

Gunicorn forks after import, so the pools are created lazily in each process.
Chat Completions reference, "Errors" (failover on refused connections, timeouts,
429/500/502/503/504/529; never on other 4xx).

urllib3, the transport under ``requests``, is used directly on this path: ``requests``' own
layer (settings merging, cookie jar, hooks) cost half the upstream call's CPU, about 0.2 ms
per request (bench/RESULTS.md). The image downloader keeps ``requests``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, connection_from_url
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from ezat_compat import __version__
from ezat_compat.domain import Deployment
from ezat_compat.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamStreamError,
    UpstreamTimeoutError,
)
from ezat_compat.procid import pid
from ezat_compat.upstream.sse import SSEDecoder

USER_AGENT = f"ezat-compat/{__version__}"
READ_CHUNK = 64 * 1024


class _HeadWithBody:
    """A connection that writes a request's head together with its body: ``http.client``
    sends them with two writes (two system calls, and two TCP segments where one would hold
    both). The head is held back and sent with the body's first chunk; a request without a
    body sends it when its response is read."""

    _head = b""

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if message_body is not None or self._head:
            super()._send_output(message_body, encode_chunked=encode_chunked)  # type: ignore[misc]
            return
        buffer: list[bytes] = self._buffer  # type: ignore[attr-defined]
        buffer.extend((b"", b""))
        self._head = b"\r\n".join(buffer)
        del buffer[:]

    def send(self, data: Any) -> None:
        head = self._head
        if head:
            self._head = b""
            if isinstance(data, bytes | bytearray):
                data = head + data
            else:
                super().send(head)  # type: ignore[misc]
        super().send(data)  # type: ignore[misc]

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        if self._head:
            head, self._head = self._head, b""
            super().send(head)  # type: ignore[misc]
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]

    def close(self) -> None:
        self._head = b""
        super().close()  # type: ignore[misc]


class OneWriteHTTPConnection(_HeadWithBody, HTTPConnection):
    """urllib3's connection, head and body in one write."""


class OneWriteHTTPSConnection(_HeadWithBody, HTTPSConnection):
    """urllib3's TLS connection, head and body in one write."""


class UpstreamStream:
    """An open upstream SSE response: iterate ``events()``; always ``close()`` it.

    ``idle_timeout_s``: set when the stream was opened with a shorter first-event deadline; the
    socket's read timeout becomes this once the first event has arrived. ``first_deadline``
    (``time.monotonic()``): when the first event must have come, bytes or no bytes — an upstream
    that drips bytes without completing an event doesn't push it back (each read waits at
    most the time left)."""

    def __init__(
        self,
        response: urllib3.BaseHTTPResponse,
        deployment: Deployment,
        idle_timeout_s: float | None = None,
        first_deadline: float | None = None,
    ) -> None:
        self.response = response
        self.deployment = deployment
        self.idle_timeout_s = idle_timeout_s
        self.first_deadline = first_deadline
        self._closed = False
        self._complete = False
        self._started = idle_timeout_s is None and first_deadline is None

    def _chunks(self) -> Iterator[bytes]:
        response = self.response
        if response.chunked:  # what upstreams send for a stream: each HTTP chunk as it arrives
            yield from response.read_chunked(None, decode_content=True)
        else:
            while chunk := response.read1(READ_CHUNK):
                yield chunk

    def _socket_timeout(self, seconds: float) -> None:
        connection = getattr(self.response, "connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(seconds)

    def _first_event_arrived(self) -> None:
        self._started = True
        if self.idle_timeout_s is not None:
            self._socket_timeout(self.idle_timeout_s)

    def _no_event_yet(self) -> None:
        """Before the next read while no event has come: past the deadline it is a timeout;
        else the read may wait only for what is left of it."""
        if self.first_deadline is None:
            return
        left = self.first_deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no first event by the deadline")
        self._socket_timeout(left)

    def events(self) -> Iterator[tuple[str, str]]:
        """(event type, data) pairs. Raises ``UpstreamTimeoutError`` when no first event came
        within the first-event deadline, ``UpstreamStreamError`` if the connection breaks; ends
        when the upstream ends the body."""
        decoder = SSEDecoder()
        try:
            for chunk in self._chunks():
                for event in decoder.feed(chunk):
                    if not self._started:
                        self._first_event_arrived()
                    yield event
                if not self._started:
                    self._no_event_yet()
            yield from decoder.flush()
            self._complete = True  # the whole body was read: the connection can be reused
        except Exception as exc:  # socket errors, urllib3's ProtocolError, a broken chunk
            if self._closed:
                return
            if not self._started and isinstance(exc, ReadTimeoutError | TimeoutError):
                raise UpstreamTimeoutError(f"{self.deployment.name} sent no event in time") from None
            raise UpstreamStreamError(f"the upstream stream broke: {type(exc).__name__}") from None

    def close(self) -> None:
        """Give the connection back to the pool when the body was read to its end, else drop it."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # closing must never raise
            if self._complete:
                self.response.release_conn()
            else:
                self.response.close()


class UpstreamClient:
    """Sends Anthropic requests to deployments over pooled keep-alive connections."""

    def __init__(self, *, connect_timeout_s: float, stream_idle_timeout_s: float, pool_size: int = 1000) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.pool_size = pool_size
        self._pools: dict[str, tuple[HTTPConnectionPool, str]] = {}
        self._pid = 0

    def _pool_for(self, base_url: str) -> tuple[HTTPConnectionPool, str]:
        """The keep-alive pool of one deployment's host and the path prefix of its URL, made
        once per process (after the fork). One pool per deployment URL, kept for the process's
        life: what a ``PoolManager`` would pick, without parsing the URL on every request."""
        if self._pid != pid():
            self._pools, self._pid = {}, pid()
        found = self._pools.get(base_url)
        if found is None:
            parsed = urllib3.util.parse_url(base_url)
            tls: dict[str, Any] = {"ca_certs": _ca_bundle()} if parsed.scheme == "https" else {}
            pool = connection_from_url(base_url, maxsize=self.pool_size, block=False, retries=False, **tls)
            pool.ConnectionCls = OneWriteHTTPSConnection if parsed.scheme == "https" else OneWriteHTTPConnection
            found = self._pools[base_url] = (pool, (parsed.path or "").rstrip("/"))
        return found

    def clear(self) -> None:
        """Close every pooled connection of this process (tests, shutdown)."""
        pools, self._pools = self._pools, {}
        for pool, _prefix in pools.values():
            pool.close()

    def _headers(self, deployment: Deployment, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "user-agent": USER_AGENT,
            "anthropic-version": deployment.anthropic_version,
            "x-api-key": deployment.api_key,
        }
        if extra:
            headers.update(extra)
        return headers

    def _post(
        self, deployment: Deployment, path: str, body: bytes, headers: dict[str, str], read_timeout: float
    ) -> urllib3.BaseHTTPResponse:
        pool, prefix = self._pool_for(deployment.base_url)
        try:
            response = pool.urlopen(
                "POST",
                prefix + path,
                body=body,
                headers=headers,
                preload_content=False,
                retries=False,
                redirect=False,
                assert_same_host=False,
                timeout=urllib3.Timeout(connect=self.connect_timeout_s, read=read_timeout),
            )
        except NewConnectionError as exc:  # refused, unreachable (a subclass of ConnectTimeoutError)
            raise UpstreamConnectError(f"could not reach {deployment.name}: {type(exc).__name__}") from None
        except ConnectTimeoutError:
            raise UpstreamConnectError(f"timed out connecting to {deployment.name}") from None
        except ReadTimeoutError:
            raise UpstreamTimeoutError(f"{deployment.name} did not answer in time") from None
        except (HTTPError, OSError) as exc:
            raise UpstreamConnectError(f"request to {deployment.name} failed: {type(exc).__name__}") from None
        if response.status >= 300:
            try:
                body_bytes = self._read(response, time.monotonic() + read_timeout, deployment)
            except UpstreamError:
                body_bytes = b""
            raise UpstreamStatusError(response.status, body_bytes, response.headers)
        return response

    def _read(self, response: urllib3.BaseHTTPResponse, deadline: float, deployment: Deployment) -> bytes:
        """The whole body within the wall-clock ``deadline``; the connection goes back to the
        pool only when the body was read to its end."""
        chunks = []
        try:  # read1: whatever one socket read brings, so the deadline is checked as bytes trickle
            while chunk := response.read1(READ_CHUNK):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise UpstreamTimeoutError(f"{deployment.name} did not answer in time")
        except ReadTimeoutError:
            response.close()
            raise UpstreamTimeoutError(f"{deployment.name} did not answer in time") from None
        except (ProtocolError, HTTPError, OSError) as exc:
            response.close()
            raise UpstreamConnectError(f"{deployment.name} broke the connection: {type(exc).__name__}") from None
        except BaseException:
            response.close()
            raise
        response.release_conn()
        return b"".join(chunks)

    def complete(
        self,
        deployment: Deployment,
        path: str,
        body: bytes,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """A non-streaming call: the whole body within ``timeout_s`` (wall clock)."""
        deadline = time.monotonic() + timeout_s
        response = self._post(deployment, path, body, self._headers(deployment, headers), timeout_s)
        return self._read(response, deadline, deployment), response.headers

    def open_stream(
        self,
        deployment: Deployment,
        path: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        first_event_timeout_s: float | None = None,
    ) -> UpstreamStream:
        """A streaming call: returns once the upstream answered 2xx; read ``events()``. Streams
        have no total limit; a socket silent for ``stream_idle_timeout_s`` counts as broken
        (Anthropic pings every few seconds). With ``first_event_timeout_s``, the response
        headers and then the first event must each come within it, by the wall clock (Anthropic sends
        ``message_start`` at once when it takes a stream): ``UpstreamTimeoutError`` otherwise,
        which the caller may fail over since nothing reached the client."""
        all_headers = self._headers(deployment, headers)
        all_headers["accept"] = "text/event-stream"
        first = first_event_timeout_s if first_event_timeout_s is not None else self.stream_idle_timeout_s
        first = min(first, self.stream_idle_timeout_s)
        try:
            response = self._post(deployment, path, body, all_headers, first)
        except UpstreamTimeoutError:
            raise UpstreamTimeoutError(f"{deployment.name} did not start the stream within {first:g} s") from None
        idle = self.stream_idle_timeout_s if first < self.stream_idle_timeout_s else None
        return UpstreamStream(response, deployment, idle_timeout_s=idle, first_deadline=time.monotonic() + first)


def _ca_bundle() -> str | None:
    """certifi's bundle when installed (as with requests), else the system's."""
    try:
        import certifi
    except ImportError:  # pragma: no cover - certifi comes with requests
        return None
    return str(certifi.where())


def with_model(body_without_model: bytes, model: str, *, stream: bool | None = None) -> bytes:
    """Prefix an already serialized JSON object with ``"model"`` (and ``"stream"``), so a
    failover to another deployment doesn't re-serialize the whole body."""
    head = b'{"model":' + json.dumps(model).encode()
    if stream is not None:
        head += b',"stream":' + (b"true" if stream else b"false")
    if body_without_model == b"{}":
        return head + b"}"
    return head + b"," + body_without_model[1:]


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as sent upstream."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
