"""A request's images fitted to the upstream: read with Pillow, planned, refitted off the event loop.

``imagefit`` holds the pure algorithm (``probe``, ``plan``, ``fit``: 5 MB of base64, 8000 px,
2000 px past 20 images, 32 MB of body); this module runs it over one request's images. Every
Pillow call runs off the event loop on a decoding place of the request's organisation
(``Decoding``: the fetcher's fair shares of a few places per process, so one organisation's
large images can't fill them, nor hold a stream's keep-alive): ``probe_all`` reads every
image's header (data URLs too) in one piece of work, ``fit_all`` plans (the request's pixel
budget, from the headers, before any pixel is decoded) and fits until each is within its target,
the fits side by side on the organisation's places, then decodes once each image it left as it
is (``check_all``: the upstream refuses an image whose data can't be decoded). All of it is
bounded by one deadline, ``fit_timeout_s`` from the first header read. ``write_sources`` then
sets the base64 source of each downloaded or refitted image. Failures are
``InvalidRequestError`` naming the part (``… : the image could not be decoded``).

Work handed to another thread returns its failure as a value (``Failed``) rather than raising
it: an exception's traceback would keep the frames of the decode, and so its pixels (hundreds of
MB), alive for as long as anything held the exception.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NoReturn, TypeVar

from ezat_compat.cooperative import tools
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.media import decode_base64
from ezat_compat.translate.request import ImageSlot
from ezat_compat.upstream.image_limits import plain_number
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

T = TypeVar("T")

FIT_TIMEOUT_S = 30.0  # wall clock for reading and fitting a request's images, once downloaded
_FIT_PASSES = 3  # plan-and-fit rounds (a second is rare, a third rarer)
FIT_UNEXPECTED = "the image could not be processed (unexpected error)"
ORG_IMAGES = "this organization's other images"  # why a request waited: its organisation's places were taken
FREE_PLACE = "a free image processing slot"  # every place was taken


def _could_not_fit_in_time(timeout_s: float) -> str:
    return f"the image could not be resized within {plain_number(timeout_s)} s"


def could_not_process_in_time(timeout_s: float, waiting_for: str = "") -> str:
    """The refusal of an image whose turn didn't come (``waiting_for`` says what held it) or
    whose header or pixels weren't read within the request's ``timeout_s``."""
    waited = f" waiting for {waiting_for}" if waiting_for else ""
    return f"the image could not be processed within {plain_number(timeout_s)} s{waited}"


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


@dataclass(frozen=True, slots=True)
class Failed:
    """Work number ``index`` failed: ``reason`` for the client, ``note`` (an unexpected error's
    type and text) for the log."""

    index: int
    reason: str
    note: str = ""


class FitFailed(Exception):
    """A fit failed (``failed``): raised on the caller's side of the hand-off, so that the
    request's other fits stop, without the frames of the decode."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.reason)
        self.failed = failed


