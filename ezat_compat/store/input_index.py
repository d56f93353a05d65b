"""The index a stored response keeps of its input (store/responses.py), so that ``GET
…/responses/{id}/input_items`` reads one page of it, never the whole input (docs/responses.md,
"Stored responses").

Written once, when the response is stored (``stored_input``):

- ``text``: the items as one JSON array, encoded a chunk of ``CHUNK_ITEMS`` items at a time (a
  chunk whose JSON is over ``CHUNK_BYTES`` is split into single items, so a page never reads
  more than a chunk of items beside its own, nor a large item it doesn't list);
- ``parts``: a ``text`` over ``INLINE_CHARS`` is also cut, at chunk starts, into parts of about
  ``PART_CHARS`` (the store keeps each in a row of its own: a database reads a value whole, so a
  page of a 30 MB input would read 30 MB); a shorter one has none and is read with ``substr``;
- ``chunks``: a table of the chunks, four ``FIELD_DIGITS``-digit hex numbers each: the place of
  its first item, where its JSON starts in ``text`` (characters), where that item's line starts
  in ``ids``, and its part; then one entry past the end, whose part is how many parts there are;
- ``ids``: one line per item of the response's own input: its own ``id`` (``id_line``), or empty
  when the list gives it one (``translate/responses_items.input_item_id``, made of its place).

Read (``InputIndex``): ``span`` says which characters of ``text`` (and which parts) hold a range
of items; ``page`` finds ``after`` / ``before`` with ``str.find`` and ``str.count`` on ``ids``
(C loops over the text, never a list of ids) and says which items a page lists, exactly as the
whole list paged would.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ezat_compat.jsonfast import encode_json
from ezat_compat.translate.responses_items import INPUT_ID_PREFIX

CHUNK_ITEMS = 64  # items encoded (and read) together
CHUNK_BYTES = 256 * 1024  # a chunk's JSON past this is kept item by item
INLINE_CHARS = 256 * 1024  # a text up to this stays whole (a substr of it costs well under a millisecond)
PART_CHARS = 256 * 1024  # a longer one is cut into parts of about this (a large item alone may be more)
PAUSE_EVERY = 4  # chunks encoded between two calls of the caller's ``pause`` (256 items)
FIELD_DIGITS = 8  # hex digits of one number of the chunk table (32 bits)
_FIELDS = 4
_TYPE = "I"  # array type code of the chunk table's numbers: 4 bytes on every platform CPython supports
assert array(_TYPE).itemsize * 2 == FIELD_DIGITS


def _no_pause() -> None:
    """Indexing alone needs no pause."""


def id_line(value: Any) -> str:
    """An item's own id as ``ids`` holds it (and as a cursor is looked for): its JSON, which holds
    no line break; a plain ASCII string is quoted without the encoder."""
    if isinstance(value, str) and value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return encode_json(value).decode()


@dataclass(frozen=True, slots=True)
class StoredInput:
    """A conversation's items as one row keeps them (the module docstring): ``size`` is the
    UTF-8 bytes of ``text``; ``count`` the response's own items (the last ones)."""

    text: str
    size: int
    count: int
    chunks: str
    ids: str
    parts: list[str]


def _length(data: bytes) -> int:
    """Characters of UTF-8 ``data``."""
    return len(data) if data.isascii() else len(data.decode())


def _table(entries: list[tuple[int, int, int]], text: str) -> tuple[array[int], list[str]]:
    """The chunk table of ``entries`` (place, text offset, line offset; the last one past the
    end), with each chunk's part, and the parts of ``text`` (none when it is short)."""
    table = array(_TYPE)
    parts: list[str] = []
    cut = 0  # where the current part starts in ``text``
    for place, at, line in entries[:-1]:
        if len(text) > INLINE_CHARS and at - cut >= PART_CHARS:
            parts.append(text[cut:at])
            cut = at
        table.extend((place, at, line, len(parts)))
    if len(text) > INLINE_CHARS:
        parts.append(text[cut:])
    table.extend((*entries[-1], len(parts)))
    return table, parts


def _short(context: Sequence[Any]) -> StoredInput | None:
    """``stored_input`` of an input of one chunk whose JSON is short (most requests), the same
    index in fewer steps; None for any other."""
    data = encode_json(context)
    if len(data) > min(CHUNK_BYTES, INLINE_CHARS):
        return None
    lines = []
    for item in context:
        own = item.get("id") if isinstance(item, dict) else None
        lines.append(id_line(own) if own is not None else "")
    ids = "\n" + "".join(line + "\n" for line in lines)
    text = data.decode()
    table = array(_TYPE, (0, 1, 0, 0, len(context), len(text), len(ids) - 1, 0) if context else (0, 1, 0, 0))
    if sys.byteorder == "little":
        table.byteswap()
    return StoredInput(text, len(data), len(context), table.tobytes().hex(), ids, [])


