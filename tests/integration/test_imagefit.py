"""Images fitted to the upstream's limits (Chat Completions reference, "Images and PDFs").

The rules are Anthropic's, as its API words its refusals: ``image exceeds 5 MB maximum:
6291456 bytes > 5242880 bytes`` (the length of the base64 text), ``At least one of the image
dimensions exceed max allowed size: 8000 pixels``, ``… for many-image requests: 2000 pixels``
(more than 20 images), and a body over 32 MB answered with 413. Every image the spec accepts
must leave the gateway within them; one that fits already leaves as it came, byte for byte.
Test images are noise made with Pillow here, so that PNG can't compress them away.
"""

from __future__ import annotations

import base64
import io
import random
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from ezat_compat.domain import Model, Price
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.media import sniff_image_type
from ezat_compat.translate.request import ImageSlot, openai_to_anthropic
from ezat_compat.upstream.imagefit import (
    MAX_IMAGE_PIXELS,
    MAX_REQUEST_PIXELS,
    TOO_MANY_PIXELS_IN_ALL,
    FitTarget,
    ImageFitError,
    Probe,
    UpstreamImageLimits,
    b64_length,
    check_pixels,
    plan,
    probe,
)
from ezat_compat.upstream.images import ImageFetcher
from ezat_compat.wire.openai import load_chat_request

MIB = 1024 * 1024
LIMITS = UpstreamImageLimits()  # Anthropic's: 5 MB of base64, 8000 px, 2000 px past 20 images, 32 MB
FORMATS = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP"}


# ---------------------------------------------------------------- images made here


def noise(width: int, height: int, kind: str = "png", *, mode: str = "RGB", **options: Any) -> bytes:
    """A ``width`` x ``height`` image of seeded noise, encoded as ``kind``."""
    rng = random.Random(width * 7919 + height)
    if kind == "gif":  # already a palette: Pillow's own quantising of noise takes seconds
        image = Image.frombytes("P", (width, height), rng.randbytes(width * height))
        image.putpalette(rng.randbytes(768))
    else:
        image = Image.frombytes(mode, (width, height), rng.randbytes(width * height * len(mode)))
    out = io.BytesIO()
    if kind == "png":
        options.setdefault("compress_level", 1)
    image.save(out, FORMATS[kind], **options)
    return out.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (valid CRCs) and whose pixels are one empty IDAT."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_slot(raw: bytes, path: str = "messages[0].content[0].image_url.url") -> ImageSlot:
    """A data URL's slot as the translator makes it: the block holds the base64, ``raw`` the bytes."""
    media_type = sniff_image_type(raw)
    assert media_type is not None
    block = {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(raw)}}
    return ImageSlot(path=path, block=block, raw=raw)


def sent(slot: ImageSlot) -> tuple[str, bytes, Image.Image]:
    """(media type, bytes, opened image) of what the slot's block now sends upstream."""
    source = slot.block["source"]
    raw = base64.b64decode(source["data"])
    return source["media_type"], raw, Image.open(io.BytesIO(raw))


def assert_passes_every_rule(slots: list[ImageSlot], limits: UpstreamImageLimits = LIMITS) -> None:
    """What the upstream would check: base64 length, sides, the many-images rule, the body."""
    max_side = limits.many_images_max_px if len(slots) > limits.many_images else limits.max_image_px
    total = 0
    for slot in slots:
        data = slot.block["source"]["data"]
        assert len(data) <= limits.max_image_bytes, f"{slot.path}: {len(data)} bytes of base64"
        media_type, _, image = sent(slot)
        assert max(image.size) <= max_side, f"{slot.path}: {image.size}"
        assert media_type == Image.MIME[image.format or ""]
        image.load()  # the bytes decode completely
        total += len(data)
    assert total <= limits.max_request_bytes - MIB


def assert_aspect_kept(before: tuple[int, int], after: tuple[int, int]) -> None:
    """The same shape: the shorter side is the longer one's scale, to the nearest pixel."""
    (w0, h0), (w1, h1) = (
        before if before[0] >= before[1] else before[::-1],
        after if before[0] >= before[1] else after[::-1],
    )
    assert w1 < w0 and abs(h1 - h0 * w1 / w0) <= 0.5 + 1e-9, (before, after)


