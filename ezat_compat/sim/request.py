"""Reading a Messages request body: its content blocks, its last user text, the token formula.

``tokens(text) = ceil(len(text) / 4)`` is the one rule every count in the simulator uses
(input tokens in ``cache``, output tokens in ``replies``). The readers here assume a body that
``validate.validate_request`` accepted, except ``content_blocks`` and ``text_of``, which take
any value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def tokens(text: str) -> int:
    """``ceil(len(text) / 4)``: 0 for ``""``, at least 1 for any other text."""
    return (len(text) + 3) // 4


def compact_json(value: Any) -> str:
    """``value`` as JSON without spaces, non-ASCII kept (what token counts and SSE data use)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def utf8_json(text: str) -> bytes:
    """JSON ``text`` as UTF-8 bytes to send. JSON allows a lone UTF-16 surrogate (``"\\ud800"``)
    and Python's parser takes it into a ``str``, where UTF-8 has no encoding for it: a client's
    surrogate echoed in a reply, an event or a refusal is written back as the same ``\\ud800``
    escape (``backslashreplace`` yields exactly that form inside a JSON string) instead of
    raising. Text without one encodes as plain UTF-8, at no extra cost."""
    return text.encode("utf-8", "backslashreplace")


def is_int(value: Any) -> bool:
    """A JSON integer (``True`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number, integer or not (``True`` is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def content_blocks(content: Any) -> list[Any]:
    """``content`` when it is a list of blocks, else ``[]`` (a string content has no blocks)."""
    return content if isinstance(content, list) else []


def text_of(content: Any) -> str:
    """A string content as is, or its text blocks joined with newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] for b in content_blocks(content) if isinstance(b, dict) and b.get("type") == "text")


def last_user_message(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The last message with role ``user`` (a trailing assistant prefill is skipped)."""
    for message in reversed(body["messages"]):
        if message.get("role") == "user":
            return message
    return None


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text blocks of the last user message, joined with newlines (markers included)."""
    message = last_user_message(body)
    return "" if message is None else text_of(message.get("content"))


def tool_result_text(block: Mapping[str, Any]) -> str:
    """The text of a ``tool_result`` block's content."""
    return text_of(block.get("content", ""))
