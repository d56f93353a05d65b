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


def without_ttl(value: Any) -> Any:
    """``value`` with the ``ttl`` of every ``cache_control`` mark under the keys that hold blocks
    taken out (the default, five minutes, in its place): new dicts and lists only along the
    paths that change, ``value`` itself when no mark has one. A body nested past Python's
    recursion limit is returned as it is (the upstream refuses such a body anyway)."""
    try:
        return _without_ttl(value)
    except RecursionError:
        return value


def _without_ttl(value: Any) -> Any:
    if isinstance(value, dict):
        changed: dict[str, Any] | None = None
        mark = value.get("cache_control")
        if isinstance(mark, dict) and "ttl" in mark:
            changed = dict(value)
            changed["cache_control"] = {k: v for k, v in mark.items() if k != "ttl"}
        for key, inner in value.items():
            if key in KEYS_THAT_HOLD_BLOCKS and isinstance(inner, (dict, list)):
                new = _without_ttl(inner)
                if new is not inner:
                    changed = changed if changed is not None else dict(value)
                    changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list):
        out: list[Any] | None = None
        for i, item in enumerate(value):
            new = _without_ttl(item)
            if new is not item:
                out = out if out is not None else list(value)
                out[i] = new
        return value if out is None else out
    return value
