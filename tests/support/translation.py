"""Chat Completions requests translated for Anthropic, for the tests of the translation: a model
to translate for, a user message, data URLs of an image and a PDF, and the translation or the
refusal of a request."""

from __future__ import annotations

import dataclasses
from typing import Any

from ezat_compat.config import parse_config
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.request import Translation, openai_to_anthropic
from ezat_compat.wire.loading import RequestValidationError
from ezat_compat.wire.openai import load_chat_request
from tests.support.anthropic_types import validate_anthropic_request

PNG_URL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
    "RU5ErkJggg=="
)
PDF_URL = "data:application/pdf;base64,JVBERi0xLjQKJcOkw7zDtsOfCjIgMCBvYmoK"
USER = {"role": "user", "content": "Hi"}

BASE_MODEL = parse_config(
    {
        "models": [
            {
                "id": "anthropic/test",
                "aliases": ["test"],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "claude-sonnet-5-5"}],
            }
        ]
    }
).models[0]


def model(**changes: Any) -> Any:
    """``BASE_MODEL`` with ``changes``."""
    return dataclasses.replace(BASE_MODEL, **changes)


def translate(
    extra: dict[str, Any] | None = None,
    *,
    messages: list[dict[str, Any]] | None = None,
    auto_cache: bool = False,
    **model_changes: Any,
) -> Translation:
    """The chat request of ``USER`` (or ``messages``) and ``extra`` translated for ``BASE_MODEL``
    changed by ``model_changes``, its images filled in as the downloader would, and validated
    with the anthropic SDK's ``MessageCreateParams``."""
    request = {"model": "test", "messages": messages if messages is not None else [USER]}
    request.update(extra or {})
    result = openai_to_anthropic(load_chat_request(request), model(**model_changes), auto_cache=auto_cache)
    for slot in result.image_slots:  # what the downloader does before the request goes out
        if slot.url is not None:  # data URLs' slots already hold their source
            slot.block["source"] = {"type": "base64", "media_type": "image/png", "data": PNG_URL.split(",", 1)[1]}
    validate_anthropic_request(result.body)
    return result


def refused(
    extra: dict[str, Any] | None = None, *, messages: list[dict[str, Any]] | None = None, **model_changes: Any
) -> tuple[str, str | None]:
    """(message, param) of the 400 the request gets, from the schema or the translator."""
    request = {"model": "test", "messages": messages if messages is not None else [USER]}
    request.update(extra or {})
    try:
        openai_to_anthropic(load_chat_request(request), model(**model_changes), auto_cache=False)
    except RequestValidationError as exc:
        return f"{exc.path}: {exc.message}" if exc.path else exc.message, exc.path or None
    except InvalidRequestError as exc:
        assert exc.status == 400 and exc.openai_type == "invalid_request_error"
        return exc.message, exc.param
    raise AssertionError("the request was not refused")
