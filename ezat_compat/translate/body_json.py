"""JSON bodies in and out, for every dialect.

``decode_body`` turns the raw request body into JSON data or a ``BodyError`` (a 400 the dialect
words, naming the part where there is one); ``decode_json_text`` applies the same rules to JSON
held in a string field (a tool call's ``arguments``). Refused:

- an empty body, text that is not JSON, bytes that are not UTF-8 (surrogates encoded as bytes
  included; UTF-16 and UTF-32 too, which RFC 8259 section 8.1 excludes from exchanged JSON);
- ``NaN``, ``Infinity`` and ``-Infinity`` (Python's parser takes them, RFC 8259 section 6 does
  not: no JSON parser upstream would) and numbers too large for a double (``1e400``);
- nesting deeper than ``MAX_DEPTH`` arrays and objects (every walk over a body — the estimate,
  the schemas, the encoder — recurses once per level; the bound keeps them far from Python's
  recursion limit whatever the stack);
- a lone UTF-16 surrogate (``"\\ud800"``) in a string or a key: valid JSON, but no Unicode text,
  so nothing could send it on as UTF-8.

Duplicate keys: the last one wins, as in JavaScript's ``JSON.parse`` and Python's ``json``; the
gateway validates, estimates and forwards only that value (bodies are re-encoded). Unknown keys
are the dialects' business. The depth and surrogate walks only run when the raw text could hold
what they look for (more brackets than ``MAX_DEPTH``, a ``\\uD8..``-``\\uDF..`` escape), so
ordinary bodies pay two C-level scans.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

MAX_DEPTH = 200  # nested arrays and objects; deeper than any real request, tool schemas included
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

TOO_DEEP = f"is nested more than {MAX_DEPTH} levels deep"
NOT_FINITE = "NaN, Infinity and -Infinity are not valid JSON numbers"
SURROGATE = "contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode text."


WALK_PAUSE_EVERY = 4096  # values walked between two cooperative pauses


class BodyError(Exception):
    """The body can't be used; ``path`` names the part (empty for the whole body)."""

    def __init__(self, message: str, path: Sequence[str | int] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = tuple(path)


class _NotFiniteError(ValueError):
    pass


def _refuse_constant(name: str) -> float:
    raise _NotFiniteError(NOT_FINITE)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotFiniteError(f"the number {text[:40]} is too large for a double")
    return value


# Made once: json.loads with hooks builds a decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def _key(key: str) -> str:
    """A key as a path part, printable even when it holds a surrogate."""
    return key.encode("utf-8", "backslashreplace").decode("ascii") if _LONE_SURROGATE.search(key) else key


def no_pause() -> None:
    """The default ``pause`` of a long loop here and in the translators: alone, none is needed."""


def _walk(data: Any, surrogates: bool, pause: Callable[[], None] = no_pause) -> None:
    """Raise ``BodyError`` at the first part nested deeper than ``MAX_DEPTH`` or, when
    ``surrogates``, at the first string or key holding a lone surrogate (depth first, in order).
    Iterative: the walk itself never nears the recursion limit."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    seen = 0
    while stack:
        seen += 1
        if seen % WALK_PAUSE_EVERY == 0:  # a huge body shares the worker's loop
            pause()
        value, path = stack.pop()
        if isinstance(value, str):
            if surrogates and _LONE_SURROGATE.search(value):
                raise BodyError(SURROGATE, path)
            continue
        if isinstance(value, dict):
            if len(path) >= MAX_DEPTH:
                raise BodyError(TOO_DEEP + ".", path[:1])  # the field; the full path would be 200 long
            children: list[tuple[Any, tuple[str | int, ...]]] = []
            for key, item in value.items():
                if surrogates and _LONE_SURROGATE.search(key):
                    raise BodyError(SURROGATE, (*path, _key(key)))
                if isinstance(item, dict | list) or (surrogates and isinstance(item, str)):
                    children.append((item, (*path, key)))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            if len(path) >= MAX_DEPTH:
                raise BodyError(TOO_DEEP + ".", path[:1])  # the field; the full path would be 200 long
            stack.extend(
                (item, (*path, index))
                for index, item in reversed(list(enumerate(value)))
                if isinstance(item, dict | list) or (surrogates and isinstance(item, str))
            )


def _loads(text: str, subject: str) -> Any:
    """``subject`` starts the messages ("The request body "; "" when a path will)."""
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise BodyError(f"{subject}{TOO_DEEP}.") from None
    except ValueError as exc:  # JSONDecodeError, NaN, ints of over 4,300 digits
        raise BodyError(f"{subject}is not valid JSON: {exc}.") from None


def _check(data: Any, depth_possible: bool, surrogates: bool, pause: Callable[[], None] = no_pause) -> Any:
    if depth_possible or surrogates:
        _walk(data, surrogates, pause)
    return data


def decode_body(raw: bytes, pause: Callable[[], None] = no_pause) -> Any:
    """The parsed JSON body; ``BodyError`` when it breaks one of the rules above. ``pause`` is
    called every ``WALK_PAUSE_EVERY`` values of the rules' walk (a worker's cooperative yield)."""
    if not raw:
        raise BodyError("The request body is empty; send a JSON object.")
    try:
        # Strict UTF-8 (a BOM is skipped): json.loads(bytes) would take UTF-16 and UTF-32, and
        # decode a surrogate's bytes (ED A0 80) "surrogatepass" into a lone surrogate.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BodyError(f"The request body is not valid UTF-8 text: {exc.reason} at byte {exc.start}.") from None
    data = _loads(text, "The request body ")
    depth_possible = text.count("[") + text.count("{") > MAX_DEPTH
    return _check(data, depth_possible, _SURROGATE_ESCAPE.search(text) is not None, pause)


def decode_json_text(text: str) -> Any:
    """JSON held in a string field, under the body's rules; ``BodyError`` paths are inside it."""
    data = _loads(text, "")
    depth_possible = text.count("[") + text.count("{") > MAX_DEPTH
    surrogates = _SURROGATE_ESCAPE.search(text) is not None or _LONE_SURROGATE.search(text) is not None
    return _check(data, depth_possible, surrogates)
