"""The index of a stored response's input (store/input_index.py): each range of items is found
in the stored text, a large item kept apart from its chunk, and a page found through the ids is
the page the whole list gives (the route before the index built every id and searched a list)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ezat_compat.store import input_index
from ezat_compat.store.input_index import CHUNK_BYTES, PAUSE_EVERY, InputIndex, StoredInput, id_line, stored_input
from ezat_compat.translate.item_references import item_key
from ezat_compat.translate.responses_items import input_item_id

KEY = item_key("resp_0b7e8b8e-6d5c-4c2e-9a51-0c1f2a3b4c5d")
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "plain"},
    {"id": "dup", "type": "message", "role": "user", "content": "Tōkyō \U0001f600 \u2028"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"id": "dup", "type": "function_call_output", "call_id": "c1", "output": "a\ud800b"},
    {"id": 5, "role": "assistant", "content": "int id"},
    {"role": "user", "content": [{"type": "input_text", "text": '"quoted" \\ \n line'}]},
    {"id": f"in_{KEY}002", "role": "user", "content": "an own id like a made one"},
    {"id": 'a "quoted"\nid', "role": "user", "content": "odd id"},
    {"role": "assistant", "content": "last"},
]
CURSORS = [
    None,
    "nope",
    "dup",
    "5",
    'a "quoted"\nid',
    f"in_{KEY}2",
    *(f"in_{KEY}{n:03d}" for n in (0, 2, 5, 8, 9)),
]


def roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def index_of(items: list[dict[str, Any]]) -> InputIndex:
    kept = stored_input(items, 0)
    return InputIndex(kept.chunks, kept.ids, start=0, count=kept.count, key=KEY)


def read(index: InputIndex, kept: StoredInput, lo: int, hi: int) -> list[Any]:
    """What the store reads for own items [lo, hi): the span's text (from the parts that hold
    it, when the text is kept in parts), then the items in it."""
    begin, end, first = index.span(lo, hi)
    if index.parted:
        low, high, at = index.parts_of(begin, end)
        piece = "".join(kept.parts[low : high + 1])[begin - at : end - at]
    else:
        piece = kept.text[begin:end]
    place = index.start + lo - first
    return json.loads(f"[{piece}]")[place : place + hi - lo]


@pytest.fixture(
    params=[(64, 10**6), (2, 10**6), (2, 40), (1, 1)], ids=["one-chunk", "chunks-of-2", "parts", "one-a-part"]
)
def chunked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Chunks of 64 items or 2, the text whole or in parts (of 40 characters, of one chunk)."""
    items, chars = request.param
    monkeypatch.setattr(input_index, "CHUNK_ITEMS", items)
    monkeypatch.setattr(input_index, "INLINE_CHARS", chars)
    monkeypatch.setattr(input_index, "PART_CHARS", chars)
    return int(items)


def test_every_range_of_items_is_found_in_the_text(chunked: int) -> None:
    kept = stored_input(ITEMS, 0)
    index = InputIndex(kept.chunks, kept.ids, start=0, count=kept.count, key=KEY)
    assert json.loads(kept.text) == roundtrip(ITEMS)
    assert index.parted is bool(kept.parts) and (not kept.parts or "".join(kept.parts) == kept.text)
    for lo in range(len(ITEMS)):
        for hi in range(lo + 1, len(ITEMS) + 1):
            assert read(index, kept, lo, hi) == roundtrip(ITEMS[lo:hi]), (lo, hi)


def test_a_long_text_is_kept_in_parts_of_about_part_chars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_index, "INLINE_CHARS", 1000)
    monkeypatch.setattr(input_index, "PART_CHARS", 1000)
    items = [{"role": "user", "content": f"{n:04d}" + "y" * 100} for n in range(640)]  # ~80 kB, 10 chunks
    kept = stored_input(items, 0)
    assert "".join(kept.parts) == kept.text and len(kept.parts) == 10
    assert all(len(part) < 1000 + 64 * 150 for part in kept.parts)
    assert stored_input(items[:5], 0).parts == []  # a short one stays whole


def test_the_size_is_the_texts_utf8_bytes_and_the_ids_a_line_each() -> None:
    kept = stored_input(ITEMS, 0)
    assert kept.size == len(kept.text.encode()) and kept.count == len(ITEMS)
    lines = kept.ids.split("\n")[1:-1]
    assert [json.loads(line) if line else None for line in lines] == [item.get("id") for item in ITEMS]


def test_a_stored_conversation_indexes_its_own_input(chunked: int) -> None:
    kept = stored_input(ITEMS, 4)
    index = InputIndex(kept.chunks, kept.ids, start=4, count=kept.count, key=KEY)
    assert index.count == 5
    assert read(index, kept, 0, 5) == roundtrip(ITEMS[4:])
    assert read(index, kept, 2, 3) == roundtrip(ITEMS[6:7])
    assert index.page(descending=False, limit=2, after=f"in_{KEY}001", before=None) == (2, 4, True)


def test_a_large_item_is_kept_apart_from_its_chunk() -> None:
    items = [{"role": "user", "content": "small"}, {"role": "user", "content": "x" * CHUNK_BYTES}, {"role": "user"}]
    kept = stored_input(items, 0)
    index = InputIndex(kept.chunks, kept.ids, start=0, count=3, key=KEY)
    begin, end, _ = index.span(0, 1)
    assert end - begin < 100  # the small item's page doesn't read the large one
    assert index.parted and index.parts_of(begin, end)[:2] == (0, 0)
    assert read(index, kept, 2, 3) == [{"role": "user"}]
    assert read(index, kept, 0, 3) == items


def test_indexing_a_long_input_pauses() -> None:
    paused: list[int] = []
    stored_input([{"role": "user", "content": "x"}] * (64 * PAUSE_EVERY * 3), 0, lambda: paused.append(1))
    assert len(paused) == 3


def test_plain_ids_are_quoted_without_the_encoder() -> None:
    for value in ("msg_1", "a b", 'q"', "back\\slash", "tab\t", "ü", "\x7f", 5, None, {"a": 1}):
        assert json.loads(id_line(value)) == value and "\n" not in id_line(value)


def whole_list(descending: bool, limit: int, after: str | None, before: str | None) -> tuple[list[int], bool]:
    """The page as the route found it before the index: every listed id built, searched by index."""
    numbered = list(enumerate(ITEMS))
    if descending:
        numbered.reverse()
    ids = [input_item_id(item, KEY, n) for n, item in numbered]
    if after is not None:
        start = ids.index(after) + 1 if after in ids else len(ids)
        numbered, ids = numbered[start:], ids[start:]
    if before is not None and before in ids:
        end = ids.index(before)
        numbered, ids = numbered[:end], ids[:end]
    return [n for n, _ in numbered[:limit]], len(numbered) > limit


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize("limit", [1, 2, 3, 100])
def test_a_page_from_the_index_is_the_page_of_the_whole_list(chunked: int, descending: bool, limit: int) -> None:
    index = index_of(ITEMS)
    for after in CURSORS:
        for before in CURSORS:
            lo, hi, more = index.page(descending=descending, limit=limit, after=after, before=before)
            places = list(range(hi - 1, lo - 1, -1)) if descending else list(range(lo, hi))
            assert (places, more) == whole_list(descending, limit, after, before), (after, before)


@pytest.mark.parametrize("count", [0, 1, len(ITEMS)])
def test_a_short_input_is_indexed_as_any_other(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    short = stored_input(ITEMS[:count], 0)
    monkeypatch.setattr(input_index, "_short", lambda context: None)
    assert short == stored_input(ITEMS[:count], 0)
