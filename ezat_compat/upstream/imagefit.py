"""Images fitted to the upstream's limits: checked with Pillow, scaled down and re-encoded when needed.

The Chat Completions reference, "Images and PDFs", accepts images the upstream would refuse: up to
10 MB per download (13.3 MB of base64) and 32 MB of downloads per request. Anthropic's Messages
API refuses an image whose base64 text is over 5 MB (``image exceeds 5 MB maximum: 6291456 bytes
> 5242880 bytes``: the length of the base64 string, not of the decoded bytes), a side over
8000 px, a side over 2000 px when the request carries more than 20 images, and a body over
32 MB (413). Those numbers are per model in the catalog (``Model.max_image_bytes`` …); this
module makes every image fit them, so that no image the spec accepts is refused upstream.

Four steps, all CPU and no I/O (the image fetcher runs them off the event loop, on its
organisations' fair shares of the decoding places):

- ``probe``: Pillow reads the header only (``Image.open``), with its decompression-bomb
  protection (``Image.MAX_IMAGE_PIXELS``) as an error; bytes Pillow can't read as one of the
  four types are an error. Pillow inflates a PNG's compressed text chunks (``zTXt``, ``iTXt``)
  as it reads the header, up to ``MAX_TEXT_CHUNK`` each and ``MAX_TEXT_MEMORY`` in all (1 MB
  and 64 MB by default: 60 chunks of 1 KB inflated 60 MB, for one 60 KB image): Pillow never
  sees them here (``readable``: text isn't image data, and the upstream is sent the bytes as
  they came), its limits are lowered all the same, and a PNG of more than ``MAX_PNG_CHUNKS``
  chunks is refused before Pillow walks them (~4 µs of Python each).
- ``check_pixels``: an image that fits is decoded once all the same (``load``; a JPEG at 1/8
  scale, which still reads all its data), so that one whose header reads but whose data doesn't
  (a PNG whose IDAT is random bytes, a truncated file) is refused here, not by the upstream.
  With the header read, this is the whole cost of an image that fits; an image that is fitted is
  decoded by ``fit`` instead, never twice.
- ``plan``: each image's target for its request: the side limit (the many-images one when the
  request has more images than ``many_images``) and a byte budget: ``max_image_bytes``, or less
  when the images together would not leave room in ``max_request_bytes`` for the rest of the
  body; the largest images give up bytes first (the smaller ones keep theirs).
- ``fit``: an image over its target is decoded, scaled down keeping its aspect ratio and
  re-encoded, in its own format where that can fit (PNG stays PNG, JPEG and WebP step down their
  quality, GIF stays GIF; an animated image keeps its first frame), until it fits. An image
  within its target is never touched: its bytes go out as they came.

Errors are ``ImageFitError(reason)``; the caller names the part (400).
"""

from __future__ import annotations

import io
import math
import struct
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image, PngImagePlugin

from ezat_compat.domain import Model

# Pillow warns (DecompressionBombWarning) between MAX_IMAGE_PIXELS and twice that and raises
# above; its documentation's advice for untrusted input is to make the warning an error too.
warnings.filterwarnings("error", category=Image.DecompressionBombWarning)
# Pillow's bounds on what a PNG's compressed chunks inflate to as its header is read: one text
# chunk or ICC profile (``MAX_TEXT_CHUNK``), and the text of one image (``MAX_TEXT_MEMORY``, 64 MB
# by default). ``readable`` drops the text (and the profiles but for a fit's) before Pillow reads
# it; these hold if one is missed. An ICC profile over 1 MB (none real is) makes an image that
# must be fitted "could not be decoded".
INFLATED_CHUNK_BYTES = 1024 * 1024
PngImagePlugin.MAX_TEXT_CHUNK = INFLATED_CHUNK_BYTES
PngImagePlugin.MAX_TEXT_MEMORY = INFLATED_CHUNK_BYTES

