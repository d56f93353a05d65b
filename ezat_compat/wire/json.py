"""JSON bodies in and out, for every dialect.

``decode_body`` turns the raw request body into JSON data or a ``BodyError`` (a 400 the dialect
words): empty, not JSON (invalid UTF-8 included), nested too deep for the parser, or holding a
lone UTF-16 surrogate (``"\\ud800"`` — valid JSON, but no Unicode text: nothing could send it on
as UTF-8). The surrogate walk runs only when the raw bytes hold a ``\\uD8..``-``\\uDF..`` escape,
so ordinary bodies pay one ``bytes.find``-like regex scan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False)


class BodyError(Exception):
    """The body can't be used; ``path`` names the part (empty for the whole body)."""

    def __init__(self, message: str, path: Sequence[str | int] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = tuple(path)


def _surrogate_path(value: Any, path: list[str | int]) -> list[str | int] | None:
    """The path of the first string or key holding a lone surrogate, or None."""
    if isinstance(value, str):
        return path if _LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _LONE_SURROGATE.search(key):
                return [*path, key.encode("utf-8", "backslashreplace").decode("ascii")]
            found = _surrogate_path(item, [*path, key])
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _surrogate_path(item, [*path, index])
            if found is not None:
                return found
    return None


def decode_body(raw: bytes) -> Any:
    """The parsed JSON body; ``BodyError`` when it is empty, not JSON or not Unicode text."""
    if not raw:
        raise BodyError("The request body is empty; send a JSON object.")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise BodyError("The request body is nested too deeply.") from None
    except ValueError as exc:
        raise BodyError(f"The request body is not valid JSON: {exc}.") from None
    if _SURROGATE_ESCAPE.search(raw):
        try:
            found = _surrogate_path(data, [])
        except RecursionError:
            raise BodyError("The request body is nested too deeply.") from None
        if found is not None:
            raise BodyError(
                "contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode text.", found
            )
    return data


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON, non-ASCII kept as is (a lone surrogate from upstream is escaped)."""
    try:
        return _ENCODER.encode(value).encode()
    except UnicodeEncodeError:
        return _ASCII_ENCODER.encode(value).encode()
