"""The bounds of a request's image work: no image can take a worker or starve another organisation.

- A PNG's compressed text chunks are never inflated: Pillow inflated each ``zTXt`` as it read the
  header (~60 MB for a 60 KB image), on the event loop for data URLs; ``readable`` drops them
  before Pillow reads the file, and Pillow's own text limits are lowered as well.
- A request carries at most the model's images and documents (Anthropic's vision guide: 100 per
  request, 600 for models with a context window past 200k tokens), refused in the API's words.
- Every header read, decode and fit runs on a decoding place of the request's organisation:
  one organisation holds at most all but one of them, so another's image never waits behind it;
  a request that gets no place within ``fit_timeout_s`` is a 400 naming its first image.
- After a large decode the allocator's free pages go back to the system.
"""

from __future__ import annotations

import base64
import io
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PIL import Image, PngImagePlugin

from ezat_compat.domain import Model, Price
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.request import ImageSlot
from ezat_compat.upstream import image_fitting, images
from ezat_compat.upstream.image_shares import GRANTED
from ezat_compat.upstream.imagefit import (
    INFLATED_CHUNK_BYTES,
    MAX_PNG_CHUNKS,
    TOO_MANY_CHUNKS,
    FitTarget,
    ImageFitError,
    Probe,
    UpstreamImageLimits,
    check_pixels,
    fit,
    probe,
    readable,
)
from ezat_compat.upstream.images import ImageFetcher

LIMITS = UpstreamImageLimits()
PATH = "messages[0].content[{}].image_url.url"


# ---------------------------------------------------------------- images made here


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def chunk_types(raw: bytes) -> list[bytes]:
    """The chunk types of a PNG, in order."""
    pos, found = 8, []
    while pos + 12 <= len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        found.append(raw[pos + 4 : pos + 8])
        pos += 12 + length
    return found


def small_png(size: tuple[int, int] = (4, 3), mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, 120).save(out, "PNG")
    return out.getvalue()


def with_chunks(png: bytes, extra: list[bytes], *, after_idat: list[bytes] | None = None) -> bytes:
    """``png`` with ``extra`` chunks after its IHDR (and ``after_idat`` before its IEND)."""
    ihdr_end = 8 + 12 + 13
    iend = png.rindex(b"IEND") - 4
    return png[:ihdr_end] + b"".join(extra) + png[ihdr_end:iend] + b"".join(after_idat or []) + png[iend:]


BOMB_TEXT = zlib.compress(b"A" * 1_047_576, 9)  # ~1 KB that inflates to ~1 MB


def ztxt(i: int) -> bytes:
    return chunk(b"zTXt", b"k%d\x00\x00" % i + BOMB_TEXT)


def ztxt_png(chunks: int = 60) -> bytes:
    """An attacker's image: a 1 x 1 PNG followed by ``chunks`` zTXt chunks of ~1 MB inflated each."""
    return with_chunks(small_png((1, 1), "L"), [ztxt(i) for i in range(chunks)])


