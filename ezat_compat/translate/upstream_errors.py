"""Upstream error text -> client error text (Chat Completions reference, "Ignored and refused
fields"): upstream 400s point into the client's request, never into our translated one.

Anthropic words its 400s with paths into the request it received (``messages.2.content.0…``),
indexed after system messages were removed and turns merged, so they don't match the client's
indexes. ``rewrite_upstream_message`` maps such a path back through the translation's source
map, or drops it when it has no counterpart in the client's request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ezat_compat.translate.ids import PREFIX, decode_tool_id

_LEADING_PATH = re.compile(r"^(?P<path>[A-Za-z_]+(?:\.[A-Za-z0-9_]+)*)\s*:\s*(?P<rest>.*)$", re.S)
_ENCODED_ID = re.compile(re.escape(PREFIX) + r"[A-Za-z0-9_-]+")
_CLIENT_ROOTS = frozenset({"messages", "tools", "tool_choice", "max_tokens", "stop_sequences"})
_RENAMED_ROOTS = {"stop_sequences": "stop"}


def _decode_ids(text: str) -> str:
    return _ENCODED_ID.sub(lambda m: decode_tool_id(m.group(0)), text) if PREFIX in text else text


def rewrite_upstream_message(message: str, source_map: Mapping[tuple[Any, ...], str]) -> tuple[str, str | None]:
    """(message, param) for the client. The path, if any, names the client's request."""
    message = _decode_ids(message)
    match = _LEADING_PATH.match(message)
    if not match:
        return message, None
    parts = match["path"].split(".")
    rest = match["rest"]
    root = parts[0]
    indexes = []
    for part in parts[1:]:
        if part.isdigit():
            indexes.append(int(part))
        elif part != "content" or len(indexes) != 1:
            break
    if root in ("messages", "system", "tools") and indexes:
        for size in range(min(len(indexes), 2), 0, -1):
            path = source_map.get((root, *indexes[:size]))
            if path:
                return f"{path}: {rest}", path
    if root in _CLIENT_ROOTS and len(parts) == 1:
        name = _RENAMED_ROOTS.get(root, root)
        return f"{name}: {rest}", name
    return rest, None