class Waited(Exception):
    """No decoding place came before the deadline; ``why`` says what held them
    (``ORG_IMAGES`` or ``FREE_PLACE``)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


# Runs fitting jobs on the organisation's places until a deadline (``time.monotonic``); the
# caller reads the lanes (``denied``: why a lane got no place, if one didn't).
RunOnPool = Callable[[Sequence[Callable[[], Image]], float], Lanes[Image]]


def _in_place(work: Callable[[], T]) -> T:
    return tools().off_loop(work)


def _no_lanes(jobs: Sequence[Callable[[], Image]], deadline: float) -> Lanes[Image]:
    raise AssertionError("no fitting jobs expected")  # pragma: no cover - a caller's mistake


@dataclass(frozen=True, slots=True)
class Decoding:
    """Where one request's Pillow work runs, until ``deadline`` (``time.monotonic``).

    ``one(work)`` runs ``work`` off the event loop (``cooperative.off_loop``) holding one of
    the organisation's decoding places, and returns what it returns; it raises ``Waited``
    when no place came by the deadline. ``lanes`` runs fitting jobs side by side, each lane on
    a place of its own. ``timeout_s`` is what the deadline was set from (for the refusals)."""

    one: Callable[[Callable[[], Any]], Any] = _in_place
    lanes: RunOnPool = _no_lanes
    deadline: float = float("inf")
    timeout_s: float = FIT_TIMEOUT_S


def invalid_part(slot: ImageSlot, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"{slot.path}: {reason}", param=slot.path)


def data_raw(slot: ImageSlot) -> bytes:
    """A data URL's bytes, as the translator decoded them (or from its source's text)."""
    data: str = slot.block["source"]["data"]
    raw = slot.raw if slot.raw is not None else decode_base64(data)
    if raw is None:  # the translator checked it; a slot built elsewhere might not be
        raise invalid_part(slot, "the data is not valid base64")
    return raw


# ---------------------------------------------------------------- work off the loop


def _each(work: Callable[[int], T], count: int, deadline: float, late: str) -> list[T] | Failed:
    """Runs off the loop: ``work(i)`` for each ``i`` in order, until the first failure or the
    deadline (checked before each; one image's work is bounded by its pixel budget)."""
    done: list[T] = []
    for index in range(count):
        if time.monotonic() > deadline:
            return Failed(index, late)
        outcome = _attempt(partial(work, index))
        if isinstance(outcome, Failed):
            return replace(outcome, index=index)
        done.append(outcome)
    return done


def _attempt(work: Callable[[], T]) -> T | Failed:
    """``work()``, or its failure as a value: ``ImageFitError``'s reason, or any other error as
    ``FIT_UNEXPECTED`` with its type and text (no traceback: see the module docstring)."""
    reason = note = ""
    try:
        return work()
    except ImageFitError as exc:
        reason = exc.reason
    except Exception as exc:  # a bug or Pillow's own: the client is told "unexpected error"
        reason, note = FIT_UNEXPECTED, f"{type(exc).__name__}: {exc}"
    return Failed(0, reason, note)


def _one(decoding: Decoding, work: Callable[[], T], slot: ImageSlot) -> T:
    """``work`` through ``decoding.one``; a wait past the deadline is a 400 naming ``slot``."""
    try:
        return decoding.one(work)
    except Waited as exc:
        why = exc.why
    raise invalid_part(slot, could_not_process_in_time(decoding.timeout_s, why))


def _raise_for(slots: Sequence[ImageSlot], failed: Failed) -> NoReturn:
    if failed.note:
        logger.warning("unexpected error while processing an image: %s", failed.note)
    raise invalid_part(slots[failed.index], failed.reason)


# ---------------------------------------------------------------- the steps


def probe_all(
    slots: Sequence[ImageSlot], sources: Sequence[tuple[bytes, int, bool]], decoding: Decoding
) -> list[Image]:
    """Every image's header, read in one piece of work off the loop: ``sources`` holds each
    slot's (bytes, base64 length, fresh). The first that can't be read is a 400 naming it."""
    if not slots:
        return []

    def read(index: int) -> Image:
        raw, b64, fresh = sources[index]
        return Image(raw=raw, probe=probe(raw), b64=b64, fresh=fresh)

    late = could_not_process_in_time(decoding.timeout_s)
    outcome = _one(decoding, partial(_each, read, len(sources), decoding.deadline, late), slots[0])
    if isinstance(outcome, Failed):
        _raise_for(slots, outcome)
    return outcome


def fit_all(
    slots: Sequence[ImageSlot],
    images: list[Image],
    limits: UpstreamImageLimits,
    *,
    other_bytes: int,
    decoding: Decoding,
) -> None:
    """Plan and fit until every image is within its target (a second pass is rare), then decode
    once each image left as it is (``check_all``); ``images`` (one per slot) is updated in
    place. ``plan`` refuses a request over its pixel budget before any pixel is decoded."""
    for _pass in range(_FIT_PASSES + 1):
        try:
            targets = plan([(image.probe, image.b64) for image in images], limits, other_bytes=other_bytes)
        except ImageFitError as exc:
            raise invalid_part(slots[0], exc.reason) from None
        work = [(index, target) for index, target in enumerate(targets) if target is not None]
        if not work:
            check_all(slots, images, decoding)
            return
        if _pass == _FIT_PASSES:
            raise invalid_part(slots[work[0][0]], NO_ROOM)
        _run_fits(slots, images, work, decoding)


def check_all(slots: Sequence[ImageSlot], images: list[Image], decoding: Decoding = Decoding()) -> None:
    """Decode the pixels of each image not decoded yet (``check_pixels``), in slot order, in one
    piece of work off the loop (``cooperative.off_loop``: on one of the hub's real threads under
    gevent, whose pool's "threads" are greenlets of the loop's own thread): the upstream refuses
    an image whose data doesn't decode, so the first one is a 400 naming its part (``… : the
    image could not be decoded``). A fitted image was decoded by its fit and is not decoded
    again; an image that fits costs this one decode."""
    todo = [index for index, image in enumerate(images) if not image.decoded]
    if not todo:
        return

    def decode(position: int) -> None:
        check_pixels(images[todo[position]].raw)

    late = could_not_process_in_time(decoding.timeout_s)
    outcome = _one(decoding, partial(_each, decode, len(todo), decoding.deadline, late), slots[todo[0]])
    if isinstance(outcome, Failed):
        _raise_for(slots, replace(outcome, index=todo[outcome.index]))
    for index in todo:
        images[index] = replace(images[index], decoded=True)


def _fitted(image: Image, target: FitTarget) -> Image:
    """Runs off the loop: the image scaled and re-encoded to fit ``target``."""
    media_type, raw = fit(image.raw, image.probe, target)
    header = probe(raw)
    if header.media_type != media_type:  # unreachable: what Pillow wrote, Pillow reads
        raise ImageFitError(FIT_UNEXPECTED)
    return Image(raw=raw, probe=header, b64=b64_length(len(raw)), fresh=True, decoded=True)


def _fit_job(image: Image, target: FitTarget) -> Image:
    """One lane's job: the fit off the loop (Pillow's decode and resampling release the GIL);
    ``FitFailed`` when it fails."""
    outcome = tools().off_loop(partial(_attempt, partial(_fitted, image, target)))
    if isinstance(outcome, Failed):
        raise FitFailed(outcome)
    return outcome


def _run_fits(
    slots: Sequence[ImageSlot],
    images: list[Image],
    work: list[tuple[int, FitTarget]],
    decoding: Decoding,
) -> None:
    jobs = [partial(_fit_job, images[index], target) for index, target in work]
    lanes = decoding.lanes(jobs, decoding.deadline)
    for position, (index, _target) in enumerate(work):
        err = lanes.errors.get(position)
        if isinstance(err, FitFailed):
            _raise_for(slots, replace(err.failed, index=index))
        if err is not None:
            logger.warning("unexpected error while fitting an image: %s: %s", type(err).__name__, err)
            raise invalid_part(slots[index], FIT_UNEXPECTED)
    if lanes.abandoned:
        raise invalid_part(slots[work[lanes.unfinished()][0]], FIT_UNEXPECTED)
    for position, (index, _target) in enumerate(work):
        result = lanes.results[position]
        if result is None:
            waited = not lanes.started(position) and lanes.denied
            reason = (
                could_not_process_in_time(decoding.timeout_s, lanes.denied)
                if waited
                else _could_not_fit_in_time(decoding.timeout_s)
            )
            raise invalid_part(slots[index], reason)
        images[index] = result


def write_sources(slots: Sequence[ImageSlot], images: Sequence[Image]) -> None:
    """Set ``slot.block["source"]`` of each downloaded or refitted image to its base64 source;
    a data URL that already fitted keeps its text as sent."""
    for slot, image in zip(slots, images, strict=True):
        if image.fresh:
            data = base64.b64encode(image.raw).decode("ascii")
            slot.block["source"] = {"type": "base64", "media_type": image.probe.media_type, "data": data}
