"""orjson where its result is the standard library's exactly, the standard library elsewhere.

On a stream's per-event path (each upstream event parsed, each chunk written) orjson, a
compiled and well-kept JSON library, does the work several times faster than ``json``. It is
used only where it can't be told apart from ``json`` (tests/unit/test_jsonfast.py holds every
integer and float form ``json`` accepts, and the boundaries of orjson's integers):

- ``loads``: orjson refuses what ``json`` reads its own way (NaN, Infinity, numbers past a
  double's range, lone surrogate escapes): ``json.loads`` reads those, and raises as before on
  what isn't JSON. The one input both read but differently is an integer outside orjson's
  range, ``-2**63`` to ``2**64 - 1`` (a float to orjson): such an integer has at least 19
  digits (``-9223372036854775809``), so text holding a run of 19 digits goes to ``json``.
- ``dumps_compact``: the bytes of ``json.dumps(value, ensure_ascii=False, separators=(",",
  ":"))`` for values made of str, int, float, bool, None, lists and dicts with str keys.
  What orjson refuses (a lone surrogate, an int outside its range, a key that isn't a str) goes
  to ``json``, which raises as it would be asked to. The two write a finite float alike except
  below 1e-4 in magnitude: orjson writes ``0.00001`` for ``1e-05`` and ``1e-9`` for ``1e-09``.
  Those forms hold ``0.0000``, or ``e-`` and one digit ending the number, so orjson's output
  holding either (a rare number, or a string such as "0.00001") is written again by ``json``.
  orjson writes NaN and ±Infinity as ``null`` where ``json`` writes ``NaN``/``Infinity``: a
  value that may hold floats (``floats=True``) whose output holds ``null`` is written by
  ``json`` too.
"""

from __future__ import annotations

import json
import re
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; the standard library still gives the same results
    orjson = None  # type: ignore[assignment]

# A run of 19 ASCII digits (JSON numbers have no others): every integer outside orjson's range
# has one. Written so that the regex engine scans for its first digit, twice as fast as
# ``\d{19}`` on a stream event.
_LONG_NUMBER = re.compile(r"[0-9][0-9]{18}")
# Where orjson's output could differ from json's: a number below 1e-4 in magnitude (the only
# floats the two write differently; see ``dumps_compact``). Two patterns, each starting with a
# literal: the regex engine then searches for that literal, twice as fast as ``bytes.__contains__``
# with such a short needle (1.2 us against 2.3 us on 1.7 kB); one alternation would cost the
# engine a try at every byte (1.2 us on a 200-byte event). orjson's one-digit negative exponent
# ends its number (a ``,``, ``}``, ``]`` or the end follows), which the e-6 of an id such as
# resp_…5e-6c3f… never does.
_SMALL_EXPONENT = re.compile(rb"e-[0-9](?:[,}\]]|\Z)")
_FOUR_ZEROS = re.compile(rb"0\.0000")
_NULL = re.compile(rb"null")  # where orjson may have written a NaN or an infinity
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_ASCII = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False)


def loads(text: str) -> Any:
    """``json.loads(text)``, faster."""
    if orjson is not None and not _LONG_NUMBER.search(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False)


def sse_data(value: Any) -> bytes:
    """``data: {json}\n\n`` for a float-free value (a chat chunk): ``translate.stream.encode_chunk``'s
    bytes (a lone surrogate escaped as it escapes it), faster."""
    try:
        return b"data: " + dumps_compact(value, floats=False) + b"\n\n"
    except UnicodeEncodeError:  # a lone surrogate from upstream JSON: escaped, as encode_chunk does
        return b"data: " + _ASCII_ENCODER.encode(value).encode() + b"\n\n"


def dumps_compact(value: Any, *, floats: bool = True, finite: bool = False) -> bytes:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()``, faster;
    ``UnicodeEncodeError`` for a lone surrogate, as that encode would raise.
    ``floats=False``: the caller vouches that ``value`` holds no float (an event it built of
    text and counts), and the look for orjson's other notations (~1 us a kilobyte) is skipped.
    ``finite=True``: the caller vouches that its floats are finite (numbers it computed), so
    a ``null`` can't stand for a NaN and isn't looked for."""
    if orjson is not None:
        try:
            out: bytes = orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError: a surrogate, an int past 64 bits, a key not a str
            pass
        else:
            if not floats or _exact(out, finite):
                return out
    return _COMPACT.encode(value).encode()


def _exact(out: bytes, finite: bool = False) -> bool:
    """orjson's ``out`` is ``json``'s too: it holds no number written in orjson's other notation,
    and no ``null`` that could stand for a NaN or an infinity."""
    return not _FOUR_ZEROS.search(out) and not _SMALL_EXPONENT.search(out) and (finite or not _NULL.search(out))


def encode_json(value: Any, *, floats: bool = True) -> bytes:
    """A reply body or event's JSON: compact UTF-8, non-ASCII kept as is, a lone surrogate (from
    upstream) escaped, as ``json.dumps(value, separators=(",", ":"))`` escapes it; ``floats``
    as for ``dumps_compact``."""
    try:
        return dumps_compact(value, floats=floats)
    except UnicodeEncodeError:
        return _ASCII.encode(value).encode()