_MIB = 1024 * 1024
_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
_PILLOW_FORMATS = tuple(_FORMATS)
# The rest of the upstream body beside the images' base64 (text, tools, the JSON around each
# block) when the caller doesn't say how much that is.
DEFAULT_OTHER_BYTES = 1 * _MIB
_BLOCK_OVERHEAD = 128  # {"type": "image", "source": {"type": "base64", "media_type": …, "data": ""}}
_QUALITIES = (85, 70)  # JPEG and WebP: the qualities tried at each scale before scaling further
_NO_DITHER = Image.Dither.NONE
_MAX_ROUNDS = 8  # scale steps before giving up (each shrinks the area by at least 19%)

# The pixel budgets, far below Pillow's bomb limit (~89.5 million): decoding and fitting cost
# CPU and memory by the pixel (a 1-bit 9400 x 9400 PNG of 10.8 KB took ~4 s and ~1 GB to fit),
# while the model sees ~1.15 megapixels of any image (the API scales larger ones down). 50
# megapixels takes an 8000 x 6000 photo; a request's images together take 200.
MAX_IMAGE_PIXELS = 50_000_000
MAX_REQUEST_PIXELS = 200_000_000
# Images and documents in one request: Anthropic's vision guide ("Basics and Limits": up to 600
# per API request, 100 for models with a 200k-token context window), as its API refuses more
# (``too many images and documents: 104 + 1 > 100``).
MAX_MEDIA = 100
MAX_MEDIA_LONG_CONTEXT = 600
LONG_CONTEXT = 200_000  # a context window above this takes MAX_MEDIA_LONG_CONTEXT
# Chunks of one PNG: real files have tens (a 32 MB one cut in 8 KB IDATs, ~4000); past this the
# walk itself is the cost (Pillow reads ~250,000 empty chunks a second, holding the GIL).
MAX_PNG_CHUNKS = 50_000

UNDECODABLE = "the image could not be decoded"
TOO_MANY_PIXELS_IN_ALL = f"the images of this request have more than {MAX_REQUEST_PIXELS} pixels in all"
CANNOT_FIT = "the image could not be made small enough for the model"
NO_ROOM = "the images of this request cannot fit the upstream's request size limit"
TOO_MANY_CHUNKS = f"the PNG has more than {MAX_PNG_CHUNKS} chunks"


def too_much_media(images: int, documents: int, limit: int) -> str:
    """The refusal of a request with more than ``limit`` images and documents, in the API's words."""
    return f"too many images and documents: {images} + {documents} > {limit}"


def _too_many_pixels() -> str:
    return f"the image has more than {Image.MAX_IMAGE_PIXELS} pixels (a decompression bomb?)"


class ImageFitError(Exception):
    """The image can't be used; ``reason`` says why, for a 400 naming the part."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class UpstreamImageLimits:
    """What the upstream accepts of a request's images (a model's ``max_image_bytes`` …)."""

    max_image_bytes: int = 5 * _MIB  # base64 text of one image
    max_image_px: int = 8000
    many_images: int = 20
    many_images_max_px: int = 2000
    max_request_bytes: int = 32 * _MIB
    max_media: int = MAX_MEDIA  # images and documents of one request

    @classmethod
    def of(cls, model: Model) -> UpstreamImageLimits:
        return cls(
            max_image_bytes=model.max_image_bytes,
            max_image_px=model.max_image_px,
            many_images=model.many_images,
            many_images_max_px=model.many_images_max_px,
            max_request_bytes=model.max_request_bytes,
            max_media=MAX_MEDIA_LONG_CONTEXT if model.context_window > LONG_CONTEXT else MAX_MEDIA,
        )

    def max_side(self, images: int) -> int:
        """The longest side allowed for each image of a request with ``images`` images."""
        if images > self.many_images:
            return min(self.max_image_px, self.many_images_max_px)
        return self.max_image_px


@dataclass(frozen=True, slots=True)
class Probe:
    """What an image's header says: its type and size."""

    media_type: str
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class FitTarget:
    """What one image must fit: its longest side and its base64 length."""

    max_side: int
    max_b64: int