@pytest.fixture
def fetcher() -> Iterator[ImageFetcher]:
    images = ImageFetcher(threads=4, allow_private=False)
    yield images
    images.close()


# ---------------------------------------------------------------- each of Anthropic's limits, met


def test_a_6_mb_data_url_png_is_scaled_to_fit_5_mb_of_base64_and_stays_png(fetcher):
    raw = noise(1300, 1210)  # 4.5 MiB of PNG: 6 MiB of base64, the real API's example refusal
    assert len(b64(raw)) > 6 * MIB
    slot = data_slot(raw)
    fetcher.prepare([slot], LIMITS)
    media_type, _, image = sent(slot)
    assert media_type == "image/png" and image.format == "PNG"
    assert 4 * MIB < len(slot.block["source"]["data"]) <= 5 * MIB  # scaled to fit, not far below
    assert_aspect_kept((1300, 1210), image.size)
    assert_passes_every_rule([slot])


def test_a_9000_by_4_image_is_scaled_to_8000_px_keeping_its_shape(fetcher):
    slot = data_slot(noise(9000, 4))
    fetcher.prepare([slot], LIMITS)
    _, _, image = sent(slot)
    assert image.size == (8000, 4)  # 3.56 px rounds to 4
    assert_passes_every_rule([slot])


def test_21_images_of_2100_px_are_each_scaled_to_2000_px(fetcher):
    raws = [noise(2100, 60 + i) for i in range(21)]
    slots = [data_slot(raw, f"messages[0].content[{i}].image_url.url") for i, raw in enumerate(raws)]
    fetcher.prepare(slots, LIMITS)
    for raw, slot in zip(raws, slots, strict=True):
        _, _, image = sent(slot)
        assert image.size[0] == 2000
        assert_aspect_kept(Image.open(io.BytesIO(raw)).size, image.size)
    assert_passes_every_rule(slots)


def test_20_images_of_2100_px_are_within_the_rule_and_go_unchanged(fetcher):
    slots = [data_slot(noise(2100, 40), f"messages[0].content[{i}].image_url.url") for i in range(20)]
    before = [slot.block["source"]["data"] for slot in slots]
    fetcher.prepare(slots, LIMITS)
    assert [slot.block["source"]["data"] for slot in slots] == before


def test_three_9_9_mb_images_are_each_fitted_and_together_fit_the_body(fetcher):
    """Three 9.9 MB images are ~40 MB of base64: the upstream would answer 413."""
    raws = [noise(1860, 1860 + i) for i in range(3)]  # ~9.9 MiB of PNG each
    assert all(9.8 * MIB < len(raw) <= 10 * MIB for raw in raws)
    slots = [data_slot(raw, f"messages[0].content[{i}].image_url.url") for i, raw in enumerate(raws)]
    fetcher.prepare(slots, LIMITS)
    for raw, slot in zip(raws, slots, strict=True):
        assert sent(slot)[0] == "image/png"
        assert_aspect_kept(Image.open(io.BytesIO(raw)).size, sent(slot)[2].size)
    assert_passes_every_rule(slots)


@pytest.mark.parametrize("kind", ["png", "jpeg", "gif", "webp"])
def test_an_image_within_the_limits_goes_unchanged_byte_for_byte(fetcher, kind):
    raw = noise(640, 480, kind)
    slot = data_slot(raw)
    source = slot.block["source"]
    fetcher.prepare([slot], LIMITS)
    assert slot.block["source"] is source and source["data"] == b64(raw)


def test_images_that_fit_are_checked_without_the_pool(fetcher):
    """The small-image path reads headers and decodes once on the calling thread: no thread hand-off."""
    slots = [data_slot(noise(64, 64, kind)) for kind in FORMATS]
    fetcher.prepare(slots, LIMITS)
    assert fetcher._executor is None


def test_no_images_no_work(fetcher):
    fetcher.prepare([], LIMITS)
    assert fetcher._executor is None


# ---------------------------------------------------------------- formats and quality


@pytest.mark.parametrize("kind", ["png", "jpeg", "gif", "webp"])
def test_each_format_keeps_its_format_when_scaled_for_the_many_images_rule(fetcher, kind):
    slots = [data_slot(noise(2400, 30, kind), f"messages[0].content[{i}].image_url.url") for i in range(21)]
    fetcher.prepare(slots, LIMITS)
    for slot in slots:
        media_type, _, image = sent(slot)
        assert media_type == f"image/{kind}" and image.size == (2000, 25)
    assert_passes_every_rule(slots)