def data_slot(raw: bytes, part: int = 0) -> ImageSlot:
    media_type = "image/png" if raw.startswith(b"\x89PNG") else "image/jpeg"
    data = base64.b64encode(raw).decode()
    return ImageSlot(
        path=PATH.format(part),
        block={"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}},
        raw=raw,
    )


@pytest.fixture
def make_fetcher() -> Iterator[Callable[..., ImageFetcher]]:
    made: list[ImageFetcher] = []

    def make(**kwargs: Any) -> ImageFetcher:
        kwargs.setdefault("threads", 4)
        fetcher = ImageFetcher(allow_private=False, **kwargs)
        made.append(fetcher)
        return fetcher

    yield make
    for fetcher in made:
        fetcher.close()


# ---------------------------------------------------------------- text chunks: never inflated


def test_a_png_of_60_ztxt_chunks_is_read_without_inflating_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow inflated every zTXt while reading the header (~0.2 s and 60 MB for this 63 KB
    image): none is inflated now."""
    inflated: list[int] = []
    real = PngImagePlugin._safe_zlib_decompress

    def counting(s: bytes) -> bytes:
        inflated.append(len(s))
        return real(s)

    monkeypatch.setattr(PngImagePlugin, "_safe_zlib_decompress", counting)
    raw = ztxt_png()
    assert probe(raw) == Probe(media_type="image/png", width=1, height=1)
    check_pixels(raw)
    assert inflated == []


def test_readable_drops_the_text_chunks_and_icc_profiles_and_keeps_the_rest() -> None:
    """A header read or a check inflates no profile; a fit keeps the first (it writes it out)."""
    icc = chunk(b"iCCP", b"p\x00\x00" + zlib.compress(b"profile"))
    text = [chunk(b"tEXt", b"Comment\x00hi"), ztxt(1), chunk(b"iTXt", b"k\x00\x00\x00\x00\x00v")]
    raw = with_chunks(small_png(), [icc, *text, icc], after_idat=[ztxt(2)])
    assert chunk_types(readable(raw)) == [b"IHDR", b"IDAT", b"IEND"]
    kept = readable(raw, icc=True)
    assert chunk_types(kept) == [b"IHDR", b"iCCP", b"IDAT", b"IEND"]
    with Image.open(io.BytesIO(kept)) as image:
        image.load()
        assert image.size == (4, 3) and image.info["icc_profile"] == b"profile"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(small_png(), id="a-png-without-text"),
        pytest.param(b"\xff\xd8\xff\xe0" + bytes(64), id="not-a-png"),
    ],
)
def test_readable_leaves_other_files_as_they_are(raw: bytes) -> None:
    assert readable(raw) is raw


def test_a_text_chunk_cut_short_is_left_for_pillow_to_refuse() -> None:
    png = small_png()
    cut = png[: png.rindex(b"IEND") - 4] + ztxt(1)[:100]
    assert readable(cut) is cut
    with pytest.raises(ImageFitError, match="could not be decoded"):
        check_pixels(cut)


def test_a_png_of_too_many_chunks_is_refused_before_pillow_walks_them() -> None:
    empty = chunk(b"teSt", b"")
    raw = with_chunks(small_png(), [empty] * MAX_PNG_CHUNKS)
    started = time.perf_counter()
    with pytest.raises(ImageFitError) as caught:
        probe(raw)
    assert caught.value.reason == TOO_MANY_CHUNKS == f"the PNG has more than {MAX_PNG_CHUNKS} chunks"
    assert time.perf_counter() - started < 0.5  # Pillow itself takes ~4 µs a chunk
    probe(with_chunks(small_png(), [empty] * (MAX_PNG_CHUNKS - 10)))  # within the limit: read


def test_pillows_text_limits_are_lowered() -> None:
    """If a text chunk ever reached Pillow, one image could inflate at most 1 MB of it (64 MB by default)."""
    assert PngImagePlugin.MAX_TEXT_CHUNK == PngImagePlugin.MAX_TEXT_MEMORY == INFLATED_CHUNK_BYTES == 1024 * 1024


# ---------------------------------------------------------------- images and documents per request


def model(context_window: int) -> Model:
    return Model(id="m", aliases=(), price=Price(*(1,) * 4), deployments=(), context_window=context_window)  # type: ignore[arg-type]


@pytest.mark.parametrize(("context_window", "most"), [(200_000, 100), (1_000_000, 600)])
def test_the_media_limit_is_the_models(context_window: int, most: int) -> None:
    assert UpstreamImageLimits.of(model(context_window)).max_media == most


@pytest.mark.parametrize(
    ("images_", "documents", "message"),
    [
        (101, 0, "too many images and documents: 101 + 0 > 100"),
        (99, 2, "too many images and documents: 99 + 2 > 100"),
    ],
)
def test_more_media_than_the_model_takes_is_refused_before_any_work(
    make_fetcher: Callable[..., ImageFetcher], images_: int, documents: int, message: str
) -> None:
    """The bytes are not an image and the URLs lead nowhere: any work would fail otherwise."""
    fetcher = make_fetcher()
    slots = [data_slot(b"\x89PNG\r\n\x1a\n" + bytes(8), i) for i in range(images_)]
    slots += [
        ImageSlot(path=f"messages[1].content[{i}].file", block={}, url="http://0.0.0.0/a.pdf", pdf=True)
        for i in range(documents)
    ]
    with pytest.raises(InvalidRequestError) as caught:
        fetcher.prepare(slots, LIMITS)
    assert caught.value.status == 400 and str(caught.value) == message and caught.value.param is None
    assert fetcher._executor is None


def test_as_many_images_as_the_model_takes_are_served(make_fetcher: Callable[..., ImageFetcher]) -> None:
    fetcher = make_fetcher()
    fetcher.prepare([data_slot(small_png(), i) for i in range(100)], LIMITS)


# ---------------------------------------------------------------- decoding places, fair by organisation


def test_a_request_waits_for_its_organisations_place_until_its_deadline_and_another_does_not(
    make_fetcher: Callable[..., ImageFetcher],
) -> None:
    """Two places, one per organisation: with org ``a``'s place held, ``a``'s image waits until
    ``fit_timeout_s`` (a 400 naming it), while ``b``'s is read at once."""
    fetcher = make_fetcher(decode_threads=2, fit_timeout_s=0.3)
    shares = fetcher._decode_shares_for_this_process()
    assert shares.acquire("a", 0, time.monotonic() + 1, lambda: False) == GRANTED
    started = time.monotonic()
    with pytest.raises(InvalidRequestError) as caught:
        fetcher.prepare([data_slot(small_png(), 3)], LIMITS, org="a")
    assert 0.25 < time.monotonic() - started < 2
    assert str(caught.value) == (
        f"{PATH.format(3)}: the image could not be processed within 0.3 s waiting for this organization's other images"
    )
    started = time.monotonic()
    fetcher.prepare([data_slot(small_png())], LIMITS, org="b")
    assert time.monotonic() - started < 0.25
    shares.release("a")
    fetcher.prepare([data_slot(small_png())], LIMITS, org="a")


def test_every_place_taken_is_a_wait_for_a_free_slot(make_fetcher: Callable[..., ImageFetcher]) -> None:
    fetcher = make_fetcher(decode_threads=2, org_decode_threads=2, fit_timeout_s=0.2)
    shares = fetcher._decode_shares_for_this_process()
    for _ in range(2):
        assert shares.acquire("a", 0, time.monotonic() + 1, lambda: False) == GRANTED
    with pytest.raises(InvalidRequestError, match=r"waiting for a free image processing slot$"):
        fetcher.prepare([data_slot(small_png())], LIMITS, org="b")


class Concurrency:
    """Wraps a function: how many calls ran at once, at most, per organisation tag."""

    def __init__(self, real: Callable[..., Any], seconds: float) -> None:
        self.real, self.seconds = real, seconds
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def __call__(self, *args: Any) -> Any:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(self.seconds)
            return self.real(*args)
        finally:
            with self.lock:
                self.now -= 1


def wide_png(width: int = 9000) -> bytes:
    out = io.BytesIO()
    Image.new("L", (width, 4), 90).save(out, "PNG")  # over 8000 px: fitted
    return out.getvalue()


def test_one_organisations_fits_take_its_share_of_the_places_only(
    make_fetcher: Callable[..., ImageFetcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three places, two per organisation: four requests of ``a`` with two images to fit each
    run at most two fits at once, and a request of ``b`` meanwhile is served on the third."""
    fits = Concurrency(image_fitting.fit, 0.3)
    monkeypatch.setattr(image_fitting, "fit", fits)
    fetcher = make_fetcher(decode_threads=3)
    errors: list[BaseException] = []

    def attack() -> None:
        try:
            fetcher.prepare([data_slot(wide_png(), 0), data_slot(wide_png(), 1)], LIMITS, org="a")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=attack) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    started = time.monotonic()
    fetcher.prepare([data_slot(small_png())], LIMITS, org="b")
    served_b = time.monotonic() - started
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert fits.peak == 2
    assert served_b < 0.2, served_b  # not behind a's fits (0.3 s each here)


def test_the_headers_and_decodes_of_a_request_are_one_hand_off_each(
    make_fetcher: Callable[..., ImageFetcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty small images: their headers in one piece of work on a place, their decodes in
    another (two waits for a hub thread under gevent, not a hundred)."""
    fetcher = make_fetcher()
    calls: list[str] = []
    real = fetcher._decode_one

    def counted(org: str, deadline: float, work: Callable[[], Any]) -> Any:
        calls.append(org)
        return real(org, deadline, work)

    monkeypatch.setattr(fetcher, "_decode_one", counted)
    fetcher.prepare([data_slot(small_png(), i) for i in range(50)], LIMITS, org="a")
    assert calls == ["a", "a"]
    assert fetcher._decode_shares_for_this_process().held_by("a") == 0


def test_a_batch_stops_at_the_deadline(
    make_fetcher: Callable[..., ImageFetcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image_fitting, "check_pixels", Concurrency(check_pixels, 0.1))
    fetcher = make_fetcher(fit_timeout_s=0.25)
    slots = [data_slot(small_png(), i) for i in range(20)]
    started = time.monotonic()
    with pytest.raises(InvalidRequestError) as caught:
        fetcher.prepare(slots, LIMITS)
    assert time.monotonic() - started < 0.6
    assert str(caught.value).endswith(": the image could not be processed within 0.25 s")
    assert caught.value.param in {slot.path for slot in slots[1:5]}


def test_a_failed_fit_is_a_400_naming_its_part_and_frees_the_places(make_fetcher: Callable[..., ImageFetcher]) -> None:
    fetcher = make_fetcher()
    noisy = io.BytesIO()
    Image.frombytes("L", (9000, 300), bytes(range(256)) * (9000 * 300 // 256) + bytes(9000 * 300 % 256)).save(
        noisy, "PNG"
    )
    cut = noisy.getvalue()[: len(noisy.getvalue()) * 2 // 3]  # its header reads, its pixels don't
    with pytest.raises(InvalidRequestError) as caught:
        fetcher.prepare([data_slot(wide_png(), 0), data_slot(cut, 1)], LIMITS, org="a")
    assert str(caught.value) == f"{PATH.format(1)}: the image could not be decoded"
    assert fetcher._decode_shares_for_this_process().held_by("a") == 0


# ---------------------------------------------------------------- memory


def test_memory_goes_back_after_a_large_decode_only(
    make_fetcher: Callable[..., ImageFetcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    given_back: list[int] = []
    monkeypatch.setattr(images.memory, "after_request_of", given_back.append)
    fetcher = make_fetcher()
    fetcher.prepare([data_slot(small_png((640, 480)))], LIMITS)
    assert given_back == []
    big = small_png((5000, 4000), "L")  # 20 megapixels: ~80 MB decoded
    fetcher.prepare([data_slot(big)], LIMITS)
    assert given_back == [4 * 5000 * 4000]
    with pytest.raises(InvalidRequestError):  # a failed request gives it back too
        fetcher.prepare([data_slot(big), data_slot(big[: len(big) // 2], 1)], LIMITS)
    assert given_back == [4 * 5000 * 4000, 8 * 5000 * 4000]


def test_a_16_bit_grey_image_is_fitted_to_8_bits_scaled() -> None:
    """Made 8-bit from its high bytes (one copy, not two 32-bit images): 0x8000 -> 128."""
    grey = Image.frombytes("I;16", (9000, 2), b"\x00\x80" * 18000)
    out = io.BytesIO()
    grey.save(out, "PNG")
    media_type, raw = fit(out.getvalue(), probe(out.getvalue()), FitTarget(max_side=8000, max_b64=5 * 1024 * 1024))
    with Image.open(io.BytesIO(raw)) as fitted:
        assert (media_type, fitted.mode, fitted.size) == ("image/png", "L", (8000, 2))
        assert fitted.getextrema() == (128, 128)