def b64_length(size: int) -> int:
    """The length of the base64 text of ``size`` bytes."""
    return 4 * ((size + 2) // 3)


def _max_raw(max_b64: int) -> int:
    """The most bytes whose base64 text is at most ``max_b64`` characters."""
    return 3 * (max_b64 // 4)


def decoded_bytes(image: Probe) -> int:
    """About what decoding ``image`` takes in memory: four bytes a pixel (Pillow's RGB and RGBA;
    a 16-bit grey image takes two, then four while it is converted)."""
    return 4 * image.width * image.height


# ---------------------------------------------------------------- what Pillow reads

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_TEXT = frozenset({b"tEXt", b"zTXt", b"iTXt"})
_PNG_CHUNK = struct.Struct(">I4s")


def readable(raw: bytes, *, icc: bool = False) -> bytes:
    """What Pillow is given of ``raw``: a PNG without its text chunks (``tEXt``, ``zTXt``,
    ``iTXt``: metadata Pillow would inflate and keep, never pixels) nor its ICC profiles
    (``iCCP``, inflated too; with ``icc``, the first is kept: a fit carries it into the image it
    writes); any other image, or a PNG without them, as it is. So reading a request's images
    inflates their pixels only (within its pixel budget), and one profile per fitted image.

    Walks the chunks' headers only (12 bytes each), stopping where the file breaks off (Pillow
    then finds the fault: a chunk cut short is kept); ``ImageFitError`` past ``MAX_PNG_CHUNKS``
    chunks. Chunks are dropped whole, so the others' checksums still hold."""
    if not raw.startswith(_PNG_SIGNATURE):
        return raw
    size, pos, start = len(raw), len(_PNG_SIGNATURE), len(_PNG_SIGNATURE)
    kept: list[bytes] = [raw[:start]]
    seen_icc = not icc  # an ICC profile seen already: the next one is dropped
    for _chunk in range(MAX_PNG_CHUNKS):
        if pos + 12 > size:
            break
        length, kind = _PNG_CHUNK.unpack_from(raw, pos)
        end = pos + 12 + length
        if end <= size and (kind in _PNG_TEXT or (kind == b"iCCP" and seen_icc)):
            kept.append(raw[start:pos])
            start = end
        seen_icc = seen_icc or kind == b"iCCP"
        pos = end
        if kind == b"IEND":
            break
    else:
        if pos + 12 <= size:
            raise ImageFitError(TOO_MANY_CHUNKS)
    if len(kept) == 1:
        return raw
    kept.append(raw[start:])
    return b"".join(kept)


# ---------------------------------------------------------------- probe


def probe(raw: bytes) -> Probe:
    """The header of ``raw`` (a JPEG, PNG, GIF or WebP image); the pixels aren't decoded."""
    data = readable(raw)
    try:
        with Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS) as image:
            width, height = image.size
            media_type = _FORMATS.get(image.format or "")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageFitError(_too_many_pixels()) from None
    except Exception:  # Pillow's parsers raise many kinds on hostile bytes: all mean "not an image"
        raise ImageFitError(UNDECODABLE) from None
    if media_type is None or width < 1 or height < 1:
        raise ImageFitError(UNDECODABLE)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:  # whatever the warning filters of the process say
        raise ImageFitError(_too_many_pixels())
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageFitError(
            f"the image has {width * height} pixels ({width} x {height}); at most {MAX_IMAGE_PIXELS} are accepted"
        )
    return Probe(media_type=media_type, width=width, height=height)


def check_pixels(raw: bytes) -> None:
    """Decode the pixels of ``raw`` (its first frame), as the upstream will; ``ImageFitError``
    when they can't be (``UNDECODABLE``) or are too many. A JPEG is decoded at 1/8 scale
    (``draft``: its entropy-coded data is still read whole, a tenth of the work)."""
    data = readable(raw)
    try:
        with Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS) as opened:
            if opened.format == "JPEG":
                opened.draft(opened.mode, (1, 1))
            opened.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageFitError(_too_many_pixels()) from None
    except Exception:  # truncated data, a broken zlib stream, a bad chunk: the image can't be read
        raise ImageFitError(UNDECODABLE) from None


