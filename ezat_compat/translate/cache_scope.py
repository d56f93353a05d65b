"""Prompt-cache isolation between organisations (``[gateway] isolate_prompt_cache``).

Every organisation of a gateway sends through the same upstream accounts, and the upstream's
prompt cache is the account's: a prefix one organisation sent is read from the cache by any
other that sends the same prefix, and ``cached_tokens`` / ``cache_read_input_tokens`` tell the
second that the first sent it (an oracle on another tenant's prompts).

With isolation on, every upstream body starts its cached prefix with the organisation's own
scope: a first system block ``cache scope <16 hex>``, an HMAC of the organisation's id under a
key only the gateway holds (``CacheScopes``: derived from the sealing key, ``sealing.py``, so
every node that shares that key gives an organisation the same scope, and rotating it starts
every organisation's cache afresh). The cache is keyed by the whole prefix in the order tools,
system, messages, so:

- a request's prefix at any system or message breakpoint starts with its organisation's scope
  block, which the gateway always puts first itself: another organisation's requests start with
  theirs, never reach it, and read nothing of it. A client's own text that starts like a scope
  block (another organisation's, copied or guessed) is only that: it comes after the gateway's
  block, never instead of it (leaving alone a system prompt that started with ``cache scope ``
  let one organisation send another's scope text and read its prefix). The key keeps the text
  from being computed from the small sequential ids besides;
- a breakpoint on a tool (its prefix is tools alone, ahead of any system block) is moved onto
  the scope block: the prefix cached there is the tools and the scope, as long for the
  organisation itself and closed to the others (the longest TTL among the tools' wins).

A prompt the upstream can't cache needs no scope (``needs_scope``): one with no breakpoint, or
one shorter than the model's smallest cacheable prefix (``min_cache_tokens``) by a bound that
never undercounts, writes no entry and can read none (every entry is at least that long). Such
a request goes upstream as it was translated.

The cost: the scope block's ~12 input tokens on every cacheable request (at least
``min_cache_tokens`` long, so about 1% at most), and cache entries no longer shared between
organisations (each writes its own). Requests of one organisation still share theirs across
keys, nodes (sharing a sealing key) and deployments of one account.

    scopes = CacheScopes(sealer.derive(SCOPE_KEY_PURPOSE))   # once per process
    if needs_scope(body, model.min_cache_tokens):
        scope_cache(body, scopes(org_id))                    # a dict look-up after the first
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from ezat_compat.translate.cache_marks import has_mark

SCOPE_PREFIX = "cache scope "
SCOPE_KEY_PURPOSE = b"prompt-cache scope"  # what the gateway's secret is derived for (``CacheScopes``)
SCOPE_KEY_MIN_BYTES = 16
MAX_SCOPES_KEPT = 65536  # organisations whose scope a process keeps made; past it, made again

# Tokens the upstream adds to a prompt with tools (Anthropic's "tool use system prompt": 346 for
# Claude 4 models with tool_choice auto/none, 313 with any/tool; "Pricing" in the tool-use docs),
# with a margin; and per message and per block for the roles and separators the prompt is
# rendered with.
TOOL_PROMPT_TOKENS = 512
MESSAGE_TOKENS = 16
BLOCK_TOKENS = 8
# Blocks whose text is all their tokens; any other kind (an image, a document, a search result,
# a container upload…) is priced by what it holds, not by its bytes: the bound gives up on it.
_TEXT_KINDS = frozenset(("text", "thinking", "redacted_thinking", "tool_use", "tool_result"))


def cache_scope(org_id: int, key: bytes = b"") -> str:
    """The organisation's scope text under ``key`` (HMAC-SHA256): stable across workers, nodes
    and restarts that share the key. The gateway's key is secret (``CacheScopes`` holds it; use
    that); without one (tests) the text can be computed by anyone, and isolation still holds,
    since ``scope_cache`` always puts the gateway's block first."""
    digest = hmac.digest(key, f"ezat-prompt-cache-scope:{org_id}".encode(), "sha256")
    return SCOPE_PREFIX + digest.hex()[:16]


class CacheScopes:
    """Each organisation's scope text under the gateway's secret ``key``, made once per process
    and organisation (the request path looks it up). Build one per process from the gateway's
    secret, ``Sealer.derive(SCOPE_KEY_PURPOSE)``, and call it with the request's organisation id.
    Raises ``ValueError`` for a key shorter than ``SCOPE_KEY_MIN_BYTES``."""

    __slots__ = ("_key", "_texts")

    def __init__(self, key: bytes) -> None:
        if len(key) < SCOPE_KEY_MIN_BYTES:
            raise ValueError(f"the prompt-cache scope key must hold at least {SCOPE_KEY_MIN_BYTES} bytes")
        self._key = key
        self._texts: dict[int, str] = {}

    def __call__(self, org_id: int) -> str:
        """``org_id``'s scope text (``cache_scope`` under the key)."""
        text = self._texts.get(org_id)
        if text is None:
            if len(self._texts) >= MAX_SCOPES_KEPT:
                self._texts.clear()
            text = self._texts[org_id] = cache_scope(org_id, self._key)
        return text


def _text_tokens(value: Any) -> int:
    """A bound on the tokens of ``value``'s text: a token is at least one byte of UTF-8, and an
    ASCII string's bytes are its characters (anything else: four bytes a character at most)."""
    if isinstance(value, str):
        return len(value) if value.isascii() else 4 * len(value)
    # a tool's definition or a tool call's input: its JSON, \u-escaped, is ASCII
    return len(json.dumps(value, ensure_ascii=True, separators=(",", ":")))


class _Uncountable(Exception):
    """A block the bound can't price by its bytes."""