def test_a_large_jpeg_steps_its_quality_and_stays_jpeg(fetcher):
    raw = noise(2600, 2000, "jpeg", quality=95)
    assert len(b64(raw)) > 5 * MIB
    slot = data_slot(raw)
    fetcher.prepare([slot], LIMITS)
    media_type, _, image = sent(slot)
    assert media_type == "image/jpeg"
    assert image.size == (2600, 2000)  # a lower quality was enough: no pixels lost
    assert_passes_every_rule([slot])


def test_transparency_survives_a_png_rescale(fetcher):
    raw = noise(9000, 20, mode="RGBA")
    slot = data_slot(raw)
    fetcher.prepare([slot], LIMITS)
    _, _, image = sent(slot)
    assert image.mode == "RGBA" and image.size == (8000, 18)


def test_downscaling_keeps_the_aspect_ratio_of_a_wide_and_a_tall_image(fetcher):
    slots = [
        data_slot(noise(3001, 300), "messages[0].content[0].image_url.url"),
        data_slot(noise(250, 2999), "messages[0].content[1].image_url.url"),
    ]
    limits = UpstreamImageLimits(max_image_px=2000)
    fetcher.prepare(slots, limits)
    assert sent(slots[0])[2].size == (2000, 200)  # 199.93
    assert sent(slots[1])[2].size == (167, 2000)  # 166.72
    assert_passes_every_rule(slots, limits)


# ---------------------------------------------------------------- the whole body


def test_images_within_their_own_limit_shrink_to_fit_the_body_the_largest_first(fetcher):
    """Four images of 1.2 MB of base64 and one of 0.2 MB, in a 5 MB body with 1 MB for the rest:
    the small one keeps its bytes, the large ones share what is left."""
    limits = UpstreamImageLimits(max_request_bytes=5 * MIB)
    small = noise(200, 200)
    large = [noise(640, 470 + i) for i in range(4)]
    slots = [data_slot(raw, f"messages[0].content[{i}].image_url.url") for i, raw in enumerate([small, *large])]
    fetcher.prepare(slots, limits)
    assert slots[0].block["source"]["data"] == b64(small)
    assert all(len(slot.block["source"]["data"]) < len(b64(raw)) for slot, raw in zip(slots[1:], large, strict=True))
    assert_passes_every_rule(slots, limits)


def test_the_rest_of_the_body_is_kept_free_of_images(fetcher):
    limits = UpstreamImageLimits(max_request_bytes=4 * MIB)
    raw = noise(700, 700)  # 1.9 MiB of base64
    slot = data_slot(raw)
    fetcher.prepare([slot], limits, other_bytes=3 * MIB)
    assert len(slot.block["source"]["data"]) <= MIB - 128


P = Probe(media_type="image/png", width=100, height=100)


@pytest.mark.parametrize(
    ("sizes", "request_bytes", "expected"),
    [
        ([100_000, 200_000], 2 * MIB, [None, None]),
        ([6 * MIB], 32 * MIB, [5 * MIB]),
        ([MIB, 4 * MIB, 4 * MIB], 1 * MIB + 7 * MIB + 3 * 128, [None, 3 * MIB, 3 * MIB]),
        ([5 * MIB] * 8, 1 * MIB + 24 * MIB + 8 * 128, [3 * MIB] * 8),
    ],
    ids=["all-fit", "one-over-5-mb", "the-largest-share", "equal-shares"],
)
def test_plan_gives_each_image_its_byte_budget(sizes, request_bytes, expected):
    limits = UpstreamImageLimits(max_request_bytes=request_bytes)
    targets = plan([(P, size) for size in sizes], limits)
    assert [None if t is None else t.max_b64 for t in targets] == expected


def test_plan_uses_the_many_images_side_past_20_images():
    big = Probe(media_type="image/png", width=2100, height=10)
    assert plan([(big, 1000)] * 20, LIMITS) == [None] * 20
    assert plan([(big, 1000)] * 21, LIMITS) == [FitTarget(max_side=2000, max_b64=5 * MIB)] * 21


