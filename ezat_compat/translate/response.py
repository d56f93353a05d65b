"""Anthropic message -> OpenAI ``chat.completion`` (spec: "Request and response",
"Finish reasons"), and the usage block shared with the stream translator."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ezat_compat.domain import Usage
from ezat_compat.translate.ids import decode_tool_id
from ezat_compat.translate.tables import finish_reason


def _count(value: Any) -> int:
    if type(value) is int:  # JSON's counts; then any other int but a bool
        return value if value > 0 else 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_from_anthropic(usage: Mapping[str, Any] | None) -> Usage:
    """Read Anthropic's ``usage`` object; null or missing counts are 0.

    ``reasoning_tokens`` comes from ``output_tokens_details.thinking_tokens`` (never from
    re-counting text: the thinking text may be summarised or omitted).
    """
    if not usage:
        return Usage()
    details = usage.get("output_tokens_details") or {}
    server = usage.get("server_tool_use") or {}
    return Usage(
        input_tokens=_count(usage.get("input_tokens")),
        cache_write_tokens=_count(usage.get("cache_creation_input_tokens")),
        cache_read_tokens=_count(usage.get("cache_read_input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        reasoning_tokens=_count(details.get("thinking_tokens") if isinstance(details, Mapping) else None),
        web_searches=_count(server.get("web_search_requests") if isinstance(server, Mapping) else None),
    )


def merge_usage(base: Usage, update: Mapping[str, Any] | None) -> Usage:
    """Apply a ``message_delta`` usage on top of ``message_start``'s: fields present win."""
    if not update:
        return base
    get = update.get
    value = get("input_tokens")
    input_tokens = base.input_tokens if value is None else _count(value)
    value = get("cache_creation_input_tokens")
    cache_write = base.cache_write_tokens if value is None else _count(value)
    value = get("cache_read_input_tokens")
    cache_read = base.cache_read_tokens if value is None else _count(value)
    value = get("output_tokens")
    output = base.output_tokens if value is None else _count(value)
    details = get("output_tokens_details")
    reasoning = (
        _count(details.get("thinking_tokens") if isinstance(details, Mapping) else None)
        if details
        else base.reasoning_tokens
    )
    server = get("server_tool_use")
    searches = (
        _count(server.get("web_search_requests") if isinstance(server, Mapping) else None)
        if server
        else base.web_searches
    )
    return Usage(input_tokens, cache_write, cache_read, output, reasoning, searches)


def usage_to_openai(usage: Usage) -> dict[str, Any]:
    """OpenAI's ``usage`` block: prompt = input + cache reads + cache writes; total = prompt + completion."""
    prompt = usage.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage.output_tokens,
        "total_tokens": prompt + usage.output_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def tool_arguments(tool_input: Any) -> str:
    """``function.arguments``: the tool input as a JSON string, as OpenAI returns it."""
    return json.dumps(tool_input if tool_input is not None else {}, ensure_ascii=False, separators=(",", ":"))


def anthropic_to_openai(
    message: Mapping[str, Any], *, completion_id: str, created: int, model: str, usage: Usage | None = None
) -> dict[str, Any]:
    """Translate a whole Anthropic message into a ``chat.completion``.

    Text blocks are joined; ``tool_use`` blocks become ``tool_calls``; thinking blocks are
    dropped (their tokens are in ``reasoning_tokens``). ``content`` is null when the reply is
    only tool calls. ``model`` is what the client sent, unchanged. ``usage``: the message's
    usage when the caller has parsed it already (``usage_from_anthropic``), so it is parsed once.
    """
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "tool_use":
            tool_calls.append(
                {
                    "id": decode_tool_id(str(block.get("id", ""))),
                    "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": tool_arguments(block.get("input"))},
                }
            )
    content: str | None = "".join(texts)
    if not texts and tool_calls:
        content = None
    reply: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": finish_reason(message.get("stop_reason")),
            }
        ],
        "usage": usage_to_openai(usage if usage is not None else usage_from_anthropic(message.get("usage"))),
    }