def _list(value: Any) -> list[Any]:
    """``value`` if it is a list, else nothing (a body of another shape is the upstream's to
    refuse: it can't be cached)."""
    return value if isinstance(value, list) else []


def _inner_tokens(block: Any) -> int:
    """A tool result's block: counted as any block, but never another tool result (the API
    takes none there; so the count never recurses)."""
    if isinstance(block, dict) and block.get("type") == "tool_result":
        raise _Uncountable
    return _block_tokens(block)


def _block_tokens(block: Any) -> int:
    if isinstance(block, str):
        return BLOCK_TOKENS + _text_tokens(block)
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str) or kind not in _TEXT_KINDS:
        raise _Uncountable
    if kind == "tool_result":  # its content: text, or blocks that are not tool results
        inner = block.get("content")
        inner_blocks = inner if isinstance(inner, list) else [inner] if inner is not None else []
        return BLOCK_TOKENS + sum(_inner_tokens(b) for b in inner_blocks)
    if kind == "tool_use":
        return BLOCK_TOKENS + _text_tokens(block.get("name", "")) + _text_tokens(block.get("input", {}))
    if kind == "text":
        return BLOCK_TOKENS + _text_tokens(block.get("text", ""))
    # a thinking block's signature (a redacted one's data) holds the whole thinking, encrypted:
    # its bytes bound what the upstream counts for it, the summary's too
    texts = (block.get("thinking", ""), block.get("signature", ""), block.get("data", ""))
    return BLOCK_TOKENS + sum(_text_tokens(t) for t in texts if isinstance(t, str))


def _has_breakpoint(body: dict[str, Any]) -> bool:
    """A breakpoint anywhere: top level (automatic caching), a system block, a tool or a message
    (its blocks, however deep). The messages are searched from the newest, where translation's
    automatic breakpoint and clients' usual marks are: a long conversation is not walked."""
    if body.get("cache_control") is not None or has_mark(body.get("system")) or has_mark(body.get("tools")):
        return True
    for message in reversed(_list(body.get("messages"))):
        if isinstance(message, dict) and has_mark(message.get("content")):
            return True
    return False


def needs_scope(body: dict[str, Any], min_tokens: int) -> bool:
    """Whether ``body`` (an Anthropic Messages body) can write or read a prompt-cache entry: it
    has a breakpoint, and a bound that never undercounts its tokens reaches ``min_tokens`` (any
    block but text, thinking and tool calls and results, or a built-in tool, counts as reaching
    it). Stops counting as soon as the bound is reached."""
    if not _has_breakpoint(body):
        return False
    total = 0
    try:
        tools = _list(body.get("tools"))
        if tools:
            if any(not isinstance(t, dict) or t.get("type") not in (None, "custom") for t in tools):
                return True
            total += TOOL_PROMPT_TOKENS
            for tool in tools:
                if total >= min_tokens:
                    return True
                total += _text_tokens(tool)
        if "mcp_servers" in body:
            return True  # their tools come from the servers
        system = body.get("system")
        if isinstance(system, str):
            total += _text_tokens(system)
        elif isinstance(system, list):
            total += sum(_block_tokens(b) for b in system)
        for message in _list(body.get("messages")):
            content = message.get("content") if isinstance(message, dict) else None
            total += MESSAGE_TOKENS
            for block in [content] if isinstance(content, str) else _list(content):
                if total >= min_tokens:
                    return True
                total += _block_tokens(block)
    except _Uncountable:
        return True
    return total >= min_tokens


def _longest(ttls: list[dict[str, Any]]) -> dict[str, Any]:
    """The cache_control of the longest TTL among ``ttls`` (1h over 5m, the default)."""
    return next((c for c in ttls if c.get("ttl") == "1h"), ttls[-1])


def _scoped(system: Any, tools: Any, scope: str) -> bool:
    """Whether the body already is as ``scope_cache`` leaves it: its first system block is a text
    block of exactly ``scope`` and no tool holds a breakpoint. Such a prefix starts with this
    organisation's scope whoever put it there (a client that learnt its own scope can only place
    itself in its own organisation's cache); a block that only starts like a scope, or is another
    organisation's, is the client's text."""
    if not (isinstance(system, list) and system and isinstance(system[0], dict)):
        return False
    first = system[0]
    if first.get("type") != "text" or first.get("text") != scope:
        return False
    return not (
        isinstance(tools, list) and any(isinstance(t, dict) and isinstance(t.get("cache_control"), dict) for t in tools)
    )


def scope_cache(body: dict[str, Any], scope: str) -> None:
    """Put ``scope`` (the request's organisation's, ``CacheScopes``) first in ``body``'s system
    prompt (an Anthropic Messages body, changed in place); move the tools' breakpoints onto it.
    Whatever the client's system prompt starts with, the gateway's block goes before it; only a
    body this call already scoped for the same organisation is left as it is (calling it twice
    changes nothing more)."""
    system = body.get("system")
    tools = body.get("tools")
    if _scoped(system, tools, scope):
        return
    block: dict[str, Any] = {"type": "text", "text": scope}
    if isinstance(tools, list):
        moved = [t["cache_control"] for t in tools if isinstance(t, dict) and isinstance(t.get("cache_control"), dict)]
        if moved:
            body["tools"] = [
                {k: v for k, v in t.items() if k != "cache_control"} if isinstance(t, dict) else t for t in tools
            ]
            block["cache_control"] = dict(_longest(moved))
    if system is None or system == "" or system == []:
        body["system"] = [block]
    elif isinstance(system, str):
        body["system"] = [block, {"type": "text", "text": system}]
    elif isinstance(system, list):
        body["system"] = [block, *system]
    # any other value is the upstream's to refuse, as sent