def stored_input(context: Sequence[Any], start: int, pause: Callable[[], None] = _no_pause) -> StoredInput:
    """Index ``context``, whose items from ``start`` are the response's own input: a JSON
    encoding per chunk, ``pause`` called every ``PAUSE_EVERY`` chunks (a 200,000-item input
    shares the worker's loop)."""
    if start == 0 and len(context) <= CHUNK_ITEMS:
        short = _short(context)
        if short is not None:
            return short
    bodies: list[bytes] = []
    entries: list[tuple[int, int, int]] = []
    lines: list[str] = []
    at, line_at, done = 1, 0, 0  # after "["; the next line's break in ``ids``; chunks encoded
    for begin, end in ((0, start), (start, len(context))):
        for first in range(begin, end, CHUNK_ITEMS):
            chunk = context[first : min(first + CHUNK_ITEMS, end)]
            done += 1
            if done % PAUSE_EVERY == 0:
                pause()
            data = encode_json(chunk)
            pieces = [(first, data)]
            if len(data) > CHUNK_BYTES and len(chunk) > 1:
                pieces = [(first + i, encode_json([item])) for i, item in enumerate(chunk)]
            starts = [0] * len(chunk)  # where each item's line starts in ``ids``
            if first >= start:
                for i, item in enumerate(chunk):
                    own = item.get("id") if isinstance(item, dict) else None
                    line = id_line(own) if own is not None else ""
                    starts[i] = line_at
                    lines.append(line)
                    line_at += len(line) + 1
            for place, piece in pieces:
                body = piece[1:-1]
                entries.append((place, at, starts[place - first]))
                bodies.append(body)
                at += _length(body) + 1
    entries.append((len(context), at, line_at))
    data = b"[" + b",".join(bodies) + b"]"
    text = data.decode()
    table, parts = _table(entries, text)
    if sys.byteorder == "little":
        table.byteswap()  # big-endian: the hex digits read as the numbers
    ids = "\n" + "".join(line + "\n" for line in lines)
    return StoredInput(text, len(data), len(context) - start, table.tobytes().hex(), ids, parts)


class InputIndex:
    """The read side of a ``StoredInput``: its chunk table and ``ids`` (``ids`` may be "" when no
    cursor is looked for), for the response whose ``item_key`` is ``key``; ``start`` and
    ``count`` as stored."""

    __slots__ = ("count", "ids", "in_parts", "lines", "places", "prefix", "start", "texts")

    def __init__(self, chunks: str, ids: str, *, start: int, count: int, key: str) -> None:
        table = array(_TYPE)
        table.frombytes(bytes.fromhex(chunks))
        if sys.byteorder == "little":
            table.byteswap()
        self.places, self.texts = table[0::_FIELDS], table[1::_FIELDS]
        self.lines, self.in_parts = table[2::_FIELDS], table[3::_FIELDS]
        self.ids = ids
        self.start = start
        self.count = count
        self.prefix = f"{INPUT_ID_PREFIX}{key}"

    @property
    def parted(self) -> bool:
        """The text is kept in parts (else whole)."""
        return self.in_parts[-1] > 0

    def span(self, lo: int, hi: int) -> tuple[int, int, int]:
        """Own items [lo, hi) (``hi > lo``) lie in ``text[begin:end]`` (whole items, separated by
        commas): (begin, end, the place in the conversation of the first item there)."""
        a, b = self.start + lo, self.start + hi
        first = bisect_right(self.places, a) - 1
        last = bisect_left(self.places, b)
        return self.texts[first], self.texts[last] - 1, self.places[first]

    def parts_of(self, begin: int, end: int) -> tuple[int, int, int]:
        """The parts that hold ``text[begin:end]`` (a ``span``), as [first, last], and where the
        first starts in ``text``."""
        first = bisect_right(self.texts, begin) - 1
        last = bisect_left(self.texts, end) - 1
        part = self.in_parts[first]
        at = bisect_left(self.in_parts, part)  # the part's first chunk
        return part, self.in_parts[last], 0 if part == 0 else self.texts[at]

    def _line(self, n: int) -> int:
        """Where own item ``n``'s line starts in ``ids`` (the line break before it)."""
        place = self.start + n
        chunk = bisect_right(self.places, place) - 1
        at = self.lines[chunk]
        for _ in range(place - self.places[chunk]):  # fewer than CHUNK_ITEMS
            at = self.ids.index("\n", at + 1)
        return at

    def _generated(self, cursor: str) -> int | None:
        """The place ``cursor`` names as a listed id made of one (``in_<key><n>``), if any."""
        if not cursor.startswith(self.prefix):
            return None
        digits = cursor[len(self.prefix) :]
        if not (digits.isascii() and digits.isdigit()):
            return None
        n = int(digits)
        return n if n < self.count and f"{n:03d}" == digits else None

    def find(self, cursor: str, descending: bool, after: tuple[int, int] | None = None) -> tuple[int, int] | None:
        """The first item listed as ``cursor`` in the order asked, among those after ``after``
        (an item found before) when given: (its place, where its line starts), or None."""
        ids = self.ids
        needle = f"\n{id_line(cursor)}\n"
        if descending:
            at = ids.rfind(needle, 0, after[1] + 1 if after else len(ids))
        else:
            at = ids.find(needle, after[1] + 1 if after else 0)
        found = [(ids.count("\n", 0, at), at)] if at >= 0 else []
        n = self._generated(cursor)
        if n is not None and (after is None or (n < after[0] if descending else n > after[0])):
            line = self._line(n)
            if ids.startswith("\n\n", line):  # no id of its own: the list made this one
                found.append((n, line))
        if not found:
            return None
        return max(found) if descending else min(found)

    def page(self, *, descending: bool, limit: int, after: str | None, before: str | None) -> tuple[int, int, bool]:
        """The page's own items as [lo, hi), and whether more follow: the list in the order
        asked, after the first item listed as ``after`` (an unknown id: nothing), up to the first
        one listed as ``before`` after it (an unknown one: no bound), ``limit`` items."""
        count = self.count
        start, end = 0, count  # in the order asked
        found = None
        if after is not None:
            found = self.find(after, descending)
            if found is None:
                start = count
            else:
                start = count - found[0] if descending else found[0] + 1
        if before is not None and start < count:
            bound = self.find(before, descending, found)
            if bound is not None:
                end = count - 1 - bound[0] if descending else bound[0]
        stop = min(end, start + limit)
        more = end - start > limit
        if stop <= start:
            return 0, 0, more
        return (count - stop, count - start, more) if descending else (start, stop, more)
