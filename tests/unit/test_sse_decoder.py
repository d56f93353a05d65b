"""The upstream SSE decoder: a recorded Anthropic stream split every possible way, then the
WHATWG event-stream rules one row each (as httpx tests its incremental decoders)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezat_compat.errors import GatewayError
from ezat_compat.upstream import sse
from ezat_compat.upstream.sse import SSEDecoder, iter_sse

FIXTURE = Path(__file__).parent.parent / "fixtures" / "anthropic_stream_tools.sse"


def _compact(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _text(index: int, text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def _json(index: int, partial: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": partial},
    }


# What the fixture holds, event by event (the data lines are compact JSON, as Anthropic sends).
FIXTURE_EVENTS: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "model": "claude-sonnet-5-5",
                "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
                "type": "message",
                "role": "assistant",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 472,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 2048,
                    "output_tokens": 2,
                    "service_tier": "standard",
                },
            },
        },
    ),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("ping", {"type": "ping"}),
    ("content_block_delta", _text(0, "Okay, let me check")),
    ("content_block_delta", _text(0, " the weather in Tōkyō (日本)")),
    ("content_block_delta", _text(0, " — it's usually around 20°C")),
    ("content_block_delta", _text(0, " this time of year.")),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {
                "type": "tool_use",
                "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "name": "get_weather",
                "input": {},
            },
        },
    ),
    ("content_block_delta", _json(1, "")),
    ("content_block_delta", _json(1, '{"city": "Tō')),
    ("content_block_delta", _json(1, "kyō, 日")),
    ("content_block_delta", _json(1, '本", "unit"')),
    ("content_block_delta", _json(1, ': "°C"}')),
    ("ping", {"type": "ping"}),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 89},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]
EXPECTED = [(event, _compact(data)) for event, data in FIXTURE_EVENTS]


def decode(chunks: list[bytes]) -> list[tuple[str, str]]:
    decoder = SSEDecoder()
    events: list[tuple[str, str]] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.flush())
    return events


@pytest.fixture(scope="module")
def raw() -> bytes:
    return FIXTURE.read_bytes()


# -- the recorded stream, split every way ---------------------------------------------------


def test_fixture_has_the_hard_parts(raw: bytes):
    """Guards the fixture itself (an editor or a checkout that rewrites line endings breaks it)."""
    assert b"\r\n" in raw
    assert b"\n\n" in raw  # bare LF line endings too
    assert b"\n: " in raw  # a comment line
    assert "°".encode() in raw and "日本".encode() in raw
    assert b"event: ping" in raw


def test_fixture_in_one_chunk(raw: bytes):
    assert decode([raw]) == EXPECTED


def test_fixture_split_at_every_byte_boundary(raw: bytes):
    for cut in range(len(raw) + 1):
        assert decode([raw[:cut], raw[cut:]]) == EXPECTED, f"split at byte {cut}"


def test_fixture_one_byte_at_a_time(raw: bytes):
    assert decode([raw[i : i + 1] for i in range(len(raw))]) == EXPECTED


@pytest.mark.parametrize("seed", range(25), ids=lambda seed: f"seed-{seed}")
def test_fixture_in_random_chunks(raw: bytes, seed: int):
    rnd = random.Random(seed)
    chunks: list[bytes] = []
    i = 0
    while i < len(raw):
        size = rnd.choice((1, 2, 3, rnd.randint(1, 64), rnd.randint(1, 4096)))
        chunks.append(raw[i : i + size])
        i += size
        if rnd.random() < 0.1:
            chunks.append(b"")  # empty reads happen too
    assert decode(chunks) == EXPECTED


def test_events_come_out_as_soon_as_they_end(raw: bytes):
    """Incremental: after each byte, exactly the events that the bytes so far complete are out."""
    decoder = SSEDecoder()
    seen: list[tuple[str, str]] = []
    for i in range(len(raw)):
        seen.extend(decoder.feed(raw[i : i + 1]))
        assert seen == SSEDecoder().feed(raw[: i + 1]), f"after byte {i}"
    assert decoder.flush() == []
    assert seen == EXPECTED


def test_iter_sse(raw: bytes):
    assert list(iter_sse(iter([raw[:100], raw[100:101], raw[101:]]))) == EXPECTED


# -- WHATWG event-stream rules, one row each -------------------------------------------------

M = "message"
RULES: list[tuple[str, list[bytes], list[tuple[str, str]]]] = [
    ("lf-line-endings", [b"event: a\ndata: 1\n\n"], [("a", "1")]),
    ("crlf-line-endings", [b"event: a\r\ndata: 1\r\n\r\n"], [("a", "1")]),
    ("cr-line-endings", [b"event: a\rdata: 1\r\r"], [("a", "1")]),
    ("mixed-line-endings", [b"data: 1\n\r\ndata: 2\r\n\rdata: 3\r\n\n"], [(M, "1"), (M, "2"), (M, "3")]),
    ("crlf-split-across-chunks", [b"data: 1\r", b"\n", b"\r", b"\ndata: 2\n\n"], [(M, "1"), (M, "2")]),
    ("cr-at-chunk-end-then-cr", [b"data: 1\r", b"\rdata: 2\r\r"], [(M, "1"), (M, "2")]),
    ("cr-at-chunk-end-then-text", [b"data: 1\r", b"data: 2\n\n"], [(M, "1\n2")]),
    ("cr-then-empty-chunk-then-lf", [b"data: 1\r", b"", b"\n\n"], [(M, "1")]),
    ("line-split-across-chunks", [b"da", b"ta", b": hel", b"lo\n", b"\n"], [(M, "hello")]),
    ("multi-line-data-joined-with-lf", [b"data: a\ndata: b\ndata: c\n\n"], [(M, "a\nb\nc")]),
    ("empty-data-line-keeps-the-newline", [b"data: a\ndata:\ndata: b\n\n"], [(M, "a\n\nb")]),
    ("data-with-no-value-dispatches-empty", [b"data\n\n"], [(M, "")]),
    ("data-colon-only-dispatches-empty", [b"data:\n\n"], [(M, "")]),
    ("one-leading-space-removed", [b"data:  two spaces\n\n"], [(M, " two spaces")]),
    ("no-space-after-colon", [b"data:x\n\n"], [(M, "x")]),
    ("trailing-space-kept", [b"data: x \n\n"], [(M, "x ")]),
    ("colon-inside-value", [b'data: {"a":"b:c"}\n\n'], [(M, '{"a":"b:c"}')]),
    ("comment-ignored", [b": ping\ndata: x\n: another\n\n"], [(M, "x")]),
    ("bare-colon-comment-ignored", [b":\ndata: x\n\n"], [(M, "x")]),
    ("comment-only-block-not-dispatched", [b": ping\n\n"], []),
    ("event-without-data-not-dispatched", [b"event: ping\n\n"], []),
    ("type-resets-after-a-block-without-data", [b"event: a\n\ndata: x\n\n"], [(M, "x")]),
    ("type-resets-after-dispatch", [b"event: a\ndata: 1\n\ndata: 2\n\n"], [("a", "1"), (M, "2")]),
    ("empty-event-type-is-message", [b"event:\ndata: x\n\n"], [(M, "x")]),
    ("event-field-without-colon-is-message", [b"event\ndata: x\n\n"], [(M, "x")]),
    ("last-event-field-wins", [b"event: a\nevent: b\ndata: x\n\n"], [("b", "x")]),
    ("unknown-field-ignored", [b"foo: bar\ndata: x\n\n"], [(M, "x")]),
    ("field-names-are-case-sensitive", [b"Data: x\nEVENT: y\n\n"], []),
    ("space-before-field-name-ignored", [b" data: x\n\n"], []),
    ("several-blank-lines", [b"\n\n\ndata: x\n\n\n\n"], [(M, "x")]),
    ("unterminated-event-discarded-at-end", [b"data: x\n"], []),
    ("unterminated-line-discarded-at-end", [b"data: x"], []),
    ("bom-at-start-dropped", [b"\xef\xbb\xbfdata: x\n\n"], [(M, "x")]),
    ("bom-split-across-chunks", [b"\xef", b"\xbb", b"\xbfdata: x\n\n"], [(M, "x")]),
    ("bom-later-is-not-dropped", [b"data: x\n\n\xef\xbb\xbfdata: y\n\n"], [(M, "x")]),
    ("multibyte-split-across-chunks", [b"data: \xe6\x97", b"\xa5\xe6", b"\x9c\xac \xc2", b"\xb0\n\n"], [(M, "日本 °")]),
    ("four-byte-char-split", [b"data: \xf0\x9f", b"\x98", b"\x80\n\n"], [(M, "😀")]),
    ("invalid-utf8-replaced", [b"data: a\xffb\n\n"], [(M, "a\ufffdb")]),
    ("truncated-char-before-newline-replaced", [b"data: \xe6\x97", b"\n\n"], [(M, "\ufffd")]),
    (
        "only-cr-and-lf-end-lines",
        ["data: a\u2028b\u2029c\x0bd\x0ce\x1cf\x85g\n\n".encode()],
        [(M, "a\u2028b\u2029c\x0bd\x0ce\x1cf\x85g")],
    ),
    ("nul-in-data-kept", [b"data: a\x00b\n\n"], [(M, "a\x00b")]),
    ("empty-chunks-ignored", [b"", b"data: x\n", b"", b"\n", b""], [(M, "x")]),
]


@pytest.mark.parametrize(("chunks", "expected"), [row[1:] for row in RULES], ids=[row[0] for row in RULES])
def test_whatwg_rule(chunks: list[bytes], expected: list[tuple[str, str]]):
    assert decode(chunks) == expected
    whole = b"".join(chunks)
    assert decode([whole[i : i + 1] for i in range(len(whole))]) == expected, "byte by byte"


@pytest.mark.parametrize(
    ("chunks", "last_event_id"),
    [
        pytest.param([b"id: 7\ndata: x\n\n"], "7", id="id-set"),
        pytest.param([b"id: 7\ndata: x\n\ndata: y\n\n"], "7", id="id-kept-across-events"),
        pytest.param([b"id: 7\n\nid\ndata: y\n\n"], "", id="id-without-value-clears"),
        pytest.param([b"id: 7\n\nid: a\x00b\n\n"], "7", id="id-with-nul-ignored"),
    ],
)
def test_id_field(chunks: list[bytes], last_event_id: str):
    decoder = SSEDecoder()
    for chunk in chunks:
        decoder.feed(chunk)
    assert decoder.last_event_id == last_event_id


@pytest.mark.parametrize(
    ("line", "retry"),
    [
        pytest.param(b"retry: 3000\n", 3000, id="digits"),
        pytest.param(b"retry: 1.5\n", None, id="not-an-integer-ignored"),
        pytest.param(b"retry: -1\n", None, id="sign-ignored"),
        pytest.param("retry: \u0663\n".encode(), None, id="non-ascii-digit-ignored"),
        pytest.param(b"retry:\n", None, id="empty-ignored"),
    ],
)
def test_retry_field(line: bytes, retry: int | None):
    decoder = SSEDecoder()
    assert decoder.feed(line + b"data: x\n\n") == [(M, "x")]
    assert decoder.retry == retry


def test_flush_resets_for_a_new_stream():
    decoder = SSEDecoder()
    assert decoder.feed(b"event: a\ndata: half\n\xe6") == []
    assert decoder.flush() == []
    assert decoder.feed(b"\xef\xbb\xbfdata: new\n\n") == [(M, "new")]


def test_long_line_in_many_chunks():
    payload = b"x" * (1 << 20)
    body = b"event: big\ndata: " + payload + b"\n\n"
    chunks = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    assert decode(chunks) == [("big", payload.decode())]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"data: " + b"x" * 200, id="unterminated-line"),
        pytest.param(b"data: " + b"x" * 60 + b"\n" + (b"data: " + b"x" * 60 + b"\n") * 2, id="many-data-lines"),
    ],
)
def test_event_larger_than_the_cap_is_refused(body: bytes):
    decoder = SSEDecoder(max_event_chars=100)
    with pytest.raises(GatewayError, match="larger than 100 characters"):
        for i in range(0, len(body), 10):
            decoder.feed(body[i : i + 10])


def test_event_at_the_cap_passes():
    decoder = SSEDecoder(max_event_chars=100)
    assert decoder.feed(b"data: " + b"x" * 49 + b"\ndata: " + b"y" * 50 + b"\n\n") == [(M, "x" * 49 + "\n" + "y" * 50)]


# ---------------------------------------------------------------- whole plain events, read at once

LINE_TEXT = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
PLAIN_LINES = st.sampled_from(["", " ", "  x", ":", "a: b", "é ü", "\u2028", "data: d"]) | LINE_TEXT
EXTRA_LINES = st.sampled_from([": comment", "id: 7", "retry: 10", "data: more", "event:", "event", "data"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(PLAIN_LINES, PLAIN_LINES, st.none() | EXTRA_LINES), min_size=1, max_size=5),
    st.sampled_from(["", "\n", "event: x", "\r\n"]),
)
def test_events_read_whole_decode_as_byte_by_byte(events: list[tuple[str, str, str | None]], tail: str) -> None:
    """Events of one ``event:`` and one ``data:`` line read in one chunk (the decoder's short cut
    for them) give what the line rules give, read a byte at a time; so do chunks the short cut
    must leave to the rules (a comment, ``id``, ``retry``, a second data line, a field without
    its space, a partial event, a CR)."""
    text = "".join(
        f"event: {name}\n" + (f"{extra}\n" if extra else "") + f"data: {data}\n\n" for name, data, extra in events
    )
    raw = (text + tail).encode()
    whole, bytewise = SSEDecoder(), SSEDecoder()
    got = whole.feed(raw)
    expected = [pair for i in range(len(raw)) for pair in bytewise.feed(raw[i : i + 1])]
    assert got == expected
    assert (whole.last_event_id, whole.retry) == (bytewise.last_event_id, bytewise.retry)
    assert whole.feed(b"data: next\n\n") == bytewise.feed(b"data: next\n\n")  # the state after: the same


def test_plain_events_take_the_short_cut() -> None:
    raw = b'event: ping\ndata: {"type":"ping"}\n\nevent: message_stop\ndata: \n\n'
    assert SSEDecoder().feed(raw) == [("ping", '{"type":"ping"}'), ("message_stop", "")]
    assert sse._PLAIN_EVENTS.fullmatch(raw.decode())


@pytest.mark.parametrize("before", [b"event: x\n", b"data: half\n", b"data: {"], ids=["type", "data", "line"])
def test_a_half_read_event_keeps_the_line_rules(before: bytes) -> None:
    plain = b'event: ping\ndata: {"type":"ping"}\n\n'
    after = b"data: next\n\n"
    split, whole = SSEDecoder(), SSEDecoder()
    got = split.feed(before) + split.feed(plain) + split.feed(after)
    assert got == whole.feed(before + plain + after)
