"""The upstream client: ``requests``, one Session per worker process, one adapter per
deployment origin and egress; one exception map.

Gunicorn forks after import, so the Session is made lazily in each process (``_session``).
Each deployment origin gets an ``HTTPAdapter`` of its own (keep-alive connections, at most
``pool_size`` of them, ``pool_block``: a request waits for a connection rather than opening
more) that holds the deployment's TLS context: the default CA bundle, the operator's extra CAs
and client certificate (``egress.py``). Proxies are the deployment's, or the environment's as
requests reads it; the environment is read once per deployment and process, not per request
(``trust_env`` is off: every call names its own settings).

A call goes to its route's ``HTTPAdapter.send`` directly, the adapter mounted on the Session for
the deployment's origin: ``Session.send`` would add only what the gateway turns off — picking
the adapter by prefix, response hooks, persisting cookies (our jar keeps none) and looking for
a redirect to follow (we follow none) — about 20 µs a call (``bench/RESULTS.md``).

Low-level failures become the ``UpstreamError`` subtree of ``errors.py`` here and nowhere
else (Chat Completions reference, "Errors": failover on refused connections, timeouts,
429/500/502/503/504/529; never on other 4xx):

    requests.exceptions.SSLError        -> UpstreamTLSError       (certificate, handshake)
    requests.exceptions.ProxyError      -> UpstreamConnectError   (the proxy refused or failed)
    requests.exceptions.ConnectTimeout  -> UpstreamConnectError
    requests.exceptions.ConnectionError -> UpstreamConnectError   (refused, reset, DNS)
    requests.exceptions.Timeout         -> UpstreamTimeoutError   (no bytes within the read timeout)
    a non-2xx answer                    -> UpstreamStatusError
    a body over ``max_body_bytes``, or
    a Content-Encoding but identity     -> UpstreamBodyError
    no response head by the deadline    -> UpstreamTimeoutError
    a stream broken after it started    -> UpstreamStreamError

A hostile or broken upstream is contained: a non-streaming body is read
incrementally and refused past ``max_body_bytes`` (``[gateway] max_upstream_body_mb``); bodies
are read as sent (``decode_content=False``) and a 2xx answer with a ``Content-Encoding`` other
than ``identity`` is refused at its head: we ask for ``identity``, and refusing costs nothing
where decoding with a bound would cost a decoder and a counter per read for an upstream that
broke the protocol; the response head (1xx answers, which http.client skips in a loop,
included) must come by a wall-clock deadline (``upstream_timeout_s`` for JSON, the first-event
deadline for streams): under gevent a ``gevent.Timeout`` around the send interrupts the read,
and urllib3 closes the connection it was reading (outside gevent, in tests and tools, the read
timeout bounds each read and the stream's writer gives up by the deadline); the reader pauses
(a sleep until the event loop's next turn) every ``YIELD_EVERY`` events, so that a fast
upstream can't hold the event loop.

A stream is read on its own greenlet (a thread outside gevent) into a queue (``UpstreamStream``),
so the writer can wait for the next event with a bound of its own, send keep-alives while the
upstream is silent, and give up at the first-event deadline by the wall clock — the response
head included.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import requests
import urllib3

from ezat_compat.cooperative import PLAIN, YIELD_EVERY, Bound, Tools, tools
from ezat_compat.domain import Deployment
from ezat_compat.endpoints import MESSAGES
from ezat_compat.errors import (
    UpstreamAuthError,
    UpstreamBodyError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStreamError,
    UpstreamTimeoutError,
    UpstreamTLSError,
)
from ezat_compat.procid import pid
from ezat_compat.upstream.egress import Egress, TLSAdapter, egress_of
from ezat_compat.upstream.providers import Decoder, Provider, ProviderSetupError, make_provider
from ezat_compat.upstream.sse import iter_sse

log = logging.getLogger("ezat_compat")
Event = tuple[str, str]
READ_SIZE = 64 * 1024  # what one read of a body without chunks asks for
MAX_BODY_BYTES = 64 * 1024 * 1024  # ``[gateway] max_upstream_body_mb``'s default
_END = object()  # the reader's last word: the body ended
_WAKE = object()  # ``interrupt``: wake the waiting writer


class _Route:
    """One deployment's way out in this process: its adapter, its proxies, its provider (path,
    header fields, signing, stream framing: ``providers/``), its prepared request template per
    path."""

    __slots__ = ("adapter", "deployment", "egress", "provider", "proxies", "templates")

    def __init__(self, deployment: Deployment, egress: Egress, adapter: TLSAdapter, provider: Provider) -> None:
        self.deployment = deployment
        self.egress = egress
        self.adapter = adapter
        self.provider = provider
        self.proxies = dict(egress.proxies)  # as the adapter takes them
        self.templates: dict[str, requests.PreparedRequest] = {}


def _no_cookies() -> requests.cookies.RequestsCookieJar:
    """A jar that keeps no cookie: an upstream's cookies must not ride along on another
    organization's request."""
    jar = requests.cookies.RequestsCookieJar()
    jar.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return jar


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps (its args, urllib3's ``reason``, its cause and context)."""
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        stack.extend(item.args)
        stack.extend((getattr(item, "reason", None), item.__cause__, item.__context__))


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The SSL library's error inside a requests exception, if any."""
    return next((e for e in _chain(exc) if isinstance(e, ssl.SSLError)), None)


def _ssl_reason(error: ssl.SSLError) -> str:
    """``certificate verify failed: unable to get local issuer certificate``, ``tlsv13 alert
    certificate required``, or the library's text where it names no reason (the peer hung up)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {getattr(error, 'verify_message', None) or error}"
    if error.reason:
        return str(error.reason).replace("_", " ").lower()
    return error.args[1] if len(error.args) > 1 and isinstance(error.args[1], str) else str(error)


def origin_of(url: str) -> str:
    """``scheme://host:port/``: what an adapter is mounted on (deployments on one origin share
    its connections, and so its TLS files: the config refuses two that differ)."""
    parts = requests.utils.urlparse(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}/"


def _host_of(url: str) -> str:
    return requests.utils.urlparse(url).netloc


def _tls_failed(exc: BaseException, error: ssl.SSLError | None, deployment: Deployment, url: str) -> UpstreamTLSError:
    reason = _ssl_reason(error) if error is not None else str(exc)
    log.error("deployment %s: TLS with %s failed: %s", deployment.name, _host_of(url), reason)
    return UpstreamTLSError(
        f"the TLS connection to {deployment.name} failed: {reason}",
        certificate=isinstance(error, ssl.SSLCertVerificationError),
    )


def mapped(exc: requests.RequestException, deployment: Deployment, url: str) -> UpstreamError:
    """The one exception map of a call that got no answer (module docstring); a TLS or proxy
    failure is logged here, naming the deployment, the host and the reason."""
    name = deployment.name
    if isinstance(exc, requests.exceptions.SSLError):
        return _tls_failed(exc, _ssl_error(exc), deployment, url)
    if isinstance(exc, requests.exceptions.ProxyError):
        log.error("deployment %s: the proxy failed for %s: %s", name, _host_of(url), exc)
        return UpstreamConnectError(f"the proxy failed for {name}")
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return UpstreamConnectError(f"timed out connecting to {name}")
    if isinstance(exc, requests.exceptions.Timeout):
        return UpstreamTimeoutError(f"{name} did not answer in time")
    if isinstance(exc, requests.exceptions.ConnectionError):
        error = _ssl_error(exc)  # a handshake the peer broke off (mTLS without a certificate)
        if error is not None:
            return _tls_failed(exc, error, deployment, url)
        return UpstreamConnectError(f"could not reach {name}: {type(_root(exc)).__name__}")
    return UpstreamConnectError(f"request to {name} failed: {type(exc).__name__}")


def _root(exc: BaseException) -> BaseException:
    last = exc
    for item in _chain(exc):
        last = item
    return last


def _chunks(response: requests.Response) -> Iterable[bytes]:
    """A body's bytes as they arrive, as sent (never decoded: ``_send`` refuses an encoding):
    each HTTP chunk of a chunked body (urllib3's ``read_chunked``, what ``iter_content(None)``
    reads, without its decoding). A body without chunks: each socket read's bytes as they come
    (``read1``; ``iter_content`` would wait for a whole buffer)."""
    raw = response.raw
    if getattr(raw, "chunked", False):
        return raw.read_chunked(None, decode_content=False)
    return iter(lambda: raw.read1(READ_SIZE, decode_content=False), b"")


class UpstreamStream:
    """An open upstream SSE response: ``poll`` (or iterate ``events()``); always ``close()`` it.

    The reader (its own greenlet) sends the request, reads the body with sseclient-py and puts
    the events of each read on a queue, together (one wake-up of the writer per read, not per
    event); ``poll`` takes what is there. ``first_deadline``
    (``time.monotonic()``): when the response head and the first event must have come, by the
    wall clock. After it, a socket silent for ``idle_timeout_s`` breaks the stream (the
    reader's read timeout)."""

    __slots__ = (
        "_closed",
        "_error",
        "_pending",
        "_queue",
        "_reader",
        "_response",
        "_started",
        "deployment",
        "ended",
        "first_deadline",
    )

    def __init__(self, deployment: Deployment, first_deadline: float) -> None:
        self.deployment = deployment
        self.first_deadline = first_deadline
        self.ended = False  # the upstream ended the body (read to its end)
        self._closed = False
        self._started = False
        self._pending: list[Event] = []
        self._error: UpstreamError | None = None
        self._queue: Any = queue.SimpleQueue()
        self._response: requests.Response | None = None
        self._reader: Any = None

    def start(
        self,
        open_response: Callable[[], requests.Response],
        spawn: Callable[[Callable[[], None]], Any],
        decode: Decoder = iter_sse,
        pause: Callable[[], None] = PLAIN.pause,
        bound: Bound = PLAIN.bound,
    ) -> None:
        """Start the reader; ``decode`` turns the body's chunks into events (the provider's
        framing); ``pause`` lets other greenlets run, every ``YIELD_EVERY`` events; ``bound``
        holds the response head to the first-event deadline."""
        self._reader = spawn(lambda: self._read(open_response, decode, pause, bound))

    def _read(
        self,
        open_response: Callable[[], requests.Response],
        decode: Decoder,
        pause: Callable[[], None],
        bound: Bound,
    ) -> None:
        """The reader: the request (its head by the first-event deadline), then every event of
        the body onto the queue, then ``_END`` (or the exception that stopped it)."""
        put = self._queue.put
        batch: list[Event] = []
        count = 0

        def hand_on() -> None:  # the events of one read, as one item: one wake-up of the writer
            nonlocal batch
            if batch:
                put(batch)
                batch = []

        try:
            late = UpstreamTimeoutError(f"{self.deployment.name} sent no response head in time")
            with bound(self.first_deadline - time.monotonic(), late):
                self._response = response = open_response()
            if self._closed:
                response.close()
                return
            for event in decode(_chunks(response), before_read=hand_on):
                batch.append(event)
                count += 1
                if count >= YIELD_EVERY:  # a fast upstream: let the other greenlets run
                    count = 0
                    hand_on()
                    pause()
            hand_on()
            put(_END)
        except BaseException as exc:
            hand_on()  # the events before the failure come first
            if isinstance(exc, UpstreamError):
                # An expected failure: handed on without its traceback, whose frames (the SSE
                # parser's among them) hold what was buffered (up to the event cap) until the
                # cyclic collector happens by. A bug keeps its traceback for the log.
                exc.__traceback__ = None
            put(exc)
            if not isinstance(exc, Exception):
                raise

    def poll(self, wait_s: float | None = None) -> list[Event]:
        """The events that have arrived: those already read, else the next ones, waiting at
        most ``wait_s`` (``None``: as long as the stream may be silent). An empty list: none
        came in time, the body ended (``ended``), or the stream was interrupted. Raises
        ``UpstreamTimeoutError`` when no first event came by the first-event deadline,
        ``UpstreamStatusError`` for a non-2xx answer, ``UpstreamStreamError`` when the stream
        broke."""
        if self._pending:
            out, self._pending = self._pending, []
            return out
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self.ended or self._closed:
            return []
        q = self._queue
        timeout = wait_s
        if not self._started:
            left = self.first_deadline - time.monotonic()
            if left <= 0:
                raise UpstreamTimeoutError(f"{self.deployment.name} sent no event in time")
            timeout = left if timeout is None else min(timeout, left)
        try:
            item = q.get(timeout=timeout) if timeout is None or timeout > 0 else q.get_nowait()
        except queue.Empty:
            if not self._started and time.monotonic() >= self.first_deadline:
                raise UpstreamTimeoutError(f"{self.deployment.name} sent no event in time") from None
            return []
        items = [item]
        while not q.empty():
            items.append(q.get_nowait())
        events: list[Event] = []
        for item in items:
            if type(item) is list:  # the events of one read
                events += item
            elif item is _END:
                self.ended = True
            elif item is not _WAKE:  # the exception that stopped the reader
                if self._closed:  # closed from elsewhere while waiting: the end, not a failure
                    self.ended = True
                    break
                failure = self._failure(item)
                if not events:
                    raise failure
                self._error = failure  # raised at the next poll, after the events before it
                break
        if events:
            self._started = True
        return events

    @staticmethod
    def _failure(exc: BaseException) -> UpstreamError:
        """What stopped the reader: the call's own failure (raised by ``_send``: refused, a
        non-2xx answer…), else a body that broke off (a read failed, an event too large)."""
        if isinstance(exc, UpstreamError):
            return exc
        return UpstreamStreamError(f"the upstream stream broke: {type(_root(exc)).__name__}")

    @property
    def headers(self) -> Mapping[str, str]:
        """The response's header fields (none before its head has come)."""
        response = self._response
        return response.headers if response is not None else {}

    def first(self) -> Event | None:
        """The first event (the rest of its read stays pending); ``None`` if the body ended first."""
        while not self.ended:
            events = self.poll()
            if events:
                self._pending = events[1:] + self._pending
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
        """Wake a writer waiting for the next event (from another greenlet or thread)."""
        self._queue.put(_WAKE)

    def close(self) -> None:
        """Give the connection back when the body was read to its end, else drop it (and stop
        the reader)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # closing must never raise
            response = self._response
            if not self.ended:
                kill = getattr(self._reader, "kill", None)
                if kill is not None:  # a greenlet: stopped where it waits, its connection dropped
                    kill(block=False)
                elif response is not None:  # a thread: its socket shut, so its read returns
                    _shut(response)
            if response is not None:
                response.close()


def _shut(response: requests.Response) -> None:
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class UpstreamClient:
    """Sends Anthropic requests to deployments through one ``requests.Session`` per process.

    ``pool_size``: the connections kept per origin (the worker's concurrency); ``ca_file``:
    ``[gateway] ca_file``, trusted for every deployment besides its own; ``max_body_bytes``: the
    largest non-streaming body taken (``[gateway] max_upstream_body_mb``)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        stream_idle_timeout_s: float,
        pool_size: int = 1000,
        ca_file: str = "",
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_body_bytes = max_body_bytes
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.pool_size = pool_size
        self.ca_file = ca_file
        self._session: requests.Session | None = None
        self._routes: dict[int, _Route] = {}  # by id(deployment), the route keeping that deployment
        self._pid = 0
        self._lock = threading.Lock()
        self._tools: Tools = PLAIN

    @property
    def session(self) -> requests.Session:
        """This process's Session (made after the fork)."""
        if self._pid != pid() or self._session is None:
            with self._lock:
                if self._pid != pid() or self._session is None:
                    session = requests.Session()
                    session.trust_env = False  # each call names its proxies and TLS (read once, in egress)
                    session.cookies = _no_cookies()
                    self._session, self._routes, self._pid = session, {}, pid()
                    self._tools = tools()
        return self._session

    def _route(self, deployment: Deployment) -> _Route:
        """The deployment's adapter (one per origin, mounted on the Session) and egress, made
        once per process."""
        session = self.session
        # Keyed by the deployment itself, not its name: names are unique per model only, and two
        # models' deployments of one name differ in their upstream model, key or egress.
        route = self._routes.get(id(deployment))
        if route is None or route.deployment is not deployment:
            egress = egress_of(deployment, self.ca_file)
            try:
                provider = make_provider(deployment, egress)
            except ProviderSetupError as exc:  # check-config and the start name it first
                log.error("%s", exc)
                raise UpstreamAuthError(f"the provider of {deployment.name} can't be used") from None
            origin = origin_of(deployment.base_url)
            with self._lock:
                adapter = session.adapters.get(origin)
                if not isinstance(adapter, TLSAdapter):
                    try:  # a plain http origin has no TLS to set up (nor a bundle to load)
                        context = egress.ssl_context() if origin.startswith("https:") else None
                    except (OSError, ssl.SSLError) as exc:  # check-config names the file before a start
                        log.error("deployment %s: its TLS files can't be used: %s", deployment.name, exc)
                        raise UpstreamConnectError(f"the TLS files of {deployment.name} can't be used") from None
                    adapter = TLSAdapter(context, pool_maxsize=self.pool_size)
                    session.mount(origin, adapter)
                route = _Route(deployment, egress, adapter, provider)
                self._routes[id(deployment)] = route
        return route

    def clear(self) -> None:
        """Close every connection of this process (tests, shutdown)."""
        session, self._session, self._routes = self._session, None, {}
        if session is not None:
            session.close()

    def _prepared(
        self, route: _Route, deployment: Deployment, path: str, body: bytes, headers: dict[str, str]
    ) -> requests.PreparedRequest:
        """The request: a copy of the route's template for ``path`` (URL parsed once), with
        this call's header fields and body."""
        template = route.templates.get(path)
        if template is None:
            template = requests.PreparedRequest()
            template.prepare(method="POST", url=deployment.base_url.rstrip("/") + path, headers={})
            route.templates[path] = template
        request = template.copy()
        request.prepare_headers(headers)
        request.prepare_body(body, None)
        return request

    def shape(
        self,
        deployment: Deployment,
        body: bytes,
        *,
        source: Mapping[str, Any] | None = None,
        stream: bool | None = False,
        headers: Mapping[str, str] | None = None,
        path: str = MESSAGES,
    ) -> tuple[bytes, Mapping[str, str] | None]:
        """The body and forwarded header fields as ``deployment``'s provider takes them for
        ``path``: ``body`` is the request serialized without ``model`` (``source``: the same as
        data, if at hand); ``stream`` is put in front (None: as the body has it)."""
        return self._route(deployment).provider.shape(body, source, stream, headers, path)

    def _send(
        self,
        route: _Route,
        deployment: Deployment,
        path: str,
        body: bytes,
        headers: dict[str, str],
        read_timeout: float,
        stream: bool,
    ) -> requests.Response:
        """Send and read the head (``stream=True``: the body is read by the caller); a non-2xx
        answer is read whole within ``read_timeout`` and raised as ``UpstreamStatusError``."""
        provider = route.provider
        request: requests.PreparedRequest | None = None
        try:  # the route's adapter itself: Session.send would only add what we turn off (module docstring)
            if provider.rewrites:  # a cloud: its path, then its signature or token on the final request
                request = self._prepared(route, deployment, provider.path(path, stream), body, headers)
                provider.authorize(request)
            else:
                request = self._prepared(route, deployment, path, body, headers)
            response = route.adapter.send(
                request,
                stream=True,
                timeout=(self.connect_timeout_s, read_timeout),
                verify=True,
                proxies=route.proxies,
            )
        except requests.RequestException as exc:
            raise mapped(
                exc, deployment, (request.url if request is not None else None) or deployment.base_url
            ) from None
        except (ValueError, OSError) as exc:  # a header value requests refuses, a broken socket
            raise UpstreamConnectError(f"request to {deployment.name} failed: {type(exc).__name__}") from None
        if response.status_code >= 300:
            try:
                data = self._read(response, time.monotonic() + read_timeout, deployment)
            except UpstreamError:
                data = b""
            error = provider.status_error(response.status_code, data, response.headers)
            if error.error is None:  # not Anthropic's envelope: logged with its first bytes
                log.warning(
                    "deployment %s answered HTTP %d that is not the API's error: %r",
                    deployment.name,
                    response.status_code,
                    data[:200],
                )
            raise error
        encoding = response.headers.get("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("identity", ""):
            response.close()  # we asked for identity: a compressed body could expand without bound
            log.warning("deployment %s answered in Content-Encoding %r: refused", deployment.name, encoding[:40])
            raise UpstreamBodyError(f"{deployment.name} answered in an encoding the gateway didn't ask for")
        return response

    def _read(self, response: requests.Response, deadline: float, deployment: Deployment) -> bytes:
        """The whole body within the wall-clock ``deadline``: each read waits at most the time
        left, so bytes that trickle can't stretch it; at most ``max_body_bytes`` of it, read as
        sent (``UpstreamBodyError`` past that). The connection goes back to the pool only when
        the body was read to its end."""
        chunks = []
        raw = response.raw
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        reads = iter(_chunks(response))
        size, limit = 0, self.max_body_bytes
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise UpstreamTimeoutError(f"{deployment.name} did not answer in time")
                if sock is not None:
                    sock.settimeout(left)
                chunk = next(reads, b"")
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    log.warning("deployment %s sent a body over %d bytes: refused", deployment.name, limit)
                    raise UpstreamBodyError(f"{deployment.name} sent an answer larger than {limit} bytes")
                chunks.append(chunk)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            response.close()
            chunks.clear()  # the exception's traceback keeps this frame: not the body read so far
            if isinstance(exc, requests.exceptions.Timeout | urllib3.exceptions.TimeoutError | TimeoutError):
                raise UpstreamTimeoutError(f"{deployment.name} did not answer in time") from None
            raise UpstreamConnectError(f"{deployment.name} broke the connection: {type(_root(exc)).__name__}") from None
        except BaseException:  # a refusal above, a deadline, this greenlet killed
            response.close()
            chunks.clear()
            raise
        raw.release_conn()  # read to its end: the connection goes back to the pool
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
        """A non-streaming call: the head and the whole body within ``timeout_s`` (wall clock)."""
        deadline = time.monotonic() + timeout_s
        route = self._route(deployment)
        all_headers = route.provider.headers(headers, "application/json")
        with self._tools.bound(timeout_s, UpstreamTimeoutError(f"{deployment.name} did not answer in time")):
            response = self._send(route, deployment, path, body, all_headers, timeout_s, False)
        data = self._read(response, deadline, deployment)
        if route.provider.rewrites:  # a cloud's answer in Anthropic's words (Anthropic's own: as it came)
            data = route.provider.answer(path, data)
        return data, response.headers

    def open_stream(
        self,
        deployment: Deployment,
        path: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        first_event_timeout_s: float | None = None,
    ) -> UpstreamStream:
        """A streaming call, read on its own greenlet: ``poll``, ``first`` or ``events()`` give
        its events and raise its failures (a non-2xx answer included). Streams have no total
        limit; a socket silent for ``stream_idle_timeout_s`` breaks it (Anthropic pings every
        few seconds). With ``first_event_timeout_s``, the response head and the first event
        must come within it, by the wall clock (Anthropic sends ``message_start`` at once when
        it takes a stream): ``UpstreamTimeoutError`` otherwise, which the caller may fail over
        since nothing reached the client."""
        first = first_event_timeout_s if first_event_timeout_s is not None else self.stream_idle_timeout_s
        first = min(first, self.stream_idle_timeout_s)
        route = self._route(deployment)  # made here, in the caller: a bad TLS file fails the call, not the reader
        all_headers = route.provider.headers(headers, "text/event-stream")
        stream = UpstreamStream(deployment, time.monotonic() + first)
        idle = self.stream_idle_timeout_s
        stream.start(
            lambda: self._send(route, deployment, path, body, all_headers, idle, True),
            self._tools.spawn,
            route.provider.decode,
            self._tools.pause,
            self._tools.bound,
        )
        return stream
