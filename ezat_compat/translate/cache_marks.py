"""The ``cache_control`` marks a request holds, wherever they are (one walker for the thread's
history breakpoint and the cache scope's decision)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def rewrite_marks(value: Any, change: Callable[[Any], Any]) -> Any:
    """``value`` with every ``cache_control`` mark under the keys that hold blocks replaced by
    ``change(mark)`` (``None``: the mark taken out): new dicts and lists only along the paths
    that change, ``value`` itself when ``change`` keeps every mark (returns it as it is). A body
    nested past Python's recursion limit is returned as it is (the upstream refuses it anyway)."""
    try:
        return _rewrite(value, change)
    except RecursionError:
        return value


def _rewrite(value: Any, change: Callable[[Any], Any]) -> Any:
    if isinstance(value, dict):
        changed: dict[str, Any] | None = None
        mark = value.get("cache_control")
        if mark is not None:
            new_mark = change(mark)
            if new_mark is not mark:
                changed = {k: v for k, v in value.items() if k != "cache_control"}
                if new_mark is not None:
                    changed["cache_control"] = new_mark
        for key, inner in value.items():
            if key in KEYS_THAT_HOLD_BLOCKS and isinstance(inner, (dict, list)):
                new = _rewrite(inner, change)
                if new is not inner:
                    changed = changed if changed is not None else dict(value)
                    changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list):
        out: list[Any] | None = None
        for i, item in enumerate(value):
            new = _rewrite(item, change)
            if new is not item:
                out = out if out is not None else list(value)
                out[i] = new
        return value if out is None else out
    return value


def _no_ttl(mark: Any) -> Any:
    if isinstance(mark, dict) and "ttl" in mark:
        return {k: v for k, v in mark.items() if k != "ttl"}
    return mark


def without_ttl(value: Any) -> Any:
    """``value`` with the ``ttl`` of every mark taken out (the default, five minutes, in its
    place); ``rewrite_marks``' copying."""
    return rewrite_marks(value, _no_ttl)


def without_marks(value: Any) -> Any:
    """``value`` without any ``cache_control`` mark; ``rewrite_marks``' copying."""
    return rewrite_marks(value, lambda _: None)
