"""Prompt-cache isolation between organisations (``[gateway] isolate_prompt_cache``).

Every organisation of a gateway sends through the same upstream accounts, and the upstream's
prompt cache is the account's: a prefix one organisation sent is read from the cache by any
other that sends the same prefix, and ``cached_tokens`` / ``cache_read_input_tokens`` tell the
second that the first sent it (an oracle on another tenant's prompts).

With isolation on, every upstream body starts its cached prefix with the organisation's own
scope: a first system block ``cache scope <16 hex>`` (the organisation's digest). The cache is
keyed by the whole prefix in the order tools, system, messages, so:

- a request's prefix at any system or message breakpoint starts with its organisation's scope
  block: another organisation's requests start with theirs, never reach it, and read nothing
  of it (the scope is not a secret: no request can put another scope before its own);
- a breakpoint on a tool (its prefix is tools alone, ahead of any system block) is moved onto
  the scope block: the prefix cached there is the tools and the scope, as long for the
  organisation itself and closed to the others (the longest TTL among the tools' wins).

The cost: the scope block's ~12 input tokens on every request, and cache entries no longer
shared between organisations (each writes its own). Requests of one organisation still share
theirs across keys, nodes and deployments of one account.
"""

from __future__ import annotations

import hashlib
from typing import Any

SCOPE_PREFIX = "cache scope "


def cache_scope(org_id: int) -> str:
    """The organisation's scope text: stable across workers, nodes and restarts."""
    digest = hashlib.sha256(f"ezat-prompt-cache-scope:{org_id}".encode()).hexdigest()[:16]
    return SCOPE_PREFIX + digest


def _longest(ttls: list[dict[str, Any]]) -> dict[str, Any]:
    """The cache_control of the longest TTL among ``ttls`` (1h over 5m, the default)."""
    return next((c for c in ttls if c.get("ttl") == "1h"), ttls[-1])


def scope_cache(body: dict[str, Any], scope: str) -> None:
    """Put ``scope`` first in ``body``'s system prompt (an Anthropic Messages body, changed in
    place); move the tools' breakpoints onto it. A body that already starts with a scope block
    (a failover re-sends the same body) is left as it is."""
    system = body.get("system")
    if isinstance(system, list) and system and isinstance(system[0], dict):
        text = system[0].get("text")
        if isinstance(text, str) and text.startswith(SCOPE_PREFIX):
            return
    block: dict[str, Any] = {"type": "text", "text": scope}
    tools = body.get("tools")
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