# ---------------------------------------------------------------- plan


def plan(
    sizes: Sequence[tuple[Probe, int]], limits: UpstreamImageLimits, *, other_bytes: int = DEFAULT_OTHER_BYTES
) -> list[FitTarget | None]:
    """Each image's target, or None when it goes out as it is.

    ``sizes`` holds every image of the request as (probe, base64 length). Beside the per-image
    limits, the images' base64 shares what ``max_request_bytes`` leaves after ``other_bytes``:
    when they don't all fit, a level is found such that images larger than it shrink to it and
    the others keep their size (water-filling), so the largest give up bytes first. An image
    scaled for its pixels only may come out a little larger than it was (rare: fewer pixels),
    so the caller plans again with the fitted sizes until nothing is left to fit.
    """
    if not sizes:
        return []
    if sum(image.width * image.height for image, _ in sizes) > MAX_REQUEST_PIXELS:
        raise ImageFitError(TOO_MANY_PIXELS_IN_ALL)
    max_side = limits.max_side(len(sizes))
    capped = [min(b64, limits.max_image_bytes) for _, b64 in sizes]
    budget = limits.max_request_bytes - other_bytes - _BLOCK_OVERHEAD * len(sizes)
    level = _level(capped, budget)
    if level is not None and level < 1024:
        raise ImageFitError(NO_ROOM)
    targets: list[FitTarget | None] = []
    for (image, b64), cap in zip(sizes, capped, strict=True):
        allowed = cap if level is None else min(cap, level)
        if b64 <= allowed and max(image.width, image.height) <= max_side:
            targets.append(None)
        else:
            targets.append(FitTarget(max_side=max_side, max_b64=allowed if b64 > allowed else limits.max_image_bytes))
    return targets


def _level(sizes: list[int], budget: int) -> int | None:
    """The largest size L with sum(min(s, L)) <= budget, or None when all fit as they are."""
    if sum(sizes) <= budget:
        return None
    remaining, left = budget, len(sizes)
    for size in sorted(sizes):
        share = remaining // left
        if size > share:
            return max(share, 0)
        remaining -= size
        left -= 1
    return None  # unreachable: the sum is over the budget


# ---------------------------------------------------------------- fit


def fit(raw: bytes, image: Probe, target: FitTarget) -> tuple[str, bytes]:
    """Scale ``raw`` down and re-encode it until it fits ``target``; (media type, bytes)."""
    max_raw = _max_raw(target.max_b64)
    longest = max(image.width, image.height)
    scale = min(1.0, target.max_side / longest)
    lossless = image.media_type in ("image/png", "image/gif")
    if lossless and len(raw) > max_raw:  # their bytes shrink about with the area
        scale = min(scale, math.sqrt(max_raw / len(raw)) * 0.95)
    picture = _decode(raw, image, scale)
    fmt = picture.format_name
    for _round in range(_MAX_ROUNDS):
        size = _scaled(image, scale, target.max_side)
        resized = picture.resized(size)
        out = b""
        for quality in _QUALITIES if fmt in ("JPEG", "WEBP") else (None,):
            out = _encode(resized, fmt, quality, picture.info)
            if len(out) <= max_raw:
                return _FORMATS[fmt], out
        if fmt == "PNG" and _round >= 3:  # a PNG that shrinking won't fit: a lossy format then
            fmt = "WEBP" if _has_alpha(resized) else "JPEG"
            continue
        scale *= min(0.9, math.sqrt(max_raw / len(out)) * 0.95)
    raise ImageFitError(CANNOT_FIT)


