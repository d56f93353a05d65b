"""The upstream client: keep-alive connections per deployment origin, one exception map.

Low-level failures become the ``UpstreamError`` subtree of ``errors.py`` here and nowhere
else: refused or reset connections ``UpstreamConnectError``, no answer in time
``UpstreamTimeoutError``, a non-2xx answer ``UpstreamStatusError``, a stream that broke after
it started ``UpstreamStreamError``.

Gunicorn forks after import, so the connections are made lazily in each process.
Chat Completions reference, "Errors" (failover on refused connections, timeouts,
429/500/502/503/504/529; never on other 4xx).

The HTTP/1.1 transport is ``transport.py``: on this path urllib3's own layer cost five times
the CPU of the whole call (bench/RESULTS.md), and ``requests``' more. The image downloader
keeps ``requests``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ezat_compat import __version__
from ezat_compat.domain import Deployment
from ezat_compat.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamStreamError,
    UpstreamTimeoutError,
)
from ezat_compat.server.procid import pid
from ezat_compat.upstream.sse import SSEDecoder
from ezat_compat.upstream.transport import ConnectFailed, Origin, ProtocolError, Response

USER_AGENT = f"ezat-compat/{__version__}"
Event = tuple[str, str]


class UpstreamStream:
    """An open upstream SSE response: ``poll`` (or iterate ``events()``); always ``close()`` it.

    ``idle_timeout_s``: a socket silent that long counts as broken once the first event has
    come. ``first_deadline`` (``time.monotonic()``): when the first event must have come, bytes
    or no bytes — an upstream that drips bytes without completing an event doesn't push it back
    (each read waits at most the time left)."""

    __slots__ = (
        "_closed",
        "_decoder",
        "_heard",
        "_pending",
        "_started",
        "deployment",
        "ended",
        "first_deadline",
        "idle_timeout_s",
        "response",
    )

    def __init__(
        self, response: Response, deployment: Deployment, idle_timeout_s: float, first_deadline: float
    ) -> None:
        self.response = response
        self.deployment = deployment
        self.idle_timeout_s = idle_timeout_s
        self.first_deadline = first_deadline
        self.ended = False  # the upstream ended the body (read to its end)
        self._closed = False
        self._started = False
        self._heard = time.monotonic()  # when bytes last came
        self._decoder = SSEDecoder()
        self._pending: list[Event] = []

    def poll(self, wait_s: float | None = None) -> list[Event]:
        """The events that have arrived: those already read, else those of the next socket
        reads, waiting at most ``wait_s`` (``None``: as long as the stream may be silent) for
        one to complete. An empty list: none came in time, or the body ended (``ended``).
        Raises ``UpstreamTimeoutError`` when no first event came by the first-event deadline,
        ``UpstreamStreamError`` when the stream broke or was silent past the idle timeout."""
        if self._pending:
            out, self._pending = self._pending, []
            return out
        if self.ended or self._closed:
            return []
        clock = time.monotonic
        response = self.response
        until = None if wait_s is None else clock() + wait_s
        try:
            while True:
                now = clock()
                limit = self._heard + self.idle_timeout_s if self._started else self.first_deadline
                if limit <= now:
                    raise TimeoutError("silent past the deadline")
                waiting = until is not None and until < limit
                timeout = (until if waiting else limit) - now  # type: ignore[operator]
                if timeout <= 0:
                    return []
                response.set_timeout(timeout)
                try:
                    chunk = response.read()
                except TimeoutError:
                    if waiting:
                        return []
                    raise
                self._heard = clock()
                events = self._decoder.feed(chunk) if chunk else []
                if response.done:
                    self.ended = True
                    self._decoder.flush()  # an unterminated event is discarded (WHATWG)
                if events:
                    self._started = True
                    return events
                if self.ended:
                    return []
        except Exception as exc:  # socket errors, a broken chunk, an event too large
            if self._closed:  # closed (or interrupted) from elsewhere while waiting
                self.ended = True
                return []
            if not self._started and isinstance(exc, TimeoutError):
                raise UpstreamTimeoutError(f"{self.deployment.name} sent no event in time") from None
            raise UpstreamStreamError(f"the upstream stream broke: {type(exc).__name__}") from None

    def first(self) -> Event | None:
        """The first event (the rest of its read stays pending); ``None`` if the body ended first."""
        while not self.ended:
            events = self.poll()
            if events:
                self._pending = events[1:]
                return events[0]
        return None

    def events(self) -> Iterator[Event]:
        """(event type, data) pairs until the body ends; raises as ``poll`` does."""
        while True:
            events = self.poll()
            if not events:
                if self.ended or self._closed:
                    return
                continue
            yield from events

    def interrupt(self) -> None:
        """Wake a reader waiting on the socket (from another greenlet or thread): its read
        ends, and the connection is not reused."""
        self.response.shutdown()

    def close(self) -> None:
        """Give the connection back when the body was read to its end, else drop it."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # closing must never raise
            if self.ended:
                self.response.release()
            else:
                self.response.close()


