"""Tool-call ids: OpenAI allows any string, Anthropic only ``^[a-zA-Z0-9_-]+$``.

Ids that already fit (and don't start with our prefix) pass unchanged; the others become
``ezat-`` + base64url of their UTF-8 bytes. The mapping is injective and decodable, and the
same function runs on ``tool_calls[].id`` and ``tool_call_id``, so calls and results still meet.
"""

from __future__ import annotations

import base64
import binascii
import re

PREFIX = "ezat-"
_VALID = re.compile(r"[A-Za-z0-9_-]+")


def encode_tool_id(openai_id: str) -> str:
    if _VALID.fullmatch(openai_id) and not openai_id.startswith(PREFIX):
        return openai_id
    raw = base64.urlsafe_b64encode(openai_id.encode("utf-8")).decode("ascii").rstrip("=")
    return PREFIX + raw


def decode_tool_id(anthropic_id: str) -> str:
    if not anthropic_id.startswith(PREFIX):
        return anthropic_id
    raw = anthropic_id[len(PREFIX) :]
    try:
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return anthropic_id
