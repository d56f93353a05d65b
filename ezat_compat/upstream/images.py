"""The image step: a request's http(s) image URLs fetched in parallel, every image fitted to the upstream.

Chat Completions reference, "Images and PDFs": the models take images only inline, so EZAT
downloads http(s) URLs itself. Limits: 10 MB per image, 20 image URLs and 32 MB of downloads
per request, 15 seconds per download (redirects included), 3 redirects; the host must be a
public address; the file must be a JPEG, PNG, GIF or WebP image, judged by its bytes.

How a download stays inside those bounds:

- one ``ThreadPoolExecutor`` per process (created on first use, so after gunicorn's fork;
  greenlets under gevent, whose monkey-patching turns ``threading`` into greenlets) runs a
  request's downloads side by side;
- the pool is shared fairly (``_Shares``): one request runs at most ``request_threads`` of its
  downloads at once and one organization at most ``org_threads``, so no tenant can fill the pool.
  Work goes to the pool only once it holds a place: a request over its organization's share
  waits in its own thread for that organization's places (never in the pool's queue, in front
  of another organization's work), until its deadline;
- every hop (redirects are followed here, at most ``max_redirects``) resolves its host once,
  refuses non-public addresses (``netguard``) and connects to exactly that address, with the
  ``Host`` header, TLS SNI and certificate check for the name (no DNS-rebinding window;
  ``pinning``);
- bodies are read in chunks against the per-image cap, a byte budget shared by the request's
  downloads and one wall-clock deadline; at the deadline, or when any download fails, the
  request's sockets are shut down from the waiting thread so no worker reads on for nobody.

Errors: ``fetch_all`` raises only ``ImageFetchError`` (``.index``, ``.reason``); a request that
waited for its organization's share until the deadline fails on its first image not started,
``could not download the image (timed out after 15 s waiting for this organization's other
image downloads)`` (``... waiting for a free download slot)`` when every place of the pool was
taken: several organizations at their shares can fill it, and the next free place then goes to
the organization holding fewest). The caller prefixes ``reason`` with the path of the part that
holds URL ``index`` and answers 400 —
``messages[0].content[2].image_url.url: could not download the image (HTTP 404)``.

``prepare(slots, limits)`` is the pipeline's one call: it downloads the URL slots as above, then
reads every image (data URLs too) with Pillow and fits those over the upstream's limits
(``imagefit``: 5 MB of base64, 8000 px, 2000 px past 20 images, 32 MB of body) on the same
pool, each bounded by ``fit_timeout_s``; it raises ``InvalidRequestError`` naming the part.
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions

from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.media import decode_base64, sniff_image_type
from ezat_compat.translate.request import ImageSlot
from ezat_compat.upstream.egress import TLSAdapter, environment_proxies, verifying_context
from ezat_compat.upstream.imagefit import (
    DEFAULT_OTHER_BYTES,
    NO_ROOM,
    FitTarget,
    ImageFitError,
    Probe,
    UpstreamImageLimits,
    b64_length,
    fit,
    plan,
    probe,
)
from ezat_compat.upstream.netguard import (
    HostResolutionError,
    NonPublicAddressError,
    Resolver,
    parse_ip_literal,
    resolve_public,
)
from ezat_compat.upstream.pinning import PinnedAdapter, Target, Watch

logger = logging.getLogger(__name__)

_MB = 1024 * 1024
_CHUNK = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# The four types the models take, named so content negotiation doesn't pick AVIF/JPEG XL.
_ACCEPT = "image/png,image/jpeg,image/gif,image/webp,*/*;q=0.1"
FIT_TIMEOUT_S = 30.0  # wall clock for fitting a request's images, once downloaded
_FIT_PASSES = 3  # plan-and-fit rounds (a second is rare, a third rarer)
T = TypeVar("T")


@dataclass(frozen=True)
class ImageLimits:
    """Per-request limits of "Images and PDFs"; the defaults are the spec's numbers."""

    max_image_bytes: int = 10 * _MB
    max_urls: int = 20
    max_total_bytes: int = 32 * _MB
    timeout_s: float = 15.0  # wall clock for the whole download, redirects included
    max_redirects: int = 3