class UpstreamClient:
    """Sends Anthropic requests to deployments over keep-alive connections."""

    def __init__(self, *, connect_timeout_s: float, stream_idle_timeout_s: float, pool_size: int = 1000) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.pool_size = pool_size
        self._origins: dict[str, Origin] = {}
        self._pid = 0

    def _origin(self, base_url: str) -> Origin:
        """The keep-alive connections of one deployment URL, made once per process (after the
        fork) and kept for its life."""
        if self._pid != pid():
            self._origins, self._pid = {}, pid()
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = Origin(base_url, max_idle=self.pool_size, ca_file=_ca_bundle())
        return origin

    def clear(self) -> None:
        """Close every idle connection of this process (tests, shutdown)."""
        origins, self._origins = self._origins, {}
        for origin in origins.values():
            origin.close()

    def _headers(self, deployment: Deployment, extra: Mapping[str, str] | None, accept: str) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": accept,
            "user-agent": USER_AGENT,
            "anthropic-version": deployment.anthropic_version,
            "x-api-key": deployment.api_key,
            "accept-encoding": "identity",
        }
        if extra:
            headers.update(extra)
        return headers

    def _post(
        self, deployment: Deployment, path: str, body: bytes, headers: dict[str, str], read_timeout: float
    ) -> Response:
        try:
            response = self._origin(deployment.base_url).request(
                "POST", path, headers, body, connect_timeout=self.connect_timeout_s, read_timeout=read_timeout
            )
        except ConnectFailed as exc:  # refused, unreachable, the TLS handshake
            if exc.timed_out:
                raise UpstreamConnectError(f"timed out connecting to {deployment.name}") from None
            raise UpstreamConnectError(f"could not reach {deployment.name}: {exc}") from None
        except TimeoutError:
            raise UpstreamTimeoutError(f"{deployment.name} did not answer in time") from None
        except (ProtocolError, OSError) as exc:
            raise UpstreamConnectError(f"request to {deployment.name} failed: {type(exc).__name__}") from None
        if response.status >= 300:
            try:
                body_bytes = self._read(response, time.monotonic() + read_timeout, deployment)
            except UpstreamError:
                body_bytes = b""
            raise UpstreamStatusError(response.status, body_bytes, response.headers)
        return response

    def _read(self, response: Response, deadline: float, deployment: Deployment) -> bytes:
        """The whole body within the wall-clock ``deadline``; the connection goes back to its
        origin only when the body was read to its end."""
        chunks = []
        try:  # each read brings what one socket read holds, so the deadline is checked as bytes trickle
            while not response.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("past the deadline")
                response.set_timeout(left)
                chunks.append(response.read())
        except TimeoutError:
            response.close()
            raise UpstreamTimeoutError(f"{deployment.name} did not answer in time") from None
        except (ProtocolError, OSError) as exc:
            response.close()
            raise UpstreamConnectError(f"{deployment.name} broke the connection: {type(exc).__name__}") from None
        except BaseException:
            response.close()
            raise
        response.release()
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
        response = self._post(deployment, path, body, self._headers(deployment, headers, "application/json"), timeout_s)
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
        """A streaming call: returns once the upstream answered 2xx; read ``poll`` or
        ``events()``. Streams have no total limit; a socket silent for
        ``stream_idle_timeout_s`` counts as broken (Anthropic pings every few seconds). With
        ``first_event_timeout_s``, the response headers and then the first event must each
        come within it, by the wall clock (Anthropic sends ``message_start`` at once when it
        takes a stream): ``UpstreamTimeoutError`` otherwise, which the caller may fail over
        since nothing reached the client."""
        all_headers = self._headers(deployment, headers, "text/event-stream")
        first = first_event_timeout_s if first_event_timeout_s is not None else self.stream_idle_timeout_s
        first = min(first, self.stream_idle_timeout_s)
        try:
            response = self._post(deployment, path, body, all_headers, first)
        except UpstreamTimeoutError:
            raise UpstreamTimeoutError(f"{deployment.name} did not start the stream within {first:g} s") from None
        return UpstreamStream(response, deployment, self.stream_idle_timeout_s, time.monotonic() + first)


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