def test_base64_length():
    assert [b64_length(n) for n in (0, 1, 2, 3, 4, 3 * MIB)] == [len(b64(bytes(n))) for n in (0, 1, 2, 3, 4, 3 * MIB)]


# ---------------------------------------------------------------- refusals: 400 naming the part


def refusal(fetcher: ImageFetcher, slot: ImageSlot) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        fetcher.prepare([data_slot(noise(8, 8), "messages[0].content[0].image_url.url"), slot], LIMITS)
    err = caught.value
    assert err.status == 400 and err.param == slot.path
    assert str(err).startswith(f"{slot.path}: ")
    return err


@pytest.mark.parametrize(
    "size",
    [(10_000, 10_000), (20_000, 20_000)],
    ids=["over-max-image-pixels", "over-twice-max-image-pixels"],
)
def test_a_decompression_bomb_is_refused_from_its_header(fetcher, size):
    """Pillow warns between MAX_IMAGE_PIXELS and twice that and raises above: both refuse."""
    bomb = data_slot(png_header_only(*size), "messages[0].content[1].image_url.url")
    err = refusal(fetcher, bomb)
    assert str(err) == f"{bomb.path}: the image has more than {Image.MAX_IMAGE_PIXELS} pixels (a decompression bomb?)"


def test_a_bomb_hidden_in_a_small_file_is_refused(fetcher):
    """A real 1-bit PNG of 9500 x 9500 black pixels: 11 KB that would decode to 90 MB."""
    raw = zlib.compress((b"\x00" + bytes(1188)) * 9500, 9)
    ihdr = struct.pack(">IIBBBBB", 9500, 9500, 1, 0, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")
    assert len(png) < MIB
    err = refusal(fetcher, data_slot(png, "messages[0].content[1].image_url.url"))
    assert "decompression bomb" in str(err)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x89PNG\r\n\x1a\n" + random.Random(1).randbytes(4000),
        b"\xff\xd8\xff" + random.Random(2).randbytes(4000),
        b"GIF89a" + random.Random(3).randbytes(4000),
        b"RIFF\x00\x10\x00\x00WEBP" + random.Random(4).randbytes(4000),
    ],
    ids=["png", "jpeg", "gif", "webp"],
)
def test_garbage_behind_an_image_signature_is_refused(fetcher, raw):
    slot = data_slot(raw, "messages[0].content[1].image_url.url")
    assert str(refusal(fetcher, slot)) == f"{slot.path}: the image could not be decoded"


def png_with_idat(width: int, height: int, idat: bytes) -> bytes:
    """A PNG whose header is valid and whose IDAT chunk holds ``idat`` (its CRC right)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _cut(raw: bytes) -> bytes:
    return raw[: len(raw) * 2 // 3]


# The header reads (so the probe passes), the pixels don't: found by the one decode of an image that fits.
UNDECODABLE_THAT_FIT = [
    pytest.param(png_with_idat(64, 64, random.Random(5).randbytes(2000)), id="png-random-idat"),
    pytest.param(png_with_idat(64, 64, zlib.compress(bytes(100))), id="png-idat-too-short"),
    pytest.param(png_header_only(64, 64), id="png-empty-idat"),
    pytest.param(_cut(noise(64, 64, "png")), id="png-truncated"),
    pytest.param(_cut(noise(64, 64, "jpeg")), id="jpeg-truncated"),
    pytest.param(_cut(noise(64, 64, "gif")), id="gif-truncated"),
]


@pytest.mark.parametrize("raw", UNDECODABLE_THAT_FIT)
def test_an_image_that_fits_but_does_not_decode_is_refused_naming_its_part(fetcher, raw):
    probe(raw)  # the header alone would have let it through
    slot = data_slot(raw, "messages[0].content[1].image_url.url")
    assert str(refusal(fetcher, slot)) == f"{slot.path}: the image could not be decoded"
    with pytest.raises(ImageFitError, match=r"^the image could not be decoded$"):
        check_pixels(raw)


@pytest.mark.parametrize("kind", ["png", "jpeg", "gif", "webp"])
def test_check_pixels_decodes_a_good_image_of_each_format(kind):
    check_pixels(noise(640, 480, kind))


def test_a_bomb_is_refused_by_check_pixels_too():
    with pytest.raises(ImageFitError, match="decompression bomb"):
        check_pixels(png_header_only(10_000, 10_000))


def test_a_truncated_image_that_must_be_fitted_is_refused(fetcher):
    """The header reads, the pixels don't: found when it is decoded to be scaled."""
    raw = noise(9000, 300)[: 4 * MIB]
    slot = data_slot(raw, "messages[0].content[1].image_url.url")
    assert str(refusal(fetcher, slot)) == f"{slot.path}: the image could not be decoded"