@dataclass(frozen=True)
class FetchedImage:
    """One downloaded image, ready for an Anthropic ``{"type": "base64"}`` image source."""

    media_type: str  # from the bytes' signature, never from content-type
    data_b64: str


class ImageFetchError(Exception):
    """Image URL number ``index`` of the batch can't be used; ``reason`` says why, in the spec's words.

    The client's request is at fault (or the image host): answer 400 with
    ``f"{path_of_url[index]}: {reason}"`` (an ``InvalidRequestError``). Retrying the same
    request as is won't help, except after a timeout or a failed connection.
    """

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"image URL {index}: {reason}")
        self.index = index
        self.reason = reason


class _Refused(Exception):
    """A download failed with a client-facing ``reason`` (internal; becomes ImageFetchError)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Cancelled(Exception):
    """The batch was stopped (another download failed, or the deadline passed): nobody waits."""


# ---------------------------------------------------------------- reasons (the spec's texts)


def _number(value: float) -> str:
    """``15.0`` -> ``15``, ``0.5`` -> ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _could_not(why: str) -> str:
    return f"could not download the image ({why})"


CONNECTION_FAILED = _could_not("connection failed")
NOT_RESOLVED = _could_not("the host name could not be resolved")
NOT_HTTP = _could_not("only http and https URLs are supported")
NOT_PUBLIC = _could_not("the host is not a public address")
INVALID_URL = _could_not("the URL is not valid")
UNEXPECTED = _could_not("unexpected error")
NOT_AN_IMAGE = "the file is not a JPEG, PNG, GIF or WebP image"


def _timed_out(limits: ImageLimits) -> str:
    return _could_not(f"timed out after {_number(limits.timeout_s)} s")


def _timed_out_waiting(limits: ImageLimits, why: str) -> str:
    return _could_not(f"timed out after {_number(limits.timeout_s)} s waiting for {why}")


ORG_BUSY = "this organization's other image downloads"
POOL_BUSY = "a free download slot"


def _too_many_redirects(limits: ImageLimits) -> str:
    return _could_not(f"more than {limits.max_redirects} redirects")


def _too_large(limits: ImageLimits) -> str:
    return f"the image is larger than {_number(limits.max_image_bytes / _MB)} MB"


def _too_many_urls(limits: ImageLimits) -> str:
    return f"too many image URLs (at most {limits.max_urls} per request)"


def _over_total(limits: ImageLimits) -> str:
    return f"the image downloads of this request exceed {_number(limits.max_total_bytes / _MB)} MB in total"


def _reason_for(err: BaseException, limits: ImageLimits) -> str:
    """The one map from low-level failures to reasons; order matters (ConnectTimeout is both)."""
    if isinstance(err, requests.Timeout | urllib3.exceptions.TimeoutError | TimeoutError):
        return _timed_out(limits)
    if isinstance(err, requests.exceptions.InvalidURL | urllib3.exceptions.LocationValueError):
        return INVALID_URL
    if isinstance(err, requests.RequestException | urllib3.exceptions.HTTPError | http.client.HTTPException | OSError):
        return CONNECTION_FAILED
    logger.warning("unexpected error while downloading an image", exc_info=err)
    return UNEXPECTED


# ---------------------------------------------------------------- URLs


def _url_problem(url: str) -> str | None:
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


# ---------------------------------------------------------------- images of a request (prepare)


FIT_UNEXPECTED = "the image could not be processed (unexpected error)"


def _could_not_fit_in_time(timeout_s: float) -> str:
    return f"the image could not be resized within {_number(timeout_s)} s"


