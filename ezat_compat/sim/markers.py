"""``[[sim:key=value,flag]]`` markers: what the last user message asks of one reply.

The keys and what they do are listed in ``ezat_compat.sim``'s docstring; ``parse_markers``
refuses an unknown key or a bad value with a 400, so a typo in a test is seen. ``args=`` takes a
JSON object and must be the last key of its marker (its JSON may hold commas, not "]]"):
``[[sim:tool=get_weather,args={"city": "Paris"}]]``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ezat_compat.sim.errors import InvalidRequestError

MARKER_RE = re.compile(r"\[\[sim:(.*?)\]\]", re.DOTALL)  # up to the first "]]"
_INT_MARKERS = frozenset({"status", "cut", "error_after", "token_delay_ms", "tools", "words", "thinking_tokens"})
_FLOAT_MARKERS = frozenset({"retry_after", "delay", "stall"})
_FLAG_MARKERS = frozenset({"refusal", "pause", "context", "guardrail"})
_STR_MARKERS = frozenset({"reject", "tool"})  # reject=<path>: a 400 naming that path; tool=<name>: call it
_ARGS_KEY = "args="


@dataclass(frozen=True)
class Markers:
    """What ``[[sim:…]]`` markers in the last user message ask for (None: not asked)."""

    status: int | None = None
    retry_after: float | None = None
    delay: float | None = None
    stall: float | None = None
    cut: int | None = None
    error_after: int | None = None
    token_delay_ms: int | None = None
    tools: int | None = None
    words: int | None = None
    thinking_tokens: int | None = None
    refusal: bool = False
    pause: bool = False
    context: bool = False
    guardrail: bool = False  # a Bedrock guardrail on the request blocks it (no guardrail: nothing)
    reject: str | None = None
    tool: str | None = None
    args: Mapping[str, Any] | None = None


NO_MARKERS = Markers()


def parse_markers(text: str) -> tuple[str, Markers]:
    """Split ``text`` into (text without markers, stripped; the markers it carries).

    Raises ``InvalidRequestError`` for an unknown key or a value of the wrong kind, so a typo in
    a test is seen instead of silently ignored.
    """
    if "[[sim:" not in text:
        return text, NO_MARKERS
    values: dict[str, Any] = {}
    for match in MARKER_RE.finditer(text):
        items, args = _split_args(match.group(1))
        if args is not None:
            values["args"] = args
        for item in items.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, raw = item.partition("=")
            key, raw = key.strip(), raw.strip()
            values[key] = _marker_value(key, raw if sep else None)
    clean = " ".join(MARKER_RE.sub(" ", text).split()) if values else MARKER_RE.sub("", text).strip()
    return clean, Markers(**values)


def _split_args(content: str) -> tuple[str, Mapping[str, Any] | None]:
    """(the marker's other items, its ``args=`` JSON object or None)."""
    at = content.find(_ARGS_KEY)
    if at < 0 or (at > 0 and content[at - 1] not in ", "):
        return content, None
    raw = content[at + len(_ARGS_KEY) :].strip()
    try:
        args = json.loads(raw)
    except (ValueError, RecursionError):  # nested past the recursion limit: no object either
        args = None
    if not isinstance(args, dict):
        raise InvalidRequestError(f"[[sim:…]] marker: `args` must be a JSON object, not {raw!r}")
    return content[:at], args


def _marker_value(key: str, raw: str | None) -> Any:
    if key in _STR_MARKERS and raw:
        return raw
    try:
        if key in _FLAG_MARKERS and raw is None:
            return True
        if key in _INT_MARKERS and raw is not None:
            value: float = int(raw)
        elif key in _FLOAT_MARKERS and raw is not None:
            value = float(raw)
        else:
            raise ValueError(key)
    except ValueError:
        raise InvalidRequestError(f"[[sim:…]] marker: cannot use `{key}` with value {raw!r}") from None
    if not math.isfinite(value):  # "inf", "nan", "1e400": no sleep takes them
        raise InvalidRequestError(f"[[sim:…]] marker: cannot use `{key}` with value {raw!r}")
    if value < 0:
        raise InvalidRequestError(f"[[sim:…]] marker: `{key}` must not be negative")
    return value
