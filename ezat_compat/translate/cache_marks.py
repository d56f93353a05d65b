"""The ``cache_control`` marks a request holds, wherever they are (one walker for the thread's
history breakpoint and the cache scope's decision)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# The keys under which a request holds content blocks (the SDK's ``KEYS_THAT_HOLD_BLOCKS``):
# cache_control is looked for and removed only there, so a tool's free-form ``input`` stays as is.
KEYS_THAT_HOLD_BLOCKS = frozenset(("content", "source", "tool", "definition", "tool_references"))


def cache_marks(value: Any) -> Iterator[Any]:
    """Every ``cache_control`` value (not None) in ``value`` (a system prompt, tools, messages or
    a block), in order, under the keys that hold blocks, however deep. Lazy: ``next`` stops at
    the first."""
    if isinstance(value, dict):
        mark = value.get("cache_control")
        if mark is not None:
            yield mark
        for k, v in value.items():
            if k in KEYS_THAT_HOLD_BLOCKS:
                yield from cache_marks(v)
    elif isinstance(value, list):
        for item in value:
            yield from cache_marks(item)


def has_mark(value: Any) -> bool:
    """Whether ``value`` holds any ``cache_control`` mark: ``cache_marks``' first, walked with a
    stack rather than generators (a request without marks is walked whole, on the hot path)."""
    stack = [value]
    push, pop = stack.append, stack.pop
    while stack:
        item = pop()
        if isinstance(item, dict):
            if item.get("cache_control") is not None:
                return True
            for key, inner in item.items():
                if key in KEYS_THAT_HOLD_BLOCKS and isinstance(inner, (dict, list)):
                    push(inner)
        elif isinstance(item, list):
            stack.extend(item)
    return False
