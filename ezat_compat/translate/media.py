"""Media types from bytes, not from labels (spec: "Images and PDFs": "EZAT checks the bytes,
not the content-type")."""

from __future__ import annotations

import binascii

PDF_MEDIA_TYPE = "application/pdf"


def sniff_image_type(data: bytes) -> str | None:
    """The media type that ``data``'s signature shows — JPEG, PNG, GIF (87a/89a) or WebP — else None."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def is_pdf(data: bytes) -> bool:
    return data.startswith(b"%PDF-")


def decode_base64(data: str) -> bytes | None:
    """The bytes of strict base64 text (no whitespace, correct padding), or None."""
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
