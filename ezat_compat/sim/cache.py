"""Input tokens and the prompt cache: a request as prompt units, their count, cache reads and writes.

A request's input is the sum over system texts, message text blocks, tool_result contents,
the JSON of tool_use inputs and of the tools list, plus 3 per message, 1000 per image and
1500 per document (each capped by the size of its data, so the total never exceeds the UTF-8
byte length of the body). ``PromptCache`` splits that total into read / written / plain.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ezat_compat.sim.request import compact_json, content_blocks, tokens

IMAGE_TOKENS = 1000
DOCUMENT_TOKENS = 1500
MESSAGE_OVERHEAD_TOKENS = 3


@dataclass(frozen=True)
class PromptUnit:
    """One piece of a prompt in cache order (tools, system, messages).

    ``tokens`` is what the piece adds to the count; ``breakpoint`` is True when it carries
    ``cache_control``; ``payload`` is what identifies it in the cache (``cache_control`` removed).
    """

    tokens: int
    breakpoint: bool
    payload: Any


def _source_size(block: Mapping[str, Any], cap: int) -> int:
    source = block.get("source") or {}
    data = source.get("data") or source.get("url") or ""
    return max(1, min(cap, len(data)))


def _block_tokens(block: Mapping[str, Any]) -> int:
    kind = block.get("type")
    if kind == "text":
        return tokens(block["text"])
    if kind == "image":
        return _source_size(block, IMAGE_TOKENS)
    if kind == "document":
        return _source_size(block, DOCUMENT_TOKENS)
    if kind == "tool_use":
        return tokens(compact_json(block["input"]))
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return tokens(content)
        return sum(_block_tokens(inner) for inner in content)
    return 0  # thinking and redacted_thinking from earlier turns are not part of the context


def _has_cache_control(block: Mapping[str, Any]) -> bool:
    if block.get("cache_control") is not None:
        return True
    if block.get("type") == "tool_result":
        return any(inner.get("cache_control") is not None for inner in content_blocks(block.get("content")))
    return False


def _without_cache_control(block: Mapping[str, Any]) -> dict[str, Any]:
    clean = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(clean.get("content"), list):
        clean["content"] = [_without_cache_control(inner) for inner in clean["content"]]
    return clean


def prompt_units(body: Mapping[str, Any]) -> list[PromptUnit]:
    """The request as ``PromptUnit``s in cache order; their tokens sum to the input tokens.

    Tools count as the JSON of the tools list: the unit of tool k brings the total to
    ``tokens(json(tools[:k+1]))``. Each message starts with a unit of 3 tokens (its role).
    A top-level ``cache_control`` is a breakpoint on the last block of the last message.
    """
    units: list[PromptUnit] = []
    tools = body.get("tools") or []
    chars = 2  # json(tools[:k+1]) is "[" + ",".join(each tool's JSON) + "]"
    counted = 0
    for k, tool in enumerate(tools):
        chars += len(compact_json(tool)) + (1 if k else 0)
        total = (chars + 3) // 4
        units.append(PromptUnit(total - counted, tool.get("cache_control") is not None, tool))
        counted = total
    system = body.get("system")
    if isinstance(system, str):
        if system:
            units.append(PromptUnit(tokens(system), False, system))
    elif system:
        for block in system:
            units.append(PromptUnit(tokens(block["text"]), block.get("cache_control") is not None, block))
    for message in body["messages"]:
        units.append(PromptUnit(MESSAGE_OVERHEAD_TOKENS, False, message["role"]))
        content = message["content"]
        if isinstance(content, str):
            if content:
                units.append(PromptUnit(tokens(content), False, content))
            continue
        for block in content:
            units.append(PromptUnit(_block_tokens(block), _has_cache_control(block), block))
    if body.get("cache_control") is not None and units:
        last = units[-1]
        units[-1] = PromptUnit(last.tokens, True, last.payload)
    return units


def count_input_tokens(body: Mapping[str, Any]) -> int:
    """Total input tokens of a valid request (what ``count_tokens`` answers)."""
    return sum(unit.tokens for unit in prompt_units(body))


@dataclass(frozen=True)
class InputUsage:
    """The three input figures of ``usage``; they always sum to the request's input tokens."""

    input_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


def _payload_bytes(payload: Any) -> bytes:
    if isinstance(payload, dict):
        payload = _without_cache_control(payload)
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


class PromptCache:
    """A bounded LRU of prompt-prefix hashes, one entry per cache breakpoint written.

    Keys hash the model and the prompt up to a breakpoint (tools, system, messages, without
    ``cache_control``), so moving a breakpoint forward in the next turn reads back the prefix
    the previous turn wrote. Not thread-safe: use it from one thread (or one gevent hub).
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._entries: OrderedDict[bytes, int] = OrderedDict()
        self._max_entries = max_entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every cached prefix."""
        self._entries.clear()

    def account(self, model: str, units: Sequence[PromptUnit], min_tokens: int) -> InputUsage:
        """Split the input of a request into read / written / plain tokens, and store the writes.

        The longest prefix already cached (at any block boundary up to the last breakpoint) is
        read; the tokens from there to the last breakpoint are written, but only when that
        prefix holds at least ``min_tokens`` tokens; the rest is plain input.
        """
        total = sum(unit.tokens for unit in units)
        last_breakpoint = max((k for k, unit in enumerate(units) if unit.breakpoint), default=-1)
        if last_breakpoint < 0:
            return InputUsage(total)
        digest = hashlib.sha256(model.encode("utf-8", "surrogatepass"))  # any model name hashes
        cumulative = read = 0
        hit: bytes | None = None
        to_store: list[tuple[bytes, int]] = []
        for unit in units[: last_breakpoint + 1]:
            cumulative += unit.tokens
            digest.update(_payload_bytes(unit.payload))
            digest.update(b"\x1e")
            key = digest.digest()
            if key in self._entries:
                read, hit = cumulative, key
            if unit.breakpoint:
                to_store.append((key, cumulative))
        if hit is not None:
            self._entries.move_to_end(hit)
        written = 0
        if cumulative >= min_tokens and cumulative > read:
            written = cumulative - read
            for key, size in to_store:
                if size >= min_tokens:
                    self._entries[key] = size
                    self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return InputUsage(total - read - written, written, read)
