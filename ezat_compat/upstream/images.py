"""The image step: a request's http(s) image URLs fetched in parallel, every image fitted to the upstream.

Chat Completions reference, "Images and PDFs": the models take images only inline, so EZAT
downloads http(s) URLs itself. Limits: 10 MB per image, 20 image URLs and 32 MB of downloads
per request, 15 seconds per download (redirects included), 3 redirects; the host must be a
public address; the file must be a JPEG, PNG, GIF or WebP image, judged by its bytes.

``ImageFetcher`` is the step's one object (one per process). It holds one ``ThreadPoolExecutor``
per process (created on first use, so after gunicorn's fork; greenlets under gevent, whose
monkey-patching turns ``threading`` into greenlets) that runs a request's downloads side by
side, and puts the layers together:

- ``image_limits``: the limits, the errors and every reason a client can read;
- ``image_shares``: a request's budget (one deadline, one byte budget, one stop switch) and the
  pool's fair shares between requests and organizations;
- ``image_download``: one URL's HTTP exchange, each hop checked and pinned to a public address;
- ``image_fitting``: the images of a request read with Pillow and fitted (``imagefit``).

Errors: ``fetch_all`` raises only ``ImageFetchError`` (``.index``, ``.reason``); a request that
waited for its organization's share until the deadline fails on its first image not started,
``could not download the image (timed out after 15 s waiting for this organization's other
image downloads)`` (``... waiting for a free download slot)`` when every place of the pool was
taken: several organizations at their shares can fill it, and the next free place then goes to
the organization holding fewest). The caller prefixes ``reason`` with the path of the part that
holds URL ``index`` and answers 400 —
``messages[0].content[2].image_url.url: could not download the image (HTTP 404)``.

``prepare(slots, limits)`` is the pipeline's one call: it refuses a request of more images and
documents than the model takes (``too many images and documents: 101 + 0 > 100``), downloads
the URL slots as above, then reads every image (data URLs too) with Pillow, decodes those that
fit once (an image whose data doesn't decode is refused before the upstream sees it) and fits
those over the upstream's limits (``imagefit``: 5 MB of base64, 8000 px, 2000 px past 20
images, 32 MB of body, 200 megapixels a request). Pillow's work never runs on the event loop:
it runs on a few decoding places per process (``decode_threads``, on the hub's real threads),
shared like the downloads' (``Shares``: one organisation holds at most ``org_decode_threads``,
the next free place goes to the organisation holding fewest), all within ``fit_timeout_s``;
after a large decode the freed memory goes back to the system (``memory.py``). It raises
``InvalidRequestError`` naming the part.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from ezat_compat import memory
from ezat_compat.cooperative import tools
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.media import PDF_MEDIA_TYPE, is_pdf, sniff_image_type
from ezat_compat.translate.request import ImageSlot
from ezat_compat.upstream.image_download import Downloader, FetchedImage, as_fetched, reason_for, url_problem
from ezat_compat.upstream.image_fitting import (
    FIT_TIMEOUT_S,
    FREE_PLACE,
    ORG_IMAGES,
    Decoding,
    Image,
    Waited,
    data_raw,
    fit_all,
    invalid_part,
    probe_all,
    write_sources,
)
from ezat_compat.upstream.image_limits import (
    NOT_A_PDF,
    NOT_AN_IMAGE,
    NOT_PUBLIC,
    NOT_RESOLVED,
    ORG_BUSY,
    UNEXPECTED,
    Cancelled,
    ImageFetchError,
    ImageLimits,
    Refused,
    pdf_reason,
    timed_out,
    timed_out_waiting,
    too_many_urls,
)
from ezat_compat.upstream.image_shares import GAVE_UP, GRANTED, Batch, Lanes, Shares
from ezat_compat.upstream.imagefit import (
    DEFAULT_OTHER_BYTES,
    UpstreamImageLimits,
    b64_length,
    decoded_bytes,
    too_much_media,
)
from ezat_compat.upstream.netguard import Resolver

__all__ = [
    "FIT_TIMEOUT_S",
    "NOT_PUBLIC",
    "NOT_RESOLVED",
    "FetchedImage",
    "ImageFetchError",
    "ImageFetcher",
    "ImageLimits",
]

logger = logging.getLogger(__name__)


def _sniff_pdf(data: bytes) -> str | None:
    return PDF_MEDIA_TYPE if is_pdf(data) else None


def _kept(data: bytes, media_type: str) -> bytes:
    return data


def _never() -> bool:
    return False


def _nothing() -> None:
    """A fit failing has no sockets to cut."""


def _decode_wait(outcome: str) -> str:
    """What held a request that got no decoding place (``Shares.acquire``'s outcome)."""
    return ORG_IMAGES if outcome == ORG_BUSY else FREE_PLACE


# Places for Pillow's work in one process (each a hub thread while it decodes): few, since a
# 50-megapixel decode takes ~300 MB and a CPU for a second; one organisation holds at most all
# but one of them, so another's image never waits behind it.
DECODE_THREADS = 2
# Give the allocator's free pages back after a request whose decodes took about this much.
TRIM_AFTER_DECODED_BYTES = 64 * 1024 * 1024

T = TypeVar("T")


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

    ``fit_timeout_s`` bounds the reading and fitting of a request's images (``prepare``),
    which take ``decode_threads`` places of their own (at most ``org_decode_threads`` for one
    organization: all but one by default). Call ``close()`` at shutdown.
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
        decode_threads: int = DECODE_THREADS,
        org_decode_threads: int | None = None,
    ) -> None:
        if min(threads, org_threads, request_threads, decode_threads, org_decode_threads or 1) < 1:
            raise ValueError("threads, org_threads, request_threads and the decode threads must be at least 1")
        self._threads = threads
        self._org_threads = min(org_threads, threads)
        self._request_threads = min(request_threads, threads)
        self._limits = limits
        self._downloader = Downloader(
            allow_private=allow_private,
            resolver=resolver,
            user_agent=user_agent,
            ca_certs=ca_certs,
            extra_ca_files=extra_ca_files,
            pool_size=threads,
        )
        self._fit_timeout_s = fit_timeout_s
        self._decode_threads = decode_threads
        self._org_decode_threads = min(org_decode_threads or max(1, decode_threads - 1), decode_threads)
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._shares = Shares(threads, self._org_threads)
        self._executor_pid = 0
        self._decode_shares = Shares(decode_threads, self._org_decode_threads)
        self._decode_pid = 0

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
        return self._download_all(urls, as_fetched, org)

    def prepare(
        self,
        slots: Sequence[ImageSlot],
        limits: UpstreamImageLimits,
        *,
        org: str = "",
        other_bytes: int = DEFAULT_OTHER_BYTES,
    ) -> None:
        """Make every image of a request ready for the upstream, in place; or 400 naming the part.

        Refuses more images and documents than ``limits.max_media`` before any work (in the
        API's words, ``too many images and documents: 101 + 0 > 100``). Downloads the URL slots
        (as ``fetch_all``), reads every image's header with Pillow (data URLs too), and fits
        each image over ``limits`` for this request (see ``imagefit``); then sets
        ``slot.block["source"]`` of each downloaded or refitted image to its base64 source. A
        data URL that already fits keeps its text as sent. ``other_bytes`` is the size of the
        rest of the upstream body (text, tools…), kept free of images. ``org`` names the
        organization whose shares of the download pool and of the decoding places the work takes.

        Raises ``InvalidRequestError(f"{path}: {reason}", param=path)`` for the first image that
        can't be used (a failed download, bytes Pillow can't decode, a decompression bomb, the
        request's pixel budget, no decoding place within ``fit_timeout_s``): every image's pixels
        are decoded once before it is sent (the upstream refuses one whose data doesn't decode).
        Without images it does nothing; images that fit cost two hand-offs to a hub thread in
        all (their headers, then their decodes), images that are fitted the fit alone.
        """
        if not slots:
            return
        if len(slots) > limits.max_media:
            documents = sum(1 for slot in slots if slot.pdf)
            raise InvalidRequestError(too_much_media(len(slots) - documents, documents, limits.max_media))
        pdfs = [slot for slot in slots if slot.pdf]
        if pdfs:
            other_bytes += self._fetch_pdfs(pdfs, org)
            slots = [slot for slot in slots if not slot.pdf]
        if not slots:
            return
        sources = self._image_sources(slots, org)
        decoding = self._decoding(org)
        images = probe_all(slots, sources, decoding)
        decoded = sum(decoded_bytes(image.probe) for image in images)
        try:
            fit_all(slots, images, limits, other_bytes=other_bytes, decoding=decoding)
        finally:
            if decoded >= TRIM_AFTER_DECODED_BYTES:
                self._give_back(decoded)
        write_sources(slots, images)

    def _image_sources(self, slots: Sequence[ImageSlot], org: str) -> list[tuple[bytes, int, bool]]:
        """Each image slot's (bytes, base64 length, fresh): a data URL's as the translator
        decoded them, a URL's downloaded (fresh: its block's source is written)."""
        sources: list[tuple[bytes, int, bool] | None] = [None] * len(slots)
        for index, slot in enumerate(slots):
            if slot.url is None:
                sources[index] = (data_raw(slot), len(slot.block["source"]["data"]), False)
        url_indexes = [index for index, slot in enumerate(slots) if slot.url is not None]
        if url_indexes:
            try:
                downloaded = self._download_all([slots[i].url or "" for i in url_indexes], _kept, org)
            except ImageFetchError as exc:
                failed = slots[url_indexes[min(max(exc.index, 0), len(url_indexes) - 1)]]
                raise invalid_part(failed, exc.reason) from None
            for index, raw in zip(url_indexes, downloaded, strict=True):
                sources[index] = (raw, b64_length(len(raw)), True)
        ready = [source for source in sources if source is not None]
        if len(ready) != len(slots):  # unreachable: every slot is a data URL or a URL
            raise invalid_part(slots[0], UNEXPECTED)
        return ready

    def _decoding(self, org: str) -> Decoding:
        """Where a request's Pillow work runs: ``org``'s decoding places, until ``fit_timeout_s``
        from now."""
        deadline = time.monotonic() + self._fit_timeout_s
        return Decoding(
            one=partial(self._decode_one, org, deadline),
            lanes=partial(self._fit_lanes, org),
            deadline=deadline,
            timeout_s=self._fit_timeout_s,
        )

    def _decode_one(self, org: str, deadline: float, work: Callable[[], T]) -> T:
        """``work()`` off the loop on one of ``org``'s decoding places (waited for until
        ``deadline``: ``Waited`` then)."""
        shares = self._decode_shares_for_this_process()
        outcome = shares.acquire(org, 0, deadline, _never)
        if outcome != GRANTED:
            raise Waited(_decode_wait(outcome))
        try:
            return tools().off_loop(work)
        finally:
            shares.release(org)

    def _fit_lanes(self, org: str, jobs: Sequence[Callable[[], Image]], deadline: float) -> Lanes[Image]:
        """A request's fits side by side, each lane on one of ``org``'s decoding places."""
        lanes = self._run_on(
            self._decode_shares_for_this_process(), self._org_decode_threads, jobs, org, deadline, _nothing
        )
        if lanes.denied:
            lanes.denied = _decode_wait(lanes.denied)
        return lanes

    @staticmethod
    def _give_back(decoded: int) -> None:
        """After decodes of about ``decoded`` bytes: the allocator's free pages go back to the
        system (``memory.py``; the pixels were freed in threads whose arenas keep them)."""
        try:
            tools().off_loop(partial(memory.after_request_of, decoded))
        except Exception:  # never fails a request
            logger.warning("could not give memory back after decoding images", exc_info=True)

    def _fetch_pdfs(self, slots: Sequence[ImageSlot], org: str) -> int:
        """Download the PDF URL slots (the rules of image URLs, a PDF by its bytes) and set each
        block's base64 source; the base64 bytes they add to the body."""
        try:
            files = self._download_all(
                [slot.url or "" for slot in slots], _kept, org, sniff=_sniff_pdf, refused=NOT_A_PDF
            )
        except ImageFetchError as exc:
            failed = slots[min(max(exc.index, 0), len(slots) - 1)]
            raise invalid_part(failed, pdf_reason(exc.reason)) from None
        added = 0
        for slot, raw in zip(slots, files, strict=True):
            data = base64.b64encode(raw).decode("ascii")
            slot.block["source"] = {"type": "base64", "media_type": PDF_MEDIA_TYPE, "data": data}
            added += len(data)
        return added

    def close(self) -> None:
        """Stop this process's download threads (queued downloads are dropped); a later
        ``fetch_all`` starts new ones."""
        with self._lock:
            executor, self._executor = self._executor, None
            owned = self._executor_pid == os.getpid()
        if executor is not None and owned:
            executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ coordination

    def _executor_for_this_process(self) -> tuple[ThreadPoolExecutor, Shares]:
        """Create the pool (and its shares) on first use in each process: threads and locks
        don't survive gunicorn's fork."""
        pid = os.getpid()
        with self._lock:
            if self._executor is None or self._executor_pid != pid:
                # a worker for each download place and each decoding place: a lane never queues
                self._executor = ThreadPoolExecutor(
                    max_workers=self._threads + self._decode_threads, thread_name_prefix="ezat-images"
                )
                self._shares = Shares(self._threads, self._org_threads)
                self._executor_pid = pid
            return self._executor, self._shares

    def _decode_shares_for_this_process(self) -> Shares:
        """The decoding places' shares, made anew in each process (its lock doesn't survive a fork)."""
        pid = os.getpid()
        with self._lock:
            if self._decode_pid != pid:
                self._decode_shares = Shares(self._decode_threads, self._org_decode_threads)
                self._decode_pid = pid
            return self._decode_shares

    def _run(
        self, jobs: Sequence[Callable[[], T]], org: str, deadline: float, on_failure: Callable[[], None]
    ) -> Lanes[T]:
        """Run a request's ``jobs`` on the pool, at most ``request_threads`` at once, each lane
        on a place of ``org``'s share; return when all are done, one failed, or at ``deadline``
        (the lanes are stopped then: the caller reads what they did)."""
        _executor, shares = self._executor_for_this_process()
        return self._run_on(shares, self._request_threads, jobs, org, deadline, on_failure)

    def _run_on(
        self,
        shares: Shares,
        most: int,
        jobs: Sequence[Callable[[], T]],
        org: str,
        deadline: float,
        on_failure: Callable[[], None],
    ) -> Lanes[T]:
        """``_run`` on the places of ``shares`` (the downloads' or the decodes'), at most
        ``most`` lanes at once."""
        executor, _shares = self._executor_for_this_process()
        lanes: Lanes[T] = Lanes(jobs, shares, on_failure)
        try:
            for held in range(min(most, len(jobs))):
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
    def _lane_ended(shares: Shares, org: str, lanes: Lanes[T], future: Future[None]) -> None:
        shares.release(org)
        if future.cancelled():
            lanes.abandon()

    def _download_all(
        self,
        urls: Sequence[str],
        finish: Callable[[bytes, str], T],
        org: str,
        *,
        sniff: Callable[[bytes], str | None] = sniff_image_type,
        refused: str = NOT_AN_IMAGE,
    ) -> list[T]:
        """``fetch_all`` with what each worker makes of its bytes and media type: ``finish``
        runs on the pool and may raise ``Refused``. ``sniff`` names the bytes' type (None:
        refused with ``refused``): an image's by default."""
        urls = list(urls)
        limits = self._limits
        if len(urls) > limits.max_urls:
            raise ImageFetchError(limits.max_urls, too_many_urls(limits))
        for index, url in enumerate(urls):
            problem = url_problem(url)
            if problem is not None:
                raise ImageFetchError(index, problem)
        if not urls:
            return []
        batch = Batch(limits)
        jobs = [partial(self._download, batch, index, url, finish, sniff, refused) for index, url in enumerate(urls)]
        try:
            lanes = self._run(jobs, org, batch.deadline, batch.stop)
        except Exception as err:  # e.g. the executor was shut down under us
            logger.warning("image fetch failed unexpectedly", exc_info=err)
            raise ImageFetchError(0, UNEXPECTED) from err
        finally:
            batch.stop()
        return self._outcome(lanes, batch)

    @staticmethod
    def _outcome(lanes: Lanes[T], batch: Batch) -> list[T]:
        """The images in order; or the first failure (the lowest index among those seen); or,
        past the deadline, the lowest URL without its image: timed out, or timed out waiting
        for a place when it never started."""
        errors = {i: err for i, err in lanes.errors.items() if not isinstance(err, Cancelled)}
        results = list(lanes.results)
        if batch.remaining() <= 0 and any(result is None for result in results):
            index = next(i for i, result in enumerate(results) if result is None)
            err = errors.get(index)
            if isinstance(err, ImageFetchError) and err.reason != timed_out(batch.limits):
                raise err
            if not lanes.started(index) and lanes.denied:
                raise ImageFetchError(index, timed_out_waiting(batch.limits, lanes.denied))
            raise ImageFetchError(index, timed_out(batch.limits))
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

    def _download(
        self,
        batch: Batch,
        index: int,
        url: str,
        finish: Callable[[bytes, str], T],
        sniff: Callable[[bytes], str | None],
        refused: str,
    ) -> T:
        """Runs on the pool: one URL, redirects included. Raises ImageFetchError or Cancelled."""
        try:
            batch.check()
            data = self._downloader.download_bytes(batch, url)
            media_type = sniff(data)
            if media_type is None:
                raise Refused(refused)
            return finish(data, media_type)
        except Cancelled:
            raise
        except Exception as err:
            if batch.stopped:  # our own shutdown of the socket, not the host's fault
                raise Cancelled from err
            if isinstance(err, Refused):
                raise ImageFetchError(index, err.reason) from None
            raise ImageFetchError(index, reason_for(err, batch.limits)) from err