def _scaled(image: Probe, scale: float, max_side: int) -> tuple[int, int]:
    """The size at ``scale``, each side at least 1 px and the longest at most ``max_side``."""
    width = min(max_side, max(1, round(image.width * scale)))
    height = min(max_side, max(1, round(image.height * scale)))
    return width, height


@dataclass
class _Decoded:
    """The decoded first frame, in a mode that resizes and saves well, and what to keep of it."""

    pixels: Image.Image
    format_name: str
    info: dict[str, Any]

    def resized(self, size: tuple[int, int]) -> Image.Image:
        if size == self.pixels.size:
            return self.pixels
        return self.pixels.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)


def _decode(raw: bytes, image: Probe, scale: float) -> _Decoded:
    data = readable(raw, icc=True)
    try:
        with Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS) as opened:
            fmt = opened.format or ""
            if fmt == "JPEG":  # decode at 1/2, 1/4 or 1/8 when the target is that small
                opened.draft(opened.mode, _scaled(image, scale, max(image.width, image.height)))
            opened.seek(0)
            opened.load()
            info = {k: opened.info[k] for k in ("icc_profile", "exif") if opened.info.get(k)}
            pixels = _normalised(opened)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageFitError(_too_many_pixels()) from None
    except Exception:
        raise ImageFitError(UNDECODABLE) from None
    return _Decoded(pixels=pixels, format_name=fmt, info=info)


def _has_alpha(picture: Image.Image) -> bool:
    return picture.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in picture.info


# 16-bit grey -> its high bytes (Pillow's unpackers): one copy of the pixels' bytes, where
# converting through 32-bit integers took two images four times its size (~500 MB at 50 MP).
_SIXTEEN_BIT_HIGH_BYTES = {
    "I;16": "L;16",
    "I;16L": "L;16",
    "I;16B": "L;16B",
    "I;16N": "L;16" if sys.byteorder == "little" else "L;16B",
}


def _normalised(picture: Image.Image) -> Image.Image:
    """``picture`` in L, LA, RGB, RGBA or CMYK: the modes that resize smoothly and save in every
    format (itself when it is in one already: a copy would double the memory of a large image)."""
    mode = picture.mode
    if mode in ("L", "LA", "RGB", "RGBA") or (mode == "CMYK" and picture.format == "JPEG"):
        return picture
    if mode in _SIXTEEN_BIT_HIGH_BYTES:  # to 8 bits, scaled (v * 255 / 65535, within one level)
        return Image.frombytes("L", picture.size, picture.tobytes(), "raw", _SIXTEEN_BIT_HIGH_BYTES[mode])
    if mode.startswith(("I", "F")):  # 16-bit or 32-bit grey: to 8 bits, scaled rather than clipped
        high = picture.getextrema()[1]
        top = 65535 if mode.startswith("I;16") or (isinstance(high, int | float) and high > 255) else 255
        return picture.convert("I").point(lambda v: v * (255 / top)).convert("L")
    return picture.convert("RGBA" if _has_alpha(picture) else "RGB")


def _encode(picture: Image.Image, fmt: str, quality: int | None, info: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    if fmt == "JPEG":
        if picture.mode not in ("L", "RGB", "CMYK"):
            picture = picture.convert("RGB")
        picture.save(out, "JPEG", quality=quality, **info)
    elif fmt == "WEBP":
        if picture.mode not in ("RGB", "RGBA"):
            picture = picture.convert("RGBA" if _has_alpha(picture) else "RGB")
        picture.save(out, "WEBP", quality=quality, **info)
    elif fmt == "PNG":
        picture.save(out, "PNG", icc_profile=info.get("icc_profile"))
    else:  # GIF: back to a palette; the fast octree quantiser (median cut takes seconds)
        if picture.mode != "RGBA":  # RGBA: Pillow's own save keeps the transparency, as fast
            picture = picture.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE, dither=_NO_DITHER)
        picture.save(out, "GIF")
    return out.getvalue()
