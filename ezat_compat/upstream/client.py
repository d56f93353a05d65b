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
timeout bounds each read, set to what is left of the deadline); a stream's reader pauses (a
sleep until the event loop's next turn) every ``YIELD_EVERY`` events read without a wait, so
that a fast upstream can't hold the event loop.

A stream is read in place, with no greenlet or thread of its own (``UpstreamStream``): the
request's greenlet sends it and reads its first event, the stream writer's reads the rest. A
read takes only bytes that have already arrived and the reader waits for the socket between
reads, with a bound of its own, so the writer can send keep-alives while the upstream is silent,
notice a client that left, and give up at the first-event deadline by the wall clock — the
response head included.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import requests
import urllib3

from ezat_compat.cooperative import PLAIN, YIELD_EVERY, Readiness, Tools, tools
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
from ezat_compat.upstream.providers import Provider, ProviderSetupError, make_provider
from ezat_compat.upstream.sse import SSEDecoder, StreamDecoder

log = logging.getLogger("ezat_compat")
Event = tuple[str, str]
READ_SIZE = 64 * 1024  # what one read of a body asks for (of a chunked one: at most its chunk)
MAX_BODY_BYTES = 64 * 1024 * 1024  # ``[gateway] max_upstream_body_mb``'s default
END_READ_TIMEOUT_S = 0.05  # reading a stream's end that has arrived, when it is closed
# A read that timed out (the socket's timeout, as urllib3 and the stdlib raise it).
_TIMEOUTS = (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)


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
    reads, without its decoding; the CRLF after a chunk is read with it, so what stays buffered
    after one is the next chunk's). A body without chunks: each socket read's bytes as they come
    (``read1``; ``iter_content`` would wait for a whole buffer)."""
    raw = response.raw
    if getattr(raw, "chunked", False):
        return raw.read_chunked(None, decode_content=False)
    return iter(lambda: raw.read1(READ_SIZE, decode_content=False), b"")


class UpstreamStream:
    """An open upstream stream, read in place by whoever polls it: ``first()`` in the request's
    own greenlet (the request is sent and its first event read there), then ``poll`` in the
    stream writer's; always ``close()`` it. No other greenlet or thread reads it.

    Once the first event came, ``poll`` never waits inside a read: it reads only bytes that have
    already arrived — held in http.client's buffered reader or the TLS layer, or ready on the
    socket (``_available``: one non-blocking look) — and between reads waits for the socket to
    become readable (``cooperative.Readiness``) at most until its bound, so a bound that runs
    out (the keep-alive is due) never cuts a read and loses what it had read. The bytes go to
    the provider's decoder (``StreamDecoder``), which keeps an event that is still arriving, so
    a silent upstream mid-event doesn't hold the writer either. Only a read of an HTTP chunk
    that has begun to arrive waits for the rest of it (urllib3 reads a chunk whole), up to the
    idle timeout: a server writes a chunk at once.

    ``first_deadline`` (``time.monotonic()``): when the response head and the first event must
    have come, by the wall clock. Until then there is nothing else to do (no keep-alive is due,
    no cut can reach a stream not handed on yet), so the send and the first reads simply wait,
    bounded as a whole by the deadline (gevent's timer; outside gevent the socket's timeout, set
    to what is left of it): a stream given up there is dropped, so a cut read loses nothing that
    matters. After it, a socket silent for ``idle_s`` breaks the stream."""

    __slots__ = (
        "_broken",
        "_chunks",
        "_closed",
        "_decoder",
        "_empty",
        "_error",
        "_fp",
        "_idle_s",
        "_interrupted",
        "_last_read",
        "_more",
        "_new_decoder",
        "_open",
        "_pending",
        "_raw",
        "_read_timeout",
        "_readiness",
        "_reading",
        "_since_pause",
        "_sock",
        "_started",
        "_tools",
        "deployment",
        "ended",
        "first_deadline",
    )

    def __init__(
        self,
        deployment: Deployment,
        first_deadline: float,
        open_response: Callable[[], requests.Response],
        decoder: Callable[[], StreamDecoder] = SSEDecoder,
        tools: Tools = PLAIN,
        idle_s: float = 600.0,
    ) -> None:
        self.deployment = deployment
        self.first_deadline = first_deadline
        self.ended = False  # the upstream ended the body (read to its end)
        self._open: Callable[[], requests.Response] | None = open_response
        self._new_decoder = decoder
        self._tools = tools
        self._idle_s = idle_s
        self._closed = False
        self._started = False  # the first event came
        self._broken = False  # a read failed: nothing more is read
        self._interrupted = False
        self._reading = False
        self._pending: list[Event] = []
        self._error: UpstreamError | None = None  # raised at the next poll, after the events before it
        self._raw: Any = None  # the response as urllib3 reads it (requests' ``Response.raw``)
        self._chunks: Iterator[bytes] | None = None  # the body's chunks, as ``_chunks`` reads them
        self._decoder: StreamDecoder | None = None
        self._fp: Any = None  # http.client's buffered reader of the socket (None: reads don't wait)
        self._sock: Any = None
        self._readiness: Readiness | None = None
        self._read_timeout: float | None = None
        self._empty = False  # the last look found nothing above the socket, and nothing was read since
        self._last_read = 0.0
        self._more = False  # the decoder kept events of the first read, to give at the next poll
        self._since_pause = 0

    def poll(self, wait_s: float | None = None) -> list[Event]:
        """The events that have arrived: those already read, else the next ones, waiting at
        most ``wait_s`` (``None``: as long as the stream may be silent; ``<= 0``: only those
        already read, no read at all). An empty list: none came in time, the body ended
        (``ended``), or the stream was interrupted or closed. Raises ``UpstreamTimeoutError``
        when no first event came by the first-event deadline, ``UpstreamStatusError`` for a
        non-2xx answer, ``UpstreamStreamError`` when the stream broke."""
        pending = self._pending
        if pending:
            self._pending = []
            return pending
        if self._error is not None:
            raise self._raised()
        if self.ended or self._closed or self._broken:
            return []
        if self._interrupted:
            self._interrupted = False
            return []
        if not self._started:
            return self._poll_first(wait_s)
        if wait_s is not None and wait_s <= 0 and not self._more:  # events kept are already read
            return []
        return self._take(None if wait_s is None else time.monotonic() + max(wait_s, 0.0), gather=True)

    def _poll_first(self, wait_s: float | None) -> list[Event]:
        """Before the first event: the request sent (its head), then reads until an event, all
        bounded by ``first_deadline`` (under gevent by one timer for the whole)."""
        name = self.deployment.name
        deadline = self.first_deadline
        now = time.monotonic()
        if now >= deadline:
            raise UpstreamTimeoutError(f"{name} sent no event in time")
        until = deadline if wait_s is None else min(deadline, now + wait_s)
        try:
            with self._tools.bound(deadline - now, UpstreamTimeoutError(f"{name} sent no event in time")):
                if self._raw is None:
                    opening, self._open = self._open, None  # the request's body and fields go with the call
                    assert opening is not None
                    self._opened(opening())
                    if self._closed:
                        return []
                if wait_s is not None and wait_s <= 0:
                    return []
                events = self._take(until, gather=False)
        except UpstreamTimeoutError:
            self._broken = True
            if self._raw is None:
                raise UpstreamTimeoutError(f"{name} sent no response head in time") from None
            raise
        except BaseException:
            self._broken = True
            raise
        if events:
            self._started = True
            self._read_timeout = self._idle_s  # from now on a read that waits is inside a chunk
            return events
        if not (self._closed or self.ended or self._broken) and time.monotonic() >= deadline:
            self._broken = True
            raise UpstreamTimeoutError(f"{name} sent no event in time")
        return []

    def _opened(self, response: requests.Response) -> None:
        """The response head came: where its body is read from, and how to wait for it. Only
        urllib3's response is kept: requests' (its copy of the header fields, its cookie jar,
        the prepared request with the body sent) goes now, not at the stream's end."""
        raw = self._raw = response.raw
        if self._closed:  # closed from elsewhere meanwhile
            _close(raw)
            return
        self._chunks = iter(_chunks(response))
        self._decoder = self._new_decoder()
        self._last_read = time.monotonic()
        # urllib3 keeps http.client's response as ``_fp``; its ``fp`` is the socket's buffered reader.
        fp = getattr(getattr(raw, "_fp", None), "fp", None)
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        if fp is None or sock is None or not hasattr(fp, "peek") or not hasattr(sock, "settimeout"):
            return  # no socket under it (a test double's body): reads don't wait
        self._fp, self._sock = fp, sock
        self._read_timeout = sock.gettimeout()

    def _take(self, until: float | None, gather: bool) -> list[Event]:
        """Read what has arrived into events, waiting for the socket until ``until`` (``None``:
        the idle timeout) when nothing has; ``gather``: go on while more has already arrived.
        A failure after some events is kept for the next poll."""
        out: list[Event] = []
        self._reading = True
        try:
            self._read(until, gather, out)
        except Exception as exc:  # not BaseException: a greenlet killed, an exit go on as they are
            self._broke(exc)
        finally:
            self._reading = False
        if self._error is not None and not out:
            raise self._raised()
        return out

    def _broke(self, exc: BaseException) -> None:
        """A read failed: nothing more is read, and what the reading held (up to the event cap
        in the decoder, the failure's frames) goes now, not when the cyclic collector happens
        by; the failure waits in ``_error`` without the frames it was raised in."""
        self._broken = True
        self._decoder = None
        self._chunks = None
        failure = self._failure(exc)
        exc.__traceback__ = failure.__traceback__ = None
        exc.__context__ = failure.__context__ = None
        self._error = failure

    def _raised(self) -> UpstreamError:
        """The failure kept for this poll, taken (raised by the caller: no local holds it, so
        its traceback's frames don't hold it in turn)."""
        error, self._error = self._error, None
        assert error is not None
        return error

    def _read(self, until: float | None, gather: bool, out: list[Event]) -> list[Event]:
        decoder, chunks = self._decoder, self._chunks
        assert decoder is not None and chunks is not None
        if self._more:  # the rest of the first read, decoded now that its first event went on
            self._more = False
            out += decoder.feed(b"")
            if out:
                return out
        woke = False  # the socket was seen readable
        # Waiting for the first event until the deadline, nothing else can be done meanwhile (no
        # keep-alive is due, no cut can come before the stream is handed on): the reads wait
        # themselves, bounded by the deadline (the socket's timeout, and gevent's timer).
        look = self._started or until is None or until < self.first_deadline
        while True:
            if not look:
                self._sock_timeout(until)
            if not look or self._available(woke):
                woke = False
                if self._since_pause >= YIELD_EVERY:  # a fast upstream: let the other greenlets run
                    self._since_pause = 0
                    self._tools.pause()
                data = next(chunks, b"")
                self._empty = False
                if not data:  # the body's end (read to it: urllib3 gave the connection back)
                    self._finished()
                    out += decoder.end()
                    return out
                self._last_read = now = time.monotonic()
                if gather:
                    events = decoder.feed(data)
                else:  # the first event: the rest of the read decoded at the next poll
                    events = decoder.feed(data, 1)
                    self._more = bool(events)
                self._since_pause += len(events) or 1
                if events:
                    out += events
                    if not gather or len(out) >= YIELD_EVERY:
                        return out
                elif until is not None and now >= until:  # bytes that trickle don't stretch the bound
                    return out
                continue
            if out:  # all that had arrived
                return out
            now = time.monotonic()
            idle_end = self._last_read + self._idle_s
            end = idle_end if until is None else min(until, idle_end)
            if now >= end:
                if now >= idle_end:
                    raise UpstreamStreamError(f"the upstream stream broke: silent for {self._idle_s:g} s")
                return out
            readiness = self._readiness
            if readiness is None:  # made at the first wait (the first event is read without one)
                readiness = self._readiness = self._tools.readiness(self._sock.fileno())
                if self._closed or self._interrupted:  # an interrupt that came before it: not missed
                    self._interrupted = False
                    return out
            woke = readiness.wait(end - now)
            self._since_pause = 0  # the others ran meanwhile
            if self._closed or self._interrupted:
                self._interrupted = False
                return out

    def _sock_timeout(self, until: float | None) -> None:
        """A read before the first event waits at most until ``until`` (outside gevent, where
        no timer bounds it)."""
        sock = self._sock
        if sock is not None and until is not None:
            sock.settimeout(max(until - time.monotonic(), 0.001))

    def _available(self, woke: bool) -> bool:
        """Whether a read gives bytes without waiting: bytes held in http.client's buffered
        reader or the TLS layer, or ready on the socket. One non-blocking look (the socket's
        timeout 0 for a ``peek`` of the buffered reader, which reads the socket only when it
        holds nothing); skipped when the last look found nothing, nothing was read since and
        the socket wasn't seen readable. Readable yet nothing to peek: the body's end or a
        broken connection, which the read itself tells."""
        fp = self._fp
        if fp is None:
            return True
        if self._empty and not woke:
            return False
        sock = self._sock
        sock.settimeout(0.0)
        try:
            peeked = fp.peek(1)
        except ssl.SSLWantReadError:  # a TLS record not whole yet: wait for the rest
            self._empty = True
            return False
        except OSError:  # a TLS renegotiation, a reset connection: the read does it or tells it
            return True
        finally:
            sock.settimeout(self._read_timeout)
        if peeked:
            return True
        self._empty = True
        return woke

    def _finished(self) -> None:
        """The body was read to its end: the connection is the pool's again, not ours to touch."""
        self.ended = True
        self._fp = self._sock = None
        readiness, self._readiness = self._readiness, None
        if readiness is not None:
            readiness.close()

    def _failure(self, exc: BaseException) -> UpstreamError:
        """What stopped the read: the call's own failure (raised by ``_send``: refused, a
        non-2xx answer…), else a body that broke off (a read failed, an event too large); before
        the first event, a read that timed out is no event in time."""
        if isinstance(exc, UpstreamError):
            return exc
        if not self._started and isinstance(exc, _TIMEOUTS):
            return UpstreamTimeoutError(f"{self.deployment.name} sent no event in time")
        return UpstreamStreamError(f"the upstream stream broke: {type(_root(exc)).__name__}")

    @property
    def headers(self) -> Mapping[str, str]:
        """The response's header fields, case-insensitive (none before its head has come)."""
        raw = self._raw
        return raw.headers if raw is not None else {}

    def first(self) -> Event | None:
        """The first event (the rest of its read stays pending); ``None`` if the body ended first."""
        while not (self.ended or self._closed or self._broken):
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
                if self.ended or self._closed or self._broken:
                    return
                continue
            yield from events

    def interrupt(self) -> None:
        """Wake a writer waiting for the next event (from another greenlet or thread): its
        ``poll`` returns what it has, or nothing."""
        self._interrupted = True
        readiness = self._readiness
        if readiness is not None:
            readiness.wake()

    def close(self) -> None:
        """Give the connection back when the body was read to its end (also when its end is
        already here: read now, without waiting), else drop it."""
        if self._closed:
            return
        self._closed = True
        raw = self._raw
        with contextlib.suppress(Exception):  # closing must never raise
            if raw is not None and not (self.ended or self._broken or self._reading):
                self._read_to_end()
        with contextlib.suppress(Exception):
            if raw is not None and not self.ended:
                _shut(raw)  # a thread reading it elsewhere returns
            if raw is not None:
                _close(raw)
        readiness, self._readiness = self._readiness, None
        if readiness is not None:
            with contextlib.suppress(Exception):
                readiness.close()

    def _read_to_end(self) -> None:
        """The body's end, if it has already arrived (a reply's last event usually comes with
        it, or just before it): read, so the connection can be reused. Only what is there is
        read, a little at most; anything but the end leaves the connection to be dropped."""
        chunks = self._chunks
        if chunks is None or self._fp is None:
            return
        self._empty = False
        if not self._available(False):
            return
        self._sock.settimeout(END_READ_TIMEOUT_S)  # the end's few bytes are here, or all but
        if not next(chunks, b""):  # more than the end: the connection is dropped
            self._finished()


