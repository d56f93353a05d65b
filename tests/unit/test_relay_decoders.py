"""The stream decoders fed as the body arrives (``StreamDecoder``: ``upstream/sse.SSEDecoder``,
Bedrock's ``EventStreamDecoder``): the stream writer reads the upstream itself and hands each
read's bytes in, so a decoder must give back exactly the events those bytes complete, keep what
is still arriving, and never give an event the body's end cut off."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from ezat_compat.domain import Deployment
from ezat_compat.sim import clouds
from ezat_compat.upstream.providers import make_provider
from ezat_compat.upstream.providers.bedrock import EventStreamDecoder
from ezat_compat.upstream.sse import EventTooLargeError, SSEDecoder, event_end, iter_sse
from tests.support.deployments import BEDROCK

FIXTURE = Path(__file__).parent.parent / "fixtures" / "anthropic_stream_tools.sse"


def test_each_feed_gives_the_events_its_bytes_complete_at_every_split() -> None:
    raw = FIXTURE.read_bytes()
    expected = list(iter_sse([raw]))
    assert len(expected) > 10
    for cut in range(0, len(raw) + 1, 7):
        decoder = SSEDecoder()
        first, second = decoder.feed(raw[:cut]), decoder.feed(raw[cut:])
        assert first == list(iter_sse([raw[:cut]])), cut  # as soon as they end, none held back
        assert first + second == expected, cut
        assert decoder.end() == []


def test_a_fast_path_read_of_whole_events_holds_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: a\ndata: 1\n\nevent: b\ndata: 2\n\n") == [("a", "1"), ("b", "2")]
    assert decoder.feed(b"data: 3\n\n") == [("message", "3")]


@pytest.mark.parametrize(
    ("chunks", "events", "at_end"),
    [
        pytest.param([b"data: x\n"], [], [], id="unterminated-dropped-at-the-end"),
        pytest.param([b"data: x\r\r"], [], [("message", "x")], id="cr-cr-at-the-end-known-only-then"),
        pytest.param([b"data: x\r\r", b"data: y\n\n"], [("message", "x"), ("message", "y")], [], id="cr-cr-then-more"),
        pytest.param([b"data: x\r\n\r", b"\n"], [("message", "x")], [], id="crlf-crlf-split-between-reads"),
        pytest.param([b"data: x\n", b"\ndata: y"], [("message", "x")], [], id="lf-lf-split-then-a-cut-event"),
    ],
)
def test_the_body_end_completes_only_what_ends_there(
    chunks: list[bytes], events: list[tuple[str, str]], at_end: list[tuple[str, str]]
) -> None:
    decoder = SSEDecoder()
    got = [event for chunk in chunks for event in decoder.feed(chunk)]
    assert (got, decoder.end()) == (events, at_end)


@pytest.mark.parametrize(
    ("data", "at_end", "end"),
    [
        (b"data: 1\n\n", False, 9),
        (b"data: 1\n\ndata: 2", False, 9),
        (b"data: 1\r\n\r\ndata", False, 11),
        (b"data: 1\r\r", False, -1),  # a CR CR last: an LF may follow (a CR, then a CRLF)
        (b"data: 1\r\r", True, 9),
        (b"data: 1\r\r\ndata", False, -1),  # sseclient-py reads no end there
        (b"data: 1\n\r\n", False, -1),  # nor there (an LF then a CRLF: listed in test_sse_decoder)
    ],
)
def test_event_end_is_where_sseclient_py_ends_an_event(data: bytes, at_end: bool, end: int) -> None:
    assert event_end(data, at_end) == end


def test_a_failure_after_some_events_comes_after_them() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: ok\n\ndata: \xff\n\n") == [("message", "ok")]
    with pytest.raises(UnicodeDecodeError):
        decoder.feed(b"data: later\n\n")


def test_an_event_over_the_cap_breaks_the_stream_after_the_events_before_it() -> None:
    decoder = SSEDecoder(max_event_bytes=50)
    assert decoder.feed(b"data: 1\n\ndata: " + b"x" * 60) == [("message", "1")]
    with pytest.raises(EventTooLargeError):
        decoder.feed(b"x")
    held = SSEDecoder(max_event_bytes=50)
    held.feed(b"data: " + b"x" * 40)
    with pytest.raises(EventTooLargeError, match="larger than 50 bytes"):
        held.feed(b"x" * 20)


EVENTS = [
    {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hé"}},
    {"type": "message_stop"},
]


def test_bedrock_each_feed_gives_the_messages_its_bytes_complete() -> None:
    messages = [clouds.chunk_message(e) for e in EVENTS]
    data = b"".join(messages)
    ends = [sum(len(m) for m in messages[: i + 1]) for i in range(len(messages))]
    expected = [(e["type"], json.dumps(e, separators=(",", ":"), ensure_ascii=False)) for e in EVENTS]
    for cut in range(len(data) + 1):
        decoder = EventStreamDecoder()
        first = decoder.feed(data[:cut])
        assert first == expected[: sum(end <= cut for end in ends)], cut  # as soon as they end
        assert first + decoder.feed(data[cut:]) == expected
        assert decoder.end() == []


def test_bedrock_a_bad_message_breaks_the_stream_after_the_events_before_it() -> None:
    payload = json.dumps({"bytes": base64.b64encode(b"not json").decode()}).encode()
    bad = clouds.encode_message({":event-type": "chunk", ":message-type": "event"}, payload)
    decoder = EventStreamDecoder()
    assert [e for e, _ in decoder.feed(clouds.chunk_message(EVENTS[0]) + bad)] == ["message_start"]
    with pytest.raises(Exception, match="not an Anthropic event"):
        decoder.end()


def test_each_provider_makes_the_decoder_of_its_framing() -> None:
    assert isinstance(make_provider(BEDROCK).decoder(), EventStreamDecoder)
    anthropic = Deployment(name="a", base_url="http://a.test", upstream_model="m", api_key="k")
    assert isinstance(make_provider(anthropic).decoder(), SSEDecoder)


# ---------------------------------------------------------------- a first event given alone


@pytest.mark.parametrize("framing", ["sse", "bedrock"])
def test_most_gives_the_first_event_and_keeps_the_rest_for_the_next_call(framing: str) -> None:
    """``feed(data, 1)``: the stream's first event goes on before the rest of its read is
    decoded; ``feed(b"")`` gives the rest, a further chunk's events come after them, and the
    body's end gives what is still kept."""
    expected = [(e["type"], json.dumps(e, separators=(",", ":"), ensure_ascii=False)) for e in EVENTS]
    if framing == "sse":
        frames = [f"event: {t}\ndata: {d}\n\n".encode() for t, d in expected]
        new: type[SSEDecoder] | type[EventStreamDecoder] = SSEDecoder
    else:
        frames = [clouds.chunk_message(e) for e in EVENTS]
        new = EventStreamDecoder
    whole = b"".join(frames)
    decoder = new()
    assert decoder.feed(whole, 1) == expected[:1]
    assert decoder.feed(b"") == expected[1:]
    assert decoder.feed(b"") == [] and decoder.end() == []
    decoder = new()
    assert decoder.feed(b"".join(frames[:2]), 1) == expected[:1]
    assert decoder.feed(frames[2]) == expected[1:]  # the kept one first, then the new chunk's
    decoder = new()
    assert decoder.feed(whole, 1) == expected[:1]
    assert decoder.end() == expected[1:]


def test_most_keeps_a_failure_after_the_kept_events_for_the_call_after_them() -> None:
    decoder = SSEDecoder()
    good = b'event: ping\ndata: {"type":"ping"}\n\n'
    assert decoder.feed(good + good + b"event: x\ndata: \xff\n\n", 1) == [("ping", '{"type":"ping"}')]
    assert decoder.feed(b"") == [("ping", '{"type":"ping"}')]  # the bytes that aren't UTF-8 come after
    with pytest.raises(UnicodeDecodeError):
        decoder.feed(b"")


def test_the_end_gives_the_kept_events_then_those_the_end_completes() -> None:
    """A body that ends right after a call cut short by ``most``: the kept events, then the one
    the end completes (a ``\\r\\r`` at the very end), then a failure of the kept bytes at the call
    after them."""
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\n\ndata: c\r\r", 1) == [("message", "a")]
    assert decoder.end() == [("message", "b"), ("message", "c")]
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\n\ndata: \xff\n\n", 1) == [("message", "a")]
    assert decoder.end() == [("message", "b")]
    with pytest.raises(UnicodeDecodeError):
        decoder.end()
