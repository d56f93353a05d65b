"""SSE events: a ``message`` (from ``replies.message_json``) as Anthropic's stream of events."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ezat_compat.sim.request import compact_json

WORDS_PER_DELTA = 3
MAX_DELTA_CHARS = 48
_WORD_SPLIT_RE = re.compile(r"(?<=\s)(?=\S)")
_JSON_CUT_RE = re.compile(r"[,:] ")


def text_pieces(text: str, words: int = WORDS_PER_DELTA, max_chars: int = MAX_DELTA_CHARS) -> list[str]:
    """``text`` in pieces of a few words (long words split); the pieces join back to ``text``."""
    pieces: list[str] = []
    group: list[str] = []
    for word in _WORD_SPLIT_RE.split(text):
        while len(word) > max_chars:
            if group:
                pieces.append("".join(group))
                group = []
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if word:
            group.append(word)
        if len(group) >= words:
            pieces.append("".join(group))
            group = []
    if group:
        pieces.append("".join(group))
    return pieces


def json_pieces(data: str) -> list[str]:
    """``data`` (JSON) in 2-3 pieces cut after a ``", "`` or ``": "`` when possible."""
    if len(data) < 2:
        return [data]
    cuts = [m.end() for m in _JSON_CUT_RE.finditer(data)]
    if len(cuts) >= 2:
        chosen = [cuts[len(cuts) // 3], cuts[(2 * len(cuts)) // 3]]
    else:
        chosen = cuts or [1]
    bounds = [0, *sorted(set(chosen)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if a < b]


def _block_events(index: int, block: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = block["type"]
    if kind == "text":
        yield (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        )
        for piece in text_pieces(block["text"]):
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}},
            )
    elif kind == "thinking":
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        )
        for piece in text_pieces(block["thinking"]):
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": piece}},
            )
        yield (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "signature_delta", "signature": block["signature"]},
            },
        )
    else:  # tool_use
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
            },
        )
        # A call without arguments streams one empty piece, as the real API does.
        pieces = json_pieces(json.dumps(block["input"], ensure_ascii=False)) if block["input"] else [""]
        for piece in pieces:
            yield (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                },
            )
    yield "content_block_stop", {"type": "content_block_stop", "index": index}


def message_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of a streamed ``message`` (built by ``message_json``), in Anthropic's order.

    message_start (empty content, ``output_tokens`` 1), ping, each block's start / deltas /
    stop, message_delta (stop reason and final usage), message_stop.
    """
    usage = message["usage"]
    input_usage = {
        "input_tokens": usage["input_tokens"],
        "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
        "cache_read_input_tokens": usage["cache_read_input_tokens"],
    }
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**input_usage, "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        events.extend(_block_events(index, block))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                "usage": {
                    **input_usage,
                    "output_tokens": usage["output_tokens"],
                    "output_tokens_details": usage["output_tokens_details"],
                },
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def encode_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One SSE event: ``event: <name>\\ndata: <compact JSON>\\n\\n``."""
    # ``request.utf8_json``'s rule (a client's lone surrogate goes back as its escape), inlined:
    # this runs once per event of every stream.
    return f"event: {name}\ndata: {compact_json(data)}\n\n".encode("utf-8", "backslashreplace")


OVERLOADED_EVENT = encode_event(
    "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
)
