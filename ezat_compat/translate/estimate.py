"""An upper bound of a request's input tokens, for reserving credit before it runs
(admission reserves the worst case, so no balance is ever overdrawn).

A token covers at least one byte of text, so UTF-8 bytes bound text tokens; an image costs
at most ``IMAGE_TOKENS``; a document (PDF) may fill the context window; nothing exceeds the
context window, which the upstream enforces. Works on Anthropic request bodies, so both
dialects share it. Any JSON is taken (native bodies reach it unvalidated): a value of the wrong
type counts as its text, and the recursion stays shallow because the body phase bounds the
nesting (``wire.json.MAX_DEPTH``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IMAGE_TOKENS = 6_000
REQUEST_OVERHEAD_TOKENS = 1_000  # tool-use system prompt and per-message framing


def _str_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _text_bytes(value: Any) -> tuple[int, int, int]:
    """(text bytes, images, documents) under ``value``."""
    if isinstance(value, str):
        return _str_bytes(value), 0, 0
    total = images = documents = 0
    if type(value) is dict or (type(value) is not list and isinstance(value, Mapping)):
        kind = value.get("type")
        if kind == "image":
            return 0, 1, 0
        if kind == "document":
            return 0, 0, 1
        items: Any = value.values()
        # Keys count too (tool schemas are mostly property names), with their quotes and colon.
        for key in value:
            if isinstance(key, str):
                total += (len(key) if key.isascii() else len(key.encode("utf-8", "surrogatepass"))) + 4
    elif isinstance(value, list | tuple):
        items = value
    else:
        return (len(str(value)) if value is not None else 0), 0, 0
    for item in items:
        if type(item) is str:  # the common leaf, without a call of its own
            total += len(item) if item.isascii() else len(item.encode("utf-8", "surrogatepass"))
            continue
        t, i, d = _text_bytes(item)
        total += t
        images += i
        documents += d
    return total, images, documents


def input_tokens_upper_bound(body: Mapping[str, Any], context_window: int) -> int:
    """Tokens the request's input can cost at most (system, messages and tools)."""
    total = REQUEST_OVERHEAD_TOKENS
    for key in ("system", "messages", "tools"):
        part = body.get(key)
        if part is None:
            continue
        text, images, documents = _text_bytes(part)
        if documents:
            return context_window
        total += text + images * IMAGE_TOKENS
        if total >= context_window:
            return context_window
    return total


WEB_SEARCH_TOOL_PREFIX = "web_search_"  # Anthropic's server web search: web_search_20250305, …


def bound_web_searches(body: Mapping[str, Any], default_max_uses: int) -> int:
    """The most web searches the upstream may run (and bill, per search) for ``body``.

    Anthropic's web search tool takes ``max_uses`` (web search tool reference, "Tool
    definition": the most searches in one request); without it the searches are unbounded, so
    no reservation could cover them. A web search tool without a ``max_uses`` (or with null) is
    given ``default_max_uses`` here, in place: the body's ``tools`` list gets a copy of that tool
    dict with it. A positive whole ``max_uses`` counts as sent; any other value is the upstream's
    to refuse (400: nothing is billed), so it counts nothing. Other tools cost nothing per use.
    """
    tools = body.get("tools")
    if not isinstance(tools, list):
        return 0
    total = 0
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            continue
        kind = tool.get("type")
        if not isinstance(kind, str) or not kind.startswith(WEB_SEARCH_TOOL_PREFIX):
            continue
        uses = tool.get("max_uses")
        if uses is None:
            tools[i] = {**tool, "max_uses": default_max_uses}
            total += default_max_uses
        elif type(uses) is int and uses > 0:
            total += uses
    return total