@dataclass(frozen=True, slots=True)
class _Image:
    """One image of the request: its bytes, header, base64 length, and whether its block's
    source must be (re)written (downloaded or refitted) rather than left as the client sent it."""

    raw: bytes
    probe: Probe
    b64: int
    fresh: bool


def _refused(slot: ImageSlot, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"{slot.path}: {reason}", param=slot.path)


def _data_image(slot: ImageSlot) -> _Image:
    """A data URL's image, from the bytes the translator decoded (or its source's text)."""
    data: str = slot.block["source"]["data"]
    raw = slot.raw if slot.raw is not None else decode_base64(data)
    if raw is None:  # the translator checked it; a slot built elsewhere might not be
        raise _refused(slot, "the data is not valid base64")
    try:
        header = probe(raw)
    except ImageFitError as exc:
        raise _refused(slot, exc.reason) from None
    return _Image(raw=raw, probe=header, b64=len(data), fresh=False)


def _as_fetched(data: bytes, media_type: str) -> FetchedImage:
    return FetchedImage(media_type=media_type, data_b64=base64.b64encode(data).decode("ascii"))


def _as_probed(data: bytes, media_type: str) -> _Image:
    """Runs on the pool, after a download: Pillow reads the header (``media_type`` is the sniffed one)."""
    try:
        header = probe(data)
    except ImageFitError as exc:
        raise _Refused(exc.reason) from None
    return _Image(raw=data, probe=header, b64=b64_length(len(data)), fresh=True)


def _fitted(image: _Image, target: FitTarget) -> _Image:
    """Runs on the pool: the image scaled and re-encoded to fit ``target``."""
    media_type, raw = fit(image.raw, image.probe, target)
    header = probe(raw)
    if header.media_type != media_type:  # unreachable: what Pillow wrote, Pillow reads
        raise ImageFitError(FIT_UNEXPECTED)
    return _Image(raw=raw, probe=header, b64=b64_length(len(raw)), fresh=True)


# ---------------------------------------------------------------- one request's batch


