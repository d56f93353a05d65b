"""Images and PDFs on native ``/v1/messages``: what the API checks on their bytes is checked
before the upstream call, in the API's words; every base64 image becomes an image slot (the
image step decodes it, and fits it when it is over the upstream's limits)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from ezat_compat.dialects.anthropic_messages import native_media
from ezat_compat.errors import InvalidRequestError

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 16


def image(data: bytes | str, media_type: str = "image/png", kind: str = "base64") -> dict[str, Any]:
    text = data if isinstance(data, str) else base64.b64encode(data).decode()
    if kind == "url":
        return {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    return {"type": "image", "source": {"type": kind, "media_type": media_type, "data": text}}


def pdf(data: bytes) -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": encoded}}


def user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": [*blocks]}


def result(*blocks: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "toolu_1", "content": [*blocks]}


@pytest.mark.parametrize(
    ("messages", "paths"),
    [
        pytest.param([user(image(PNG))], ["messages.0.content.0.image.source.base64"], id="one"),
        pytest.param(
            [
                user({"type": "text", "text": "x"}),
                user(result({"type": "text", "text": "r"}, image(JPEG, "image/jpeg"))),
            ],
            ["messages.1.content.0.tool_result.content.1.image.source.base64"],
            id="inside-a-tool-result",
        ),
        pytest.param([user(image("not base64!"))], [], id="bad-base64-left-to-the-upstream"),
        pytest.param([user(image(PNG, "image/bmp"))], [], id="unknown-media-type-left-to-the-upstream"),
        pytest.param([user(image(PNG, kind="url"))], [], id="url-source-the-upstream-fetches"),
        pytest.param([user(pdf(b"%PDF-1.7\n"))], [], id="a-pdf"),
        pytest.param([{"role": "user", "content": "text only"}], [], id="string-content"),
        pytest.param("not a list", [], id="not-a-list"),
    ],
)
def test_base64_images_become_slots_named_by_their_path(messages: Any, paths: list[str]) -> None:
    assert [slot.path for slot in native_media(messages)] == paths


@pytest.mark.parametrize(
    ("block", "message"),
    [
        pytest.param(
            image(JPEG),
            "messages.0.content.0.image.source.base64: The image was specified using the image/png media type, "
            "but the image appears to be a image/jpeg image",
            id="type-mismatch",
        ),
        pytest.param(
            image(b"GIF89a" + b"\0" * 10, "image/webp"),
            "messages.0.content.0.image.source.base64: The image was specified using the image/webp media type, "
            "but the image appears to be a image/gif image",
            id="gif-as-webp",
        ),
        pytest.param(
            image(b"plain text"), "messages.0.content.0.image.source.base64: Could not process image", id="not-an-image"
        ),
        pytest.param(
            pdf(b"PK\x03\x04 a zip"),
            "messages.0.content.0.pdf.source.base64.data: The PDF specified was not valid.",
            id="pdf-that-is-a-zip",
        ),
    ],
)
def test_bytes_the_api_refuses_are_refused_in_its_words(block: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        native_media([user(block)])
    assert caught.value.message == message
    assert caught.value.param == message.split(":")[0]