def _shut(raw: Any) -> None:
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _close(raw: Any) -> None:
    """What ``requests.Response.close`` does for a body not consumed through it: urllib3's
    response closed (its connection dropped, unless the body was read to its end and the
    connection went back to the pool), then given back."""
    raw.close()
    release_conn = getattr(raw, "release_conn", None)
    if release_conn is not None:
        release_conn()


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
        trace: Mapping[str, str] | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """A non-streaming call: the head and the whole body within ``timeout_s`` (wall clock).
        ``trace``: the attempt's ``traceparent`` (telemetry on), sent whatever the provider."""
        deadline = time.monotonic() + timeout_s
        route = self._route(deployment)
        all_headers = route.provider.headers(headers, "application/json")
        if trace:
            all_headers.update(trace)
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
        trace: Mapping[str, str] | None = None,
    ) -> UpstreamStream:
        """A streaming call, sent by the first ``poll`` (or ``first``, or ``events()``), in the
        caller's greenlet: they give its events and raise its failures (a non-2xx answer
        included). Streams have no total limit; a socket silent for ``stream_idle_timeout_s``
        breaks it (Anthropic pings every few seconds). With ``first_event_timeout_s``, the
        response head and the first event must come within it, by the wall clock (Anthropic
        sends ``message_start`` at once when it takes a stream): ``UpstreamTimeoutError``
        otherwise, which the caller may fail over since nothing reached the client. ``trace``: as
        for ``complete``."""
        first = first_event_timeout_s if first_event_timeout_s is not None else self.stream_idle_timeout_s
        first = min(first, self.stream_idle_timeout_s)
        route = self._route(deployment)  # made here, in the caller: a bad TLS file fails the call
        all_headers = route.provider.headers(headers, "text/event-stream")
        if trace:
            all_headers.update(trace)
        return UpstreamStream(
            deployment,
            time.monotonic() + first,
            # The head's read timeout is the first event's: a head that doesn't come by then is
            # given up outside gevent too, where no wall-clock bound holds the send.
            lambda: self._send(route, deployment, path, body, all_headers, first, True),
            route.provider.decoder,
            self._tools,
            self.stream_idle_timeout_s,
        )
