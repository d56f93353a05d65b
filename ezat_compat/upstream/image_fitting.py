"""A request's images fitted to the upstream: read with Pillow, planned, refitted on the pool.

``imagefit`` holds the pure algorithm (``probe``, ``plan``, ``fit``: 5 MB of base64, 8000 px,
2000 px past 20 images, 32 MB of body); this module runs it over one request's images. Every
image's header (data URLs too) is read once with Pillow; ``fit_all`` plans and fits until each is
within its target, the fits running on the download pool (``run``, under the request's shares)
and bounded together by ``fit_timeout_s``, then decodes once each image it left as it is
(``check_all``: the upstream refuses an image whose data can't be decoded);
``write_sources`` then sets the base64 source of each downloaded or refitted image. Failures are
``InvalidRequestError`` naming the part (``… : the image could not be decoded``).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from ezat_compat.cooperative import tools
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.media import decode_base64
from ezat_compat.translate.request import ImageSlot
from ezat_compat.upstream.image_limits import Refused, plain_number
from ezat_compat.upstream.image_shares import Lanes
from ezat_compat.upstream.imagefit import (
    NO_ROOM,
    FitTarget,
    ImageFitError,
    Probe,
    UpstreamImageLimits,
    b64_length,
    check_pixels,
    fit,
    plan,
    probe,
)

logger = logging.getLogger("ezat_compat.upstream.images")  # the image step logs under one name

FIT_TIMEOUT_S = 30.0  # wall clock for fitting a request's images, once downloaded
_FIT_PASSES = 3  # plan-and-fit rounds (a second is rare, a third rarer)
FIT_UNEXPECTED = "the image could not be processed (unexpected error)"


def _could_not_fit_in_time(timeout_s: float) -> str:
    return f"the image could not be resized within {plain_number(timeout_s)} s"


@dataclass(frozen=True, slots=True)
class Image:
    """One image of the request: its bytes, header, base64 length, whether its block's source
    must be (re)written (downloaded or refitted) rather than left as the client sent it, and
    whether its pixels were decoded (a fitted image: Pillow wrote it from decoded pixels)."""

    raw: bytes
    probe: Probe
    b64: int
    fresh: bool
    decoded: bool = False


# Runs fitting jobs on the pool until a deadline (``time.monotonic``); the caller reads the lanes.
RunOnPool = Callable[[Sequence[Callable[[], Image]], float], Lanes[Image]]


def invalid_part(slot: ImageSlot, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"{slot.path}: {reason}", param=slot.path)


def data_image(slot: ImageSlot) -> Image:
    """A data URL's image, from the bytes the translator decoded (or its source's text)."""
    data: str = slot.block["source"]["data"]
    raw = slot.raw if slot.raw is not None else decode_base64(data)
    if raw is None:  # the translator checked it; a slot built elsewhere might not be
        raise invalid_part(slot, "the data is not valid base64")
    try:
        header = probe(raw)
    except ImageFitError as exc:
        raise invalid_part(slot, exc.reason) from None
    return Image(raw=raw, probe=header, b64=len(data), fresh=False)


def as_probed(data: bytes, media_type: str) -> Image:
    """Runs on the pool, after a download: Pillow reads the header (``media_type`` is the sniffed one)."""
    try:
        header = probe(data)
    except ImageFitError as exc:
        raise Refused(exc.reason) from None
    return Image(raw=data, probe=header, b64=b64_length(len(data)), fresh=True)


def _fitted(image: Image, target: FitTarget) -> Image:
    """Runs on the pool: the image scaled and re-encoded to fit ``target``."""
    media_type, raw = fit(image.raw, image.probe, target)
    header = probe(raw)
    if header.media_type != media_type:  # unreachable: what Pillow wrote, Pillow reads
        raise ImageFitError(FIT_UNEXPECTED)
    return Image(raw=raw, probe=header, b64=b64_length(len(raw)), fresh=True, decoded=True)


def fit_all(
    slots: Sequence[ImageSlot],
    images: list[Image],
    limits: UpstreamImageLimits,
    *,
    other_bytes: int,
    run: RunOnPool,
    timeout_s: float,
) -> None:
    """Plan and fit until every image is within its target (a second pass is rare), then decode
    once each image left as it is (``check_all``); ``images`` (one per slot) is updated in
    place. Each pass's fits run through ``run`` within ``timeout_s``."""
    for _pass in range(_FIT_PASSES + 1):
        try:
            targets = plan([(image.probe, image.b64) for image in images], limits, other_bytes=other_bytes)
        except ImageFitError as exc:
            raise invalid_part(slots[0], exc.reason) from None
        work = [(index, target) for index, target in enumerate(targets) if target is not None]
        if not work:
            check_all(slots, images)
            return
        if _pass == _FIT_PASSES:
            raise invalid_part(slots[work[0][0]], NO_ROOM)
        _run_fits(slots, images, work, run, timeout_s)


def check_all(slots: Sequence[ImageSlot], images: list[Image]) -> None:
    """Decode the pixels of each image not decoded yet (``check_pixels``), in slot order: the
    upstream refuses an image whose data doesn't decode, so the first one is a 400 naming its
    part (``… : the image could not be decoded``). A fitted image was decoded by its fit and is
    not decoded again; an image that fits costs this one decode, on one of the hub's real
    threads under gevent (``cooperative.off_loop``: the pool's "threads" are greenlets of the
    loop's own thread there)."""
    off_loop = tools().off_loop  # the decode on a real thread: the loop goes on meanwhile
    for index, image in enumerate(images):
        if not image.decoded:
            try:
                off_loop(partial(check_pixels, image.raw))
            except ImageFitError as exc:
                raise invalid_part(slots[index], exc.reason) from None
            images[index] = replace(image, decoded=True)


def _run_fits(
    slots: Sequence[ImageSlot],
    images: list[Image],
    work: list[tuple[int, FitTarget]],
    run: RunOnPool,
    timeout_s: float,
) -> None:
    off_loop = tools().off_loop  # Pillow's decode and resampling: on a real thread, the loop goes on
    jobs = [partial(off_loop, partial(_fitted, images[index], target)) for index, target in work]
    lanes = run(jobs, time.monotonic() + timeout_s)
    for position, (index, _target) in enumerate(work):
        err = lanes.errors.get(position)
        if isinstance(err, ImageFitError):
            raise invalid_part(slots[index], err.reason)
        if err is not None:
            logger.warning("unexpected error while fitting an image", exc_info=err)
            raise invalid_part(slots[index], FIT_UNEXPECTED)
    if lanes.abandoned:
        raise invalid_part(slots[work[lanes.unfinished()][0]], FIT_UNEXPECTED)
    for position, (index, _target) in enumerate(work):
        result = lanes.results[position]
        if result is None:
            raise invalid_part(slots[index], _could_not_fit_in_time(timeout_s))
        images[index] = result


def write_sources(slots: Sequence[ImageSlot], images: Sequence[Image]) -> None:
    """Set ``slot.block["source"]`` of each downloaded or refitted image to its base64 source;
    a data URL that already fitted keeps its text as sent."""
    for slot, image in zip(slots, images, strict=True):
        if image.fresh:
            data = base64.b64encode(image.raw).decode("ascii")
            slot.block["source"] = {"type": "base64", "media_type": image.probe.media_type, "data": data}