def test_an_image_over_the_pixel_budget_is_refused_from_its_header():
    assert probe(png_header_only(7000, 7000)).width == 7000  # 49 megapixels: within the budget
    with pytest.raises(ImageFitError) as caught:
        probe(png_header_only(7100, 7100))
    assert caught.value.reason == (
        f"the image has 50410000 pixels (7100 x 7100); at most {MAX_IMAGE_PIXELS} are accepted"
    )


def test_the_issues_near_bomb_png_is_refused_at_once(fetcher):
    """A 1-bit 9400 x 9400 PNG of 11 KB, just under Pillow's bomb limit: it took ~4 s and ~1 GB
    to fit; the pixel budget refuses it from its header, before any pixel is decoded."""
    raw = zlib.compress((b"\x00" + bytes(1175)) * 9400, 9)
    ihdr = struct.pack(">IIBBBBB", 9400, 9400, 1, 0, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")
    assert Image.MAX_IMAGE_PIXELS > 9400 * 9400  # not a bomb by Pillow's count
    started = time.monotonic()
    err = refusal(fetcher, data_slot(png, "messages[0].content[1].image_url.url"))
    assert f"at most {MAX_IMAGE_PIXELS} are accepted" in str(err)
    assert time.monotonic() - started < 1.0


def test_a_request_whose_images_have_too_many_pixels_in_all_is_refused():
    big = Probe(media_type="image/png", width=7000, height=7000)  # 49 megapixels each
    assert plan([(big, 1000)] * 4, LIMITS) is not None  # 196 in all: within the request's budget
    with pytest.raises(ImageFitError) as caught:
        plan([(big, 1000)] * 5, LIMITS)
    assert caught.value.reason == TOO_MANY_PIXELS_IN_ALL
    assert str(MAX_REQUEST_PIXELS) in TOO_MANY_PIXELS_IN_ALL


def test_probe_reads_the_header_only():
    assert probe(png_header_only(4000, 3000)) == Probe(media_type="image/png", width=4000, height=3000)
    with pytest.raises(ImageFitError):
        probe(b"BM" + bytes(100))  # a BMP: Pillow reads it, the upstream doesn't take it


# ---------------------------------------------------------------- through the translator


def test_every_image_of_the_request_has_a_slot_with_its_client_path(fetcher):
    model = Model(id="m", aliases=(), price=Price(*(1,) * 4), deployments=())  # type: ignore[arg-type]
    raw = noise(9000, 4)
    request = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(raw)}"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                ],
            },
        ],
    }
    translation = openai_to_anthropic(load_chat_request(request), model, auto_cache=False)
    data, url = translation.image_slots
    assert (data.path, data.url, data.raw) == ("messages[2].content[1].image_url.url", None, raw)
    assert (url.path, url.url) == ("messages[2].content[2].image_url.url", "https://example.com/a.png")
    fetcher.prepare([data], UpstreamImageLimits.of(model))
    block = translation.body["messages"][2]["content"][1]
    assert block is data.block and sent(data)[2].size == (8000, 4)


def test_the_model_limits_come_from_the_catalog():
    model = Model(
        id="m",
        aliases=(),
        price=Price(*(1,) * 4),  # type: ignore[arg-type]
        deployments=(),
        max_image_bytes=MIB,
        max_image_px=4000,
        many_images=5,
        many_images_max_px=1000,
        max_request_bytes=8 * MIB,
    )
    assert UpstreamImageLimits.of(model) == UpstreamImageLimits(MIB, 4000, 5, 1000, 8 * MIB)
    assert UpstreamImageLimits.of(model).max_side(5) == 4000 and UpstreamImageLimits.of(model).max_side(6) == 1000