class _Batch:
    """What a request's downloads share: the deadline, the byte budget and the stop switch."""

    def __init__(self, limits: ImageLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout_s
        self._lock = threading.Lock()
        self._total = 0
        self._stopped = False
        self._watches: set[Watch] = set()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise when the download should end now: stopped, or past the deadline."""
        if self._stopped:
            raise _Cancelled
        if self.remaining() <= 0:
            raise _Refused(_timed_out(self.limits))

    def fits(self, size: int) -> bool:
        with self._lock:
            return self._total + size <= self.limits.max_total_bytes

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes; False once the request's total is over its cap."""
        with self._lock:
            self._total += size
            return self._total <= self.limits.max_total_bytes

    @contextmanager
    def watch(self) -> Iterator[Watch]:
        watch = Watch()
        with self._lock:
            if self._stopped:
                raise _Cancelled
            self._watches.add(watch)
        try:
            yield watch
        finally:
            with self._lock:
                self._watches.discard(watch)
            watch.release()

    def stop(self) -> None:
        """End every download of the batch now: later checks raise, open sockets are cut."""
        with self._lock:
            self._stopped = True
            watches = list(self._watches)
        for watch in watches:
            watch.abort()


# ---------------------------------------------------------------- fair places on the pool


GRANTED = "granted"
GAVE_UP = "gave up"  # the request needs no more places (all its work started, or it stopped)


@dataclass(eq=False)
class _Waiter:
    org: str
    held: int  # places its request holds already
    seq: int


class _Shares:
    """The pool's places (one per thread), handed out fairly between organizations.

    A waiter gets a place when the pool has one free, its organization holds fewer than
    ``per_org`` and no other waiter that could take that place goes first: the one whose
    organization holds fewer places, then whose request holds fewer, then the earlier one. A
    waiter whose organization is at its share isn't in the running, so it holds up nobody; it
    waits for one of its own organization's places to be released. One per process (its lock
    doesn't survive a fork); under gevent the condition is a greenlet's.
    """

    def __init__(self, total: int, per_org: int) -> None:
        self.total = total
        self.per_org = max(1, min(per_org, total))
        self._cond = threading.Condition()
        self._used = 0
        self._by_org: dict[str, int] = {}
        self._waiters: list[_Waiter] = []
        self._seq = 0

    def held_by(self, org: str) -> int:
        with self._cond:
            return self._by_org.get(org, 0)

    def acquire(self, org: str, held: int, deadline: float, give_up: Callable[[], bool]) -> str:
        """Wait for one place for ``org`` (whose request holds ``held``) until ``deadline``
        (``time.monotonic``). Returns ``GRANTED``; ``GAVE_UP`` once ``give_up()`` (checked
        under the lock; call ``poke`` after changing what it reads); or, at the deadline, why
        there was no place: ``ORG_BUSY`` or ``POOL_BUSY``."""
        with self._cond:
            self._seq += 1
            waiter = _Waiter(org=org, held=held, seq=self._seq)
            self._waiters.append(waiter)
            try:
                while True:
                    if give_up():
                        return GAVE_UP
                    if self._next_in_line() is waiter:
                        self._used += 1
                        self._by_org[org] = self._by_org.get(org, 0) + 1
                        return GRANTED
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return ORG_BUSY if self._by_org.get(org, 0) >= self.per_org else POOL_BUSY
                    self._cond.wait(remaining)
            finally:
                self._waiters.remove(waiter)
                self._cond.notify_all()  # the next in line may be another waiter now

    def _next_in_line(self) -> _Waiter | None:
        """The waiter the next free place goes to, or None (no place free, or nobody may take it)."""
        if self._used >= self.total:
            return None
        eligible = [w for w in self._waiters if self._by_org.get(w.org, 0) < self.per_org]
        if not eligible:
            return None
        return min(eligible, key=lambda w: (self._by_org.get(w.org, 0), w.held, w.seq))

    def release(self, org: str) -> None:
        with self._cond:
            self._used -= 1
            left = self._by_org.get(org, 0) - 1
            if left > 0:
                self._by_org[org] = left
            else:
                self._by_org.pop(org, None)
            self._cond.notify_all()

    def poke(self) -> None:
        """Wake the waiters so that they check ``give_up`` again."""
        with self._cond:
            self._cond.notify_all()


class _Lanes(Generic[T]):
    """One request's jobs on the pool, taken in order by its lanes (each lane holds one place
    and runs jobs until none is left). The first failure stops the others: no lane takes a new
    job, and ``on_failure`` runs (it cuts the request's sockets)."""

    def __init__(self, jobs: Sequence[Callable[[], T]], shares: _Shares, on_failure: Callable[[], None]) -> None:
        self._jobs = list(jobs)
        self._shares = shares
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._next = 0
        self._finished: set[int] = set()
        self.results: list[T | None] = [None] * len(self._jobs)
        self.errors: dict[int, BaseException] = {}
        self.stopped = False
        self.abandoned = False  # a lane was cancelled before it ran (the pool was shut down)
        self.denied = ""  # why the last wait for a place ended without one, if it did

    def nothing_to_start(self) -> bool:
        return self.stopped or self._next >= len(self._jobs)

    def started(self, index: int) -> bool:
        return index < self._next

    def unfinished(self) -> int:
        """The lowest index without a result or an error."""
        with self._cond:
            return next((i for i in range(len(self._jobs)) if i not in self._finished), 0)

    def lane(self) -> None:
        """Runs on the pool."""
        while True:
            with self._cond:
                if self.nothing_to_start():
                    return
                index = self._next
                self._next += 1
            self._shares.poke()  # the request may be waiting for a place it no longer needs
            try:
                result = self._jobs[index]()
            except BaseException as err:
                self._finish(index, None, err)
                return
            self._finish(index, result, None)

    def _finish(self, index: int, result: T | None, err: BaseException | None) -> None:
        with self._cond:
            self._finished.add(index)
            if err is None:
                self.results[index] = result
            else:
                self.errors[index] = err
                self.stopped = True
            self._cond.notify_all()
        if err is not None:
            self._on_failure()
            self._shares.poke()

    def abandon(self) -> None:
        with self._cond:
            self.abandoned = self.stopped = True
            self._cond.notify_all()
        self._shares.poke()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
        self._shares.poke()

    def wait(self, deadline: float) -> bool:
        """Until every job is done, one failed, or ``deadline``; True unless the deadline came first."""
        with self._cond:
            while not (self.stopped or len(self._finished) == len(self._jobs)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True


# ---------------------------------------------------------------- the fetcher


class ImageFetcher:
    """Downloads the image URLs of a request: one per process, shared by all requests.

    ``threads`` bounds the downloads running at once in this process (config
    ``image_fetch_threads``), ``org_threads`` those of one organization
    (``image_fetch_org_threads``) and ``request_threads`` those of one request
    (``image_fetch_request_threads``), both at most ``threads``; fitting takes places on the
    same pool under the same shares. ``allow_private`` (config ``allow_private_image_hosts``,
    tests only) lets URLs reach loopback and private hosts, still pinned to the checked address.
    ``resolver`` replaces ``socket.getaddrinfo`` (tests); ``ca_certs`` names a CA bundle to
    trust instead of the default one (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` or certifi's),
    ``extra_ca_files`` CAs trusted besides it (``[gateway] ca_file``: a TLS-inspecting proxy's).

    A download goes through the proxy the environment names for its URL (``HTTPS_PROXY``,
    ``HTTP_PROXY``, ``NO_PROXY``, as requests reads them). The guard runs first all the same: a
    host that resolves here must resolve to public addresses only, an address literal must be
    public; a name that doesn't resolve here is left to the proxy, which resolves it (refuse
    internal destinations at the proxy too). Through a proxy the exchange is bounded by the
    deadline's timeouts and the reads' checks, not cut from the waiting thread.

    ``fit_timeout_s`` bounds the fitting
    of a request's images (``prepare``), on the same pool. Call ``close()`` at shutdown.
    """

    def __init__(
        self,
        *,
        threads: int,
        allow_private: bool,
        org_threads: int = 20,
        request_threads: int = 20,
        limits: ImageLimits = ImageLimits(),
        resolver: Resolver | None = None,
        user_agent: str = "ezat-compat-image-fetcher",
        ca_certs: str | None = None,
        extra_ca_files: Sequence[str] = (),
        fit_timeout_s: float = FIT_TIMEOUT_S,
    ) -> None:
        if min(threads, org_threads, request_threads) < 1:
            raise ValueError("threads, org_threads and request_threads must be at least 1")
        self._threads = threads
        self._org_threads = min(org_threads, threads)
        self._request_threads = min(request_threads, threads)
        self._allow_private = allow_private
        self._limits = limits
        self._resolver = resolver
        self._user_agent = user_agent
        self._ca_certs = ca_certs
        self._extra_ca_files = tuple(extra_ca_files)
        self._tls: tuple[int, ssl.SSLContext, TLSAdapter] | None = None  # made once per process
        self._fit_timeout_s = fit_timeout_s
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._shares = _Shares(threads, self._org_threads)
        self._executor_pid = 0

    @property
    def limits(self) -> ImageLimits:
        return self._limits

    def fetch_all(self, urls: Sequence[str], *, org: str = "") -> list[FetchedImage]:
        """Download every URL in parallel; return the images in the order of ``urls``.

        ``org`` names the organization whose share of the pool the downloads take (see the
        class); a request that can't get a place before its deadline fails on its first URL
        not started, with the ``timed out ... waiting for ...`` reason.

        Raises ``ImageFetchError`` — and no other exception — for the first URL that fails
        (the lowest index among the failures seen when the first one arrives); the other
        downloads are stopped at once. More than ``max_urls`` URLs fail before any download,
        on index ``max_urls``; a URL that isn't http(s) or can't be parsed fails before any
        download too. All downloads share one deadline (``timeout_s`` from this call).
        """
        return self._download_all(urls, _as_fetched, org)

    def prepare(
        self,
        slots: Sequence[ImageSlot],
        limits: UpstreamImageLimits,
        *,
        org: str = "",
        other_bytes: int = DEFAULT_OTHER_BYTES,
    ) -> None:
        """Make every image of a request ready for the upstream, in place; or 400 naming the part.

        Downloads the URL slots (as ``fetch_all``), reads every image's header with Pillow (data
        URLs too), and fits each image over ``limits`` for this request (see ``imagefit``) on
        the pool; then sets ``slot.block["source"]`` of each downloaded or refitted image to its
        base64 source. A data URL that already fits keeps its text as sent. ``other_bytes`` is
        the size of the rest of the upstream body (text, tools…), kept free of images. ``org``
        names the organization whose share of the pool the downloads and fits take.

        Raises ``InvalidRequestError(f"{path}: {reason}", param=path)`` for the first image that
        can't be used (a failed download, bytes Pillow can't decode, a decompression bomb).
        Without images it does nothing; images that fit cost a header read each.
        """
        if not slots:
            return
        images: list[_Image | None] = [None] * len(slots)
        for index, slot in enumerate(slots):  # data URLs: the header only, here (microseconds)
            if slot.url is None:
                images[index] = _data_image(slot)
        url_indexes = [index for index, slot in enumerate(slots) if slot.url is not None]
        if url_indexes:
            try:
                downloaded = self._download_all([slots[i].url or "" for i in url_indexes], _as_probed, org)
            except ImageFetchError as exc:
                raise _refused(slots[url_indexes[min(max(exc.index, 0), len(url_indexes) - 1)]], exc.reason) from None
            for index, image in zip(url_indexes, downloaded, strict=True):
                images[index] = image
        ready = [image for image in images if image is not None]
        if len(ready) != len(slots):  # unreachable: every slot is a data URL or a URL
            raise _refused(slots[0], UNEXPECTED)
        self._fit_all(slots, ready, limits, other_bytes, org)
        for slot, image in zip(slots, ready, strict=True):
            if image.fresh:
                data = base64.b64encode(image.raw).decode("ascii")
                slot.block["source"] = {"type": "base64", "media_type": image.probe.media_type, "data": data}

    # ------------------------------------------------------------ fitting

    def _fit_all(
        self, slots: Sequence[ImageSlot], images: list[_Image], limits: UpstreamImageLimits, other_bytes: int, org: str
    ) -> None:
        """Plan and fit until every image is within its target (a second pass is rare)."""
        for _pass in range(_FIT_PASSES + 1):
            try:
                targets = plan([(image.probe, image.b64) for image in images], limits, other_bytes=other_bytes)
            except ImageFitError as exc:
                raise _refused(slots[0], exc.reason) from None
            work = [(index, target) for index, target in enumerate(targets) if target is not None]
            if not work:
                return
            if _pass == _FIT_PASSES:
                raise _refused(slots[work[0][0]], NO_ROOM)
            self._run_fits(slots, images, work, org)

    def _run_fits(
        self, slots: Sequence[ImageSlot], images: list[_Image], work: list[tuple[int, FitTarget]], org: str
    ) -> None:
        jobs = [partial(_fitted, images[index], target) for index, target in work]
        lanes = self._run(jobs, org, time.monotonic() + self._fit_timeout_s, lambda: None)
        for position, (index, _target) in enumerate(work):
            err = lanes.errors.get(position)
            if isinstance(err, ImageFitError):
                raise _refused(slots[index], err.reason)
            if err is not None:
                logger.warning("unexpected error while fitting an image", exc_info=err)
                raise _refused(slots[index], FIT_UNEXPECTED)
        if lanes.abandoned:
            raise _refused(slots[work[lanes.unfinished()][0]], FIT_UNEXPECTED)
        for position, (index, _target) in enumerate(work):
            result = lanes.results[position]
            if result is None:
                raise _refused(slots[index], _could_not_fit_in_time(self._fit_timeout_s))
            images[index] = result

    def close(self) -> None:
        """Stop this process's download threads (queued downloads are dropped); a later
        ``fetch_all`` starts new ones."""
        with self._lock:
            executor, self._executor = self._executor, None
            owned = self._executor_pid == os.getpid()
        if executor is not None and owned:
            executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ coordination

    def _executor_for_this_process(self) -> tuple[ThreadPoolExecutor, _Shares]:
        """Create the pool (and its shares) on first use in each process: threads and locks
        don't survive gunicorn's fork."""
        pid = os.getpid()
        with self._lock:
            if self._executor is None or self._executor_pid != pid:
                self._executor = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="ezat-images")
                self._shares = _Shares(self._threads, self._org_threads)
                self._executor_pid = pid
            return self._executor, self._shares

    def _run(
        self, jobs: Sequence[Callable[[], T]], org: str, deadline: float, on_failure: Callable[[], None]
    ) -> _Lanes[T]:
        """Run a request's ``jobs`` on the pool, at most ``request_threads`` at once, each lane
        on a place of ``org``'s share; return when all are done, one failed, or at ``deadline``
        (the lanes are stopped then: the caller reads what they did)."""
        executor, shares = self._executor_for_this_process()
        lanes: _Lanes[T] = _Lanes(jobs, shares, on_failure)
        try:
            for held in range(min(self._request_threads, len(jobs))):
                outcome = shares.acquire(org, held, deadline, lanes.nothing_to_start)
                if outcome != GRANTED:
                    lanes.denied = "" if outcome == GAVE_UP else outcome
                    break
                try:
                    future = executor.submit(lanes.lane)
                except BaseException:
                    shares.release(org)
                    raise
                future.add_done_callback(partial(self._lane_ended, shares, org, lanes))
            lanes.wait(deadline)
        finally:
            lanes.stop()
        return lanes

    @staticmethod
    def _lane_ended(shares: _Shares, org: str, lanes: _Lanes[T], future: Future[None]) -> None:
        shares.release(org)
        if future.cancelled():
            lanes.abandon()

    def _download_all(self, urls: Sequence[str], finish: Callable[[bytes, str], T], org: str) -> list[T]:
        """``fetch_all`` with what each worker makes of its bytes and media type: ``finish``
        runs on the pool and may raise ``_Refused``."""
        urls = list(urls)
        limits = self._limits
        if len(urls) > limits.max_urls:
            raise ImageFetchError(limits.max_urls, _too_many_urls(limits))
        for index, url in enumerate(urls):
            problem = _url_problem(url)
            if problem is not None:
                raise ImageFetchError(index, problem)
        if not urls:
            return []
        batch = _Batch(limits)
        jobs = [partial(self._download, batch, index, url, finish) for index, url in enumerate(urls)]
        try:
            lanes = self._run(jobs, org, batch.deadline, batch.stop)
        except Exception as err:  # e.g. the executor was shut down under us
            logger.warning("image fetch failed unexpectedly", exc_info=err)
            raise ImageFetchError(0, UNEXPECTED) from err
        finally:
            batch.stop()
        return self._outcome(lanes, batch)

    @staticmethod
    def _outcome(lanes: _Lanes[T], batch: _Batch) -> list[T]:
        """The images in order; or the first failure (the lowest index among those seen); or,
        past the deadline, the lowest URL without its image: timed out, or timed out waiting
        for a place when it never started."""
        errors = {i: err for i, err in lanes.errors.items() if not isinstance(err, _Cancelled)}
        results = list(lanes.results)
        if batch.remaining() <= 0 and any(result is None for result in results):
            index = next(i for i, result in enumerate(results) if result is None)
            err = errors.get(index)
            if isinstance(err, ImageFetchError) and err.reason != _timed_out(batch.limits):
                raise err
            if not lanes.started(index) and lanes.denied:
                raise ImageFetchError(index, _timed_out_waiting(batch.limits, lanes.denied))
            raise ImageFetchError(index, _timed_out(batch.limits))
        for index in sorted(errors):
            err = errors[index]
            if isinstance(err, ImageFetchError):
                raise err
            logger.warning("image fetch failed unexpectedly", exc_info=err)
            raise ImageFetchError(index, UNEXPECTED)
        if lanes.abandoned or any(result is None for result in results):
            raise ImageFetchError(lanes.unfinished(), UNEXPECTED)
        return [result for result in results if result is not None]

    # ------------------------------------------------------------ one download (worker side)

    def _download(self, batch: _Batch, index: int, url: str, finish: Callable[[bytes, str], T]) -> T:
        """Runs on the pool: one URL, redirects included. Raises ImageFetchError or _Cancelled."""
        try:
            batch.check()
            data = self._download_bytes(batch, url)
            media_type = sniff_image_type(data)
            if media_type is None:
                raise _Refused(NOT_AN_IMAGE)
            return finish(data, media_type)
        except _Cancelled:
            raise
        except Exception as err:
            if batch.stopped:  # our own shutdown of the socket, not the host's fault
                raise _Cancelled from err
            if isinstance(err, _Refused):
                raise ImageFetchError(index, err.reason) from None
            raise ImageFetchError(index, _reason_for(err, batch.limits)) from err

    def _download_bytes(self, batch: _Batch, url: str) -> bytes:
        for _hop in range(batch.limits.max_redirects + 1):
            with self._exchange(batch, url) as response:
                location = _redirect_location(response)
                if location is not None:
                    url = urljoin(response.url, location)
                    continue
                if response.status_code != 200:
                    raise _Refused(_could_not(f"HTTP {response.status_code}"))
                return self._read_body(batch, response)
        raise _Refused(_too_many_redirects(batch.limits))

    def _tls_for_this_process(self) -> tuple[ssl.SSLContext, TLSAdapter]:
        """The TLS context of downloads and the adapter of proxied ones, made once per process."""
        tls = self._tls
        if tls is None or tls[0] != os.getpid():
            context = verifying_context(self._extra_ca_files, ca_bundle=self._ca_certs)
            tls = self._tls = (os.getpid(), context, TLSAdapter(context, pool_maxsize=self._threads, pool_block=False))
        return tls[1], tls[2]

    @contextmanager
    def _exchange(self, batch: _Batch, url: str) -> Iterator[requests.Response]:
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
        problem = _url_problem(url)  # redirect targets get the same checks as the client's URLs
        if problem is not None:
            raise _Refused(problem)
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
                raise _Refused(NOT_RESOLVED) from None
            ip = ""  # the proxy resolves it
        except NonPublicAddressError:
            raise _Refused(NOT_PUBLIC) from None
        target = Target(scheme=scheme, host=host, port=port, explicit_port=parts.port is not None, ip=ip)
        if not proxies:
            request.headers["Host"] = target.host_header
        return target, request, proxies

    def _read_body(self, batch: _Batch, response: requests.Response) -> bytes:
        """Read the body in chunks, stopping as soon as a cap or the deadline is passed."""
        limits = batch.limits
        length = _content_length(response)
        if length is not None and length > limits.max_image_bytes:
            raise _Refused(_too_large(limits))
        if length is not None and not batch.fits(length):
            raise _Refused(_over_total(limits))
        body = bytearray()
        while True:
            batch.check()
            chunk = response.raw.read1(_CHUNK, decode_content=False)  # returns what one read gives
            if not chunk:
                return bytes(body)
            if len(body) + len(chunk) > limits.max_image_bytes:
                raise _Refused(_too_large(limits))
            if not batch.reserve(len(chunk)):
                raise _Refused(_over_total(limits))
            body += chunk
