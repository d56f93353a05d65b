"""Turn marshmallow's nested error data into the spec's flat ``path: message`` form.

marshmallow reports ``{"messages": {0: {"content": {2: {"image_url": {"url": [...]}}}}}}``;
the spec words the same error ``messages[0].content[2].image_url.url: …``. One flattener
serves request validation and config-file errors alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

SCHEMA_KEY = "_schema"


def join_path(prefix: str, key: object) -> str:
    """Append one key to a dotted/indexed path: ``a`` + 0 -> ``a[0]``, ``a`` + ``b`` -> ``a.b``."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    if key == SCHEMA_KEY:
        return prefix
    return f"{prefix}.{key}" if prefix else str(key)


def format_path(parts: Iterable[str | int]) -> str:
    """Keys and indexes in the spec's form: ``("messages", 0, "content")`` -> ``messages[0].content``
    (the OpenAI dialects' paths of a body's parts, ``wire.json``'s included)."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def flatten_errors(errors: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Yield ``(path, message)`` pairs, depth first, in the order marshmallow reported them."""
    if isinstance(errors, Mapping):
        for key, value in errors.items():
            yield from flatten_errors(value, join_path(prefix, key))
    elif isinstance(errors, list | tuple):
        for item in errors:
            yield from flatten_errors(item, prefix)
    else:
        yield prefix, str(errors)


def first_error(errors: Any) -> tuple[str, str]:
    """The first ``(path, message)`` of a marshmallow error tree."""
    for pair in flatten_errors(errors):
        return pair
    return "", "invalid request"


def format_error(path: str, message: str) -> str:
    """``path: message``, or the bare message when there is no path."""
    return f"{path}: {message}" if path else message
