"""Anthropic stream events -> OpenAI chunks (Chat Completions reference, "Streaming"): event lists in,
chunk lists out, one scenario per row. Every chunk is also checked against the official
``openai`` SDK's types, and the SDK's own accumulator must rebuild the reply."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ezat_compat.domain import Usage
from ezat_compat.translate.ids import encode_tool_id
from ezat_compat.translate.response import usage_to_openai
from ezat_compat.translate.stream import DONE, StreamTranslator, encode_chunk, encode_error
from ezat_compat.upstream.sse import iter_sse
from tests.support import sdk_types

ID = "chatcmpl-019a3f2e-8c41-7d2b-9e57-3b6f0c1d2a4e"
CREATED = 1793376000
MODEL = "claude-sonnet-5.5"  # what the client sent, alias and all
FIXTURE = Path(__file__).parent.parent / "fixtures" / "anthropic_stream_tools.sse"

Event = tuple[str, dict[str, Any]]

# -- Anthropic events, shaped as the API sends them (checked against the anthropic SDK's types) --


def message_start(input_tokens: int | None = 25, output_tokens: int = 1, **usage: Any) -> Event:
    return (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-5-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": input_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": output_tokens,
                    **usage,
                },
            },
        },
    )


def text_start(index: int) -> Event:
    return (
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
    )


def text(index: int, value: str) -> Event:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": value}},
    )


def tool_start(index: int, tool_id: str, name: str) -> Event:
    return (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        },
    )


def args(index: int, partial: str) -> Event:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}},
    )


def thinking_start(index: int) -> Event:
    return (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
    )


def thinking(index: int, value: str) -> Event:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": value}},
    )


def signature(index: int) -> Event:
    return (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9G"},
        },
    )


def redacted_start(index: int) -> Event:
    return (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"},
        },
    )


def block_stop(index: int) -> Event:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str | None, output_tokens: int = 20, **extra: Any) -> Event:
    delta = {"stop_reason": stop_reason, "stop_sequence": extra.pop("stop_sequence", None)}
    if "stop_details" in extra:
        delta["stop_details"] = extra.pop("stop_details")
    return (
        "message_delta",
        {"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens, **extra}},
    )


def message_stop() -> Event:
    return ("message_stop", {"type": "message_stop"})


def ping() -> Event:
    return ("ping", {"type": "ping"})


def error(kind: str = "overloaded_error", message: str = "Overloaded") -> Event:
    return (
        "error",
        {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"},
    )


def around(*body: Event, stop_reason: str | None = "end_turn") -> list[Event]:
    """A whole stream: message_start, ``body``, message_delta(stop_reason), message_stop."""
    return [message_start(), *body, message_delta(stop_reason), message_stop()]


# -- expected chunks ------------------------------------------------------------------------

ROLE: dict[str, Any] = {"role": "assistant", "content": ""}


def content(value: str) -> dict[str, Any]:
    return {"content": value}


def call_start(index: int, call_id: str, name: str) -> dict[str, Any]:
    return {
        "tool_calls": [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]
    }


def call_args(index: int, partial: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": partial}}]}


def finish(reason: str) -> tuple[dict[str, Any], str]:
    return ({}, reason)


def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {
        "id": ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
    }


@dataclass(frozen=True)
class Row:
    id: str
    events: list[Event]
    deltas: list[dict[str, Any] | tuple[dict[str, Any], str]]  # a bare delta, or (delta, finish_reason)
    # what the openai SDK's accumulator must rebuild: content, [(id, name, arguments)], finish_reason
    content: str | None = None
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    finish_reason: str | None = None
    produced_chars: int = 0


WEATHER_ARGS = ['{"city', '": "Oslo', '"}']
ROWS: list[Row] = [
    Row(
        "text-only",
        around(text_start(0), ping(), text(0, "Hello"), text(0, ""), text(0, ", wörld 日本"), block_stop(0)),
        [ROLE, content("Hello"), content(", wörld 日本"), finish("stop")],
        content="Hello, wörld 日本",
        finish_reason="stop",
        produced_chars=15,
    ),
    Row(
        "one-tool-call",
        around(
            tool_start(0, "toolu_01A09q90qw90lq917835lq9", "get_weather"),
            args(0, ""),
            *(args(0, part) for part in WEATHER_ARGS),
            block_stop(0),
            stop_reason="tool_use",
        ),
        [
            ROLE,
            call_start(0, "toolu_01A09q90qw90lq917835lq9", "get_weather"),
            *(call_args(0, part) for part in WEATHER_ARGS),
            finish("tool_calls"),
        ],
        calls=[("toolu_01A09q90qw90lq917835lq9", "get_weather", '{"city": "Oslo"}')],
        finish_reason="tool_calls",
        produced_chars=16,
    ),
    Row(
        "three-parallel-tool-calls",
        around(
            text_start(0),
            text(0, "Checking all three."),
            block_stop(0),
            tool_start(1, "toolu_a", "get_weather"),
            args(1, '{"city": "Oslo"}'),
            block_stop(1),
            tool_start(2, "toolu_b", "get_weather"),
            args(2, '{"city": '),
            args(2, '"Lima"}'),
            block_stop(2),
            tool_start(3, "toolu_c", "get_time"),
            args(3, "{}"),
            block_stop(3),
            stop_reason="tool_use",
        ),
        [
            ROLE,
            content("Checking all three."),
            call_start(0, "toolu_a", "get_weather"),
            call_args(0, '{"city": "Oslo"}'),
            call_start(1, "toolu_b", "get_weather"),
            call_args(1, '{"city": '),
            call_args(1, '"Lima"}'),
            call_start(2, "toolu_c", "get_time"),
            call_args(2, "{}"),
            finish("tool_calls"),
        ],
        content="Checking all three.",
        calls=[
            ("toolu_a", "get_weather", '{"city": "Oslo"}'),
            ("toolu_b", "get_weather", '{"city": "Lima"}'),
            ("toolu_c", "get_time", "{}"),
        ],
        finish_reason="tool_calls",
        produced_chars=19 + 16 + 16 + 2,
    ),
    Row(
        "thinking-then-text-then-tool-call",
        around(
            thinking_start(0),
            thinking(0, "The user wants the weather."),
            thinking(0, " Call the tool."),
            signature(0),
            block_stop(0),
            redacted_start(1),
            block_stop(1),
            text_start(2),
            text(2, "Let me look."),
            block_stop(2),
            tool_start(3, "toolu_x", "get_weather"),
            args(3, '{"city": "Oslo"}'),
            block_stop(3),
            stop_reason="tool_use",
        ),
        [
            ROLE,
            content("Let me look."),
            call_start(0, "toolu_x", "get_weather"),
            call_args(0, '{"city": "Oslo"}'),
            finish("tool_calls"),
        ],
        content="Let me look.",
        calls=[("toolu_x", "get_weather", '{"city": "Oslo"}')],
        finish_reason="tool_calls",
        produced_chars=12 + 16,
    ),
    Row(
        "thinking-only-produces-just-role-and-finish",
        around(thinking_start(0), thinking(0, "Hmm."), signature(0), block_stop(0), stop_reason="max_tokens"),
        [ROLE, finish("length")],
        content="",
        finish_reason="length",
    ),
    Row(
        "max-tokens-cut",
        around(text_start(0), text(0, "The answer is"), stop_reason="max_tokens"),
        [ROLE, content("The answer is"), finish("length")],
        content="The answer is",
        finish_reason="length",
        produced_chars=13,
    ),
    Row(
        "max-tokens-cut-inside-tool-arguments",
        around(tool_start(0, "toolu_1", "f"), args(0, '{"a": '), stop_reason="max_tokens"),
        [ROLE, call_start(0, "toolu_1", "f"), call_args(0, '{"a": '), finish("length")],
        calls=[("toolu_1", "f", '{"a": ')],
        finish_reason="length",
        produced_chars=6,
    ),
    Row(
        "refusal",
        [
            message_start(),
            text_start(0),
            text(0, "I can't"),
            message_delta("refusal", stop_details={"type": "refusal", "category": "cyber", "explanation": None}),
            message_stop(),
        ],
        [ROLE, content("I can't"), finish("content_filter")],
        content="I can't",
        finish_reason="content_filter",
        produced_chars=7,
    ),
    Row(
        "pause-turn",
        around(text_start(0), text(0, "Searching"), stop_reason="pause_turn"),
        [ROLE, content("Searching"), finish("stop")],
        content="Searching",
        finish_reason="stop",
        produced_chars=9,
    ),
    Row(
        "model-context-window-exceeded",
        around(text_start(0), text(0, "…"), stop_reason="model_context_window_exceeded"),
        [ROLE, content("…"), finish("length")],
        content="…",
        finish_reason="length",
        produced_chars=1,
    ),
    Row(
        "stop-sequence",
        [
            message_start(),
            text_start(0),
            text(0, "1 2 3"),
            message_delta("stop_sequence", stop_sequence="4"),
            message_stop(),
        ],
        [ROLE, content("1 2 3"), finish("stop")],
        content="1 2 3",
        finish_reason="stop",
        produced_chars=5,
    ),
    Row(
        "unknown-stop-reason-is-stop",
        around(text_start(0), text(0, "x"), stop_reason="some_future_reason"),
        [ROLE, content("x"), finish("stop")],
        content="x",
        finish_reason="stop",
        produced_chars=1,
    ),
    Row(
        "no-message-delta-is-stop",
        [message_start(), text_start(0), text(0, "x"), block_stop(0), message_stop()],
        [ROLE, content("x"), finish("stop")],
        content="x",
        finish_reason="stop",
        produced_chars=1,
    ),
    Row(
        "finish-chunk-waits-for-message-stop",
        [
            message_start(),
            text_start(0),
            text(0, "a"),
            message_delta("end_turn"),
            ping(),
            text(0, "b"),
            block_stop(0),
            ping(),
            message_stop(),
        ],
        [ROLE, content("a"), content("b"), finish("stop")],
        content="ab",
        finish_reason="stop",
        produced_chars=2,
    ),
    Row(
        "events-after-message-stop-ignored",
        [*around(text_start(0), text(0, "a")), text(0, "late"), message_stop(), error()],
        [ROLE, content("a"), finish("stop")],
        content="a",
        finish_reason="stop",
        produced_chars=1,
    ),
    Row("empty-reply", around(text_start(0), block_stop(0)), [ROLE, finish("stop")], content="", finish_reason="stop"),
    Row(
        "ping-and-unknown-events-ignored",
        around(
            ping(),
            ("future_event", {"type": "future_event", "x": 1}),
            text_start(0),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta", "text": "no"}},
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {
                        "type": "citations_delta",
                        "citation": {
                            "type": "char_location",
                            "cited_text": "c",
                            "document_index": 0,
                            "document_title": None,
                            "start_char_index": 0,
                            "end_char_index": 1,
                        },
                    },
                },
            ),
            text(0, "ok"),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": '{"q": 1}'},
                },
            ),
            block_stop(1),
        ),
        [ROLE, content("ok"), finish("stop")],
        content="ok",
        finish_reason="stop",
        produced_chars=2,
    ),
    Row(
        "stray-arguments-for-a-closed-or-unknown-block-ignored",
        around(
            tool_start(0, "toolu_1", "f"),
            args(0, "{}"),
            block_stop(0),
            args(0, "late"),
            args(7, "{}"),
            stop_reason="tool_use",
        ),
        [ROLE, call_start(0, "toolu_1", "f"), call_args(0, "{}"), finish("tool_calls")],
        calls=[("toolu_1", "f", "{}")],
        finish_reason="tool_calls",
        produced_chars=2,
    ),
    Row(
        "missing-message-start-still-opens-with-role",
        [text_start(0), text(0, "hi"), message_delta("end_turn"), message_stop()],
        [ROLE, content("hi"), finish("stop")],
        content="hi",
        finish_reason="stop",
        produced_chars=2,
    ),
    Row(
        "text-given-in-block-start-is-sent",
        around(
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "Hi"}},
            ),
            text(0, "!"),
        ),
        [ROLE, content("Hi"), content("!"), finish("stop")],
        content="Hi!",
        finish_reason="stop",
        produced_chars=3,
    ),
    Row(
        "tool-input-given-in-block-start-is-sent-whole",
        around(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"city": "Tōkyō"}},
                },
            ),
            block_stop(0),
            stop_reason="tool_use",
        ),
        [
            ROLE,
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"city":"Tōkyō"}'},
                    }
                ]
            },
            finish("tool_calls"),
        ],
        calls=[("toolu_1", "f", '{"city":"Tōkyō"}')],
        finish_reason="tool_calls",
        produced_chars=16,
    ),
    # A call with no arguments: the real API streams content_block_start (input {}) and one
    # input_json_delta with partial_json "". Arguments must still be JSON: "{}" when the block stops.
    Row(
        "no-arguments-call-streams-empty-object",
        around(tool_start(0, "toolu_n", "get_time"), args(0, ""), block_stop(0), stop_reason="tool_use"),
        [ROLE, call_start(0, "toolu_n", "get_time"), call_args(0, "{}"), finish("tool_calls")],
        calls=[("toolu_n", "get_time", "{}")],
        finish_reason="tool_calls",
        produced_chars=2,
    ),
    Row(
        "no-arguments-call-without-any-input-delta",
        around(tool_start(0, "toolu_n", "get_time"), block_stop(0), stop_reason="tool_use"),
        [ROLE, call_start(0, "toolu_n", "get_time"), call_args(0, "{}"), finish("tool_calls")],
        calls=[("toolu_n", "get_time", "{}")],
        finish_reason="tool_calls",
        produced_chars=2,
    ),
    Row(
        "no-arguments-call-whose-block-never-stops",
        around(tool_start(0, "toolu_n", "get_time"), args(0, ""), stop_reason="tool_use"),
        [ROLE, call_start(0, "toolu_n", "get_time"), call_args(0, "{}"), finish("tool_calls")],
        calls=[("toolu_n", "get_time", "{}")],
        finish_reason="tool_calls",
        produced_chars=2,
    ),
    Row(
        "parallel-calls-with-then-without-arguments",
        around(
            tool_start(0, "toolu_a", "get_weather"),
            args(0, ""),
            args(0, '{"city": '),
            args(0, '"Oslo"}'),
            block_stop(0),
            tool_start(1, "toolu_b", "get_time"),
            args(1, ""),
            block_stop(1),
            stop_reason="tool_use",
        ),
        [
            ROLE,
            call_start(0, "toolu_a", "get_weather"),
            call_args(0, '{"city": '),
            call_args(0, '"Oslo"}'),
            call_start(1, "toolu_b", "get_time"),
            call_args(1, "{}"),
            finish("tool_calls"),
        ],
        calls=[("toolu_a", "get_weather", '{"city": "Oslo"}'), ("toolu_b", "get_time", "{}")],
        finish_reason="tool_calls",
        produced_chars=16 + 2,
    ),
    Row(
        "parallel-calls-without-then-with-arguments",
        around(
            text_start(0),
            text(0, "Two calls."),
            block_stop(0),
            tool_start(1, "toolu_b", "get_time"),
            args(1, ""),
            block_stop(1),
            tool_start(2, "toolu_a", "get_weather"),
            args(2, ""),
            args(2, '{"city": "Lima"}'),
            block_stop(2),
            stop_reason="tool_use",
        ),
        [
            ROLE,
            content("Two calls."),
            call_start(0, "toolu_b", "get_time"),
            call_args(0, "{}"),
            call_start(1, "toolu_a", "get_weather"),
            call_args(1, '{"city": "Lima"}'),
            finish("tool_calls"),
        ],
        content="Two calls.",
        calls=[("toolu_b", "get_time", "{}"), ("toolu_a", "get_weather", '{"city": "Lima"}')],
        finish_reason="tool_calls",
        produced_chars=10 + 2 + 16,
    ),
    Row(
        "explicit-empty-object-arguments-are-not-doubled",
        around(tool_start(0, "toolu_n", "get_time"), args(0, ""), args(0, "{}"), block_stop(0), stop_reason="tool_use"),
        [ROLE, call_start(0, "toolu_n", "get_time"), call_args(0, "{}"), finish("tool_calls")],
        calls=[("toolu_n", "get_time", "{}")],
        finish_reason="tool_calls",
        produced_chars=2,
    ),
    Row(
        "encoded-tool-id-decoded",
        around(tool_start(0, encode_tool_id("call 42/é"), "f"), args(0, "{}"), stop_reason="tool_use"),
        [ROLE, call_start(0, "call 42/é", "f"), call_args(0, "{}"), finish("tool_calls")],
        calls=[("call 42/é", "f", "{}")],
        finish_reason="tool_calls",
        produced_chars=2,
    ),
]
ERROR_ROWS: list[Row] = [
    Row("error-before-any-output", [error()], []),
    Row(
        "error-mid-way",
        [
            message_start(),
            text_start(0),
            text(0, "Once upon"),
            error(),
            text(0, " a time"),
            message_delta("end_turn"),
            message_stop(),
        ],
        [ROLE, content("Once upon")],
        content="Once upon",
        produced_chars=9,
    ),
    Row(
        "error-mid-tool-call",
        [message_start(), tool_start(0, "toolu_1", "f"), args(0, '{"a"'), error("api_error", "Internal error")],
        [ROLE, call_start(0, "toolu_1", "f"), call_args(0, '{"a"')],
        calls=[("toolu_1", "f", '{"a"')],
        produced_chars=4,
    ),
]
ALL_ROWS = ROWS + ERROR_ROWS


def translate(events: Iterable[Event], *, include_usage: bool = False) -> tuple[StreamTranslator, list[dict]]:
    translator = StreamTranslator(completion_id=ID, created=CREATED, model=MODEL, include_usage=include_usage)
    chunks: list[dict[str, Any]] = []
    for event, data in events:
        chunks.extend(translator.feed(event, data))
    return translator, chunks


def expected_chunks(row: Row) -> list[dict[str, Any]]:
    return [chunk(*delta) if isinstance(delta, tuple) else chunk(delta) for delta in row.deltas]


def by_id(rows: list[Row]) -> Any:
    return pytest.mark.parametrize("row", rows, ids=[row.id for row in rows])


# -- the rows -------------------------------------------------------------------------------


@by_id(ALL_ROWS)
def test_chunks(row: Row):
    translator, chunks = translate(row.events)
    assert chunks == expected_chunks(row)
    assert translator.started == bool(chunks)


@by_id(ROWS)
def test_outcome(row: Row):
    translator, _ = translate(row.events)
    assert translator.done
    assert translator.error is None
    assert translator.finish_reason == row.finish_reason


@by_id(ERROR_ROWS)
def test_upstream_error_sets_error_and_sends_no_finish(row: Row):
    translator, chunks = translate(row.events)
    assert translator.error == row.events[[event for event, _ in row.events].index("error")][1]["error"]
    assert not translator.done
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert translator.feed(*message_stop()) == []  # nothing after the error


@by_id(ALL_ROWS)
def test_produced_chars_counts_text_and_arguments_not_thinking(row: Row):
    translator, _ = translate(row.events)
    assert translator.produced_chars == row.produced_chars


@by_id(ALL_ROWS)
def test_every_chunk_is_a_valid_openai_chunk(row: Row):
    _, chunks = translate(row.events)
    for c in chunks:
        sdk_types.chat_chunk(c)
        assert json.loads(encode_chunk(c).removeprefix(b"data: ")) == c


@by_id(ALL_ROWS)
def test_envelope_is_the_same_on_every_chunk(row: Row):
    _, chunks = translate(row.events)
    for c in chunks:
        assert (c["id"], c["object"], c["created"], c["model"]) == (ID, "chat.completion.chunk", CREATED, MODEL)
        assert len(c["choices"]) == 1 and c["choices"][0]["index"] == 0
        assert c["choices"][0]["logprobs"] is None
    if chunks:
        assert chunks[0]["choices"][0]["delta"] == ROLE
    assert [c for c in chunks if "role" in c["choices"][0]["delta"]] == chunks[:1]
    assert [c for c in chunks if c["choices"][0]["finish_reason"]] in ([], chunks[-1:])


@by_id(ALL_ROWS)
def test_openai_sdk_accumulates_the_reply(row: Row):
    _, chunks = translate(row.events)
    if not chunks:
        return
    state = sdk_types.chat_stream_state()
    for c in chunks:
        state.handle_chunk(sdk_types.chat_chunk(c))
    choice = state.current_completion_snapshot.choices[0]
    assert choice.message.role == "assistant"
    assert (choice.message.content or None) == (row.content or None)
    calls = [(call.id, call.function.name, call.function.arguments) for call in choice.message.tool_calls or []]
    assert calls == row.calls
    assert choice.finish_reason == row.finish_reason


@by_id(ALL_ROWS)
def test_events_match_the_anthropic_sdk_types(row: Row):
    """Keeps the builders above honest: the SDK parses every event of a known type."""
    for event, data in row.events:
        delta = data.get("delta", {})
        if (
            event in {"ping", "error", "future_event"}
            or delta.get("type") == "future_delta"
            or (delta.get("stop_reason") == "some_future_reason")
        ):
            continue  # outside the SDK's union on purpose
        assert sdk_types.anthropic_event(data).type == event


# -- usage ----------------------------------------------------------------------------------


def _openai_usage(prompt: int, completion: int, cached: int, cache_write: int, reasoning: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": cache_write},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


USAGE_ROWS = [
    pytest.param(
        message_start(25, 1, cache_creation_input_tokens=100, cache_read_input_tokens=2000),
        message_delta("end_turn", 120, output_tokens_details={"thinking_tokens": 80}),
        _openai_usage(2125, 120, 2000, 100, 80),
        id="cache-figures-from-start-output-and-reasoning-from-delta",
    ),
    pytest.param(
        message_start(10, 1, cache_creation_input_tokens=None, cache_read_input_tokens=None),
        message_delta(
            "end_turn",
            7,
            input_tokens=None,
            cache_creation_input_tokens=None,
            cache_read_input_tokens=None,
            output_tokens_details=None,
        ),
        _openai_usage(10, 7, 0, 0, 0),
        id="null-counts-are-zero",
    ),
    pytest.param(
        message_start(None, 1),
        message_delta("end_turn", 3),
        _openai_usage(0, 3, 0, 0, 0),
        id="null-input-at-start-is-zero",
    ),
    pytest.param(
        message_start(10, 1, cache_read_input_tokens=5),
        message_delta("end_turn", 7, input_tokens=12, cache_read_input_tokens=6, cache_creation_input_tokens=4),
        _openai_usage(22, 7, 6, 4, 0),
        id="cumulative-input-in-delta-wins",
    ),
    pytest.param(
        message_start(10, 1),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        _openai_usage(10, 1, 0, 0, 0),
        id="delta-without-usage-keeps-start",
    ),
]


@pytest.mark.parametrize(("start", "delta", "expected"), USAGE_ROWS)
def test_usage_merging(start: Event, delta: Event, expected: dict[str, Any]):
    translator, _ = translate([start, text_start(0), text(0, "x"), delta, message_stop()])
    assert usage_to_openai(translator.usage) == expected
    usage_chunk = translator.usage_chunk()
    assert usage_chunk == {
        "id": ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [],
        "usage": expected,
    }
    parsed = sdk_types.chat_chunk(usage_chunk)
    assert parsed.usage is not None and parsed.usage.total_tokens == expected["total_tokens"]


def test_usage_is_a_usage_record_for_billing():
    translator, _ = translate(USAGE_ROWS[0].values[:2])
    assert translator.usage == Usage(
        input_tokens=25, cache_write_tokens=100, cache_read_tokens=2000, output_tokens=120, reasoning_tokens=80
    )


@pytest.mark.parametrize("include_usage", [True, False], ids=["include-usage", "no-usage"])
def test_include_usage_puts_usage_null_on_choice_chunks(include_usage: bool):
    """As OpenAI does: with include_usage every chunk but the usage chunk has "usage": null."""
    translator, chunks = translate(ROWS[0].events, include_usage=include_usage)
    for c in chunks:
        assert ("usage" in c) == include_usage
        assert c.get("usage") is None
        sdk_types.chat_chunk(c)
    if include_usage:
        assert [{k: v for k, v in c.items() if k != "usage"} for c in chunks] == expected_chunks(ROWS[0])
    assert translator.usage_chunk()["usage"] == usage_to_openai(translator.usage)


# -- odd data never raises --------------------------------------------------------------------

ODD_EVENTS: list[Event | tuple[str, Any]] = [
    ("message_start", {}),
    ("message_start", {"message": None}),
    ("message_start", {"message": {"usage": 3}}),
    ("content_block_start", {}),
    ("content_block_start", {"content_block": None, "index": [1]}),
    ("content_block_start", {"index": 0, "content_block": {"type": "tool_use"}}),
    ("content_block_start", {"index": 1, "content_block": {"type": "tool_use", "id": 5, "name": None, "input": "x"}}),
    ("content_block_start", {"index": 2, "content_block": {"type": "text", "text": None}}),
    ("content_block_delta", {}),
    ("content_block_delta", {"delta": None}),
    ("content_block_delta", {"delta": 7}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta"}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": 12}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta"}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": None}}),
    ("content_block_delta", {"index": {}, "delta": {"type": "input_json_delta", "partial_json": "x"}}),
    ("content_block_stop", {}),
    ("content_block_stop", {"index": []}),
    ("message_delta", {}),
    ("message_delta", {"delta": None, "usage": None}),
    ("message_delta", {"delta": {"stop_reason": 5}, "usage": {"output_tokens": "many"}}),
    ("ping", {}),
    ("", {}),
    ("message_start", None),
    ("content_block_delta", []),  # type: ignore[list-item]
]


@pytest.mark.parametrize(
    ("event", "data"), ODD_EVENTS, ids=[f"{i}-{e or 'blank'}" for i, (e, _) in enumerate(ODD_EVENTS)]
)
def test_odd_data_never_raises(event: str, data: Any):
    translator = StreamTranslator(completion_id=ID, created=CREATED, model=MODEL, include_usage=True)
    for c in translator.feed(event, data):
        sdk_types.chat_chunk(c)
    chunks = translator.feed("message_stop", {})
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    sdk_types.chat_chunk(translator.usage_chunk())


def test_all_odd_events_in_one_stream():
    translator, chunks = translate([(e, d) for e, d in ODD_EVENTS] + [message_stop()])
    assert translator.done and chunks[0]["choices"][0]["delta"] == ROLE
    for c in chunks:
        sdk_types.chat_chunk(c)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {"type": "overloaded_error", "message": "Overloaded"},
            id="error-object",
        ),
        pytest.param({}, {"type": "api_error", "message": "The upstream stream failed."}, id="error-missing"),
        pytest.param(
            {"error": "boom"}, {"type": "api_error", "message": "The upstream stream failed."}, id="error-not-an-object"
        ),
    ],
)
def test_error_event_sets_error(data: dict[str, Any], expected: dict[str, Any]):
    translator, chunks = translate([message_start(), ("error", data)])
    assert chunks == [chunk(ROLE)]
    assert translator.error == expected


def test_state_before_and_after():
    translator = StreamTranslator(completion_id=ID, created=CREATED, model=MODEL, include_usage=False)
    assert (translator.started, translator.done, translator.error, translator.finish_reason) == (
        False,
        False,
        None,
        None,
    )
    assert translator.feed(*ping()) == []
    assert not translator.started
    assert translator.feed(*message_start()) == [chunk(ROLE)]
    assert translator.started
    assert translator.feed(*message_delta("tool_use")) == []
    assert translator.finish_reason == "tool_calls" and not translator.done
    assert translator.feed(*message_stop()) == [chunk({}, "tool_calls")]
    assert translator.done


# -- a recorded stream, through the decoder and the translator ------------------------------


def test_recorded_stream_end_to_end():
    translator = StreamTranslator(completion_id=ID, created=CREATED, model=MODEL, include_usage=True)
    state = sdk_types.chat_stream_state()
    for event, data in iter_sse([FIXTURE.read_bytes()]):
        for c in translator.feed(event, json.loads(data)):
            state.handle_chunk(sdk_types.chat_chunk(json.loads(encode_chunk(c)[6:])))
    assert translator.done
    state.handle_chunk(sdk_types.chat_chunk(translator.usage_chunk()))
    completion = state.current_completion_snapshot
    message = completion.choices[0].message
    assert message.content == (
        "Okay, let me check the weather in Tōkyō (日本) — it's usually around 20°C this time of year."
    )
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []] == [
        ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", {"city": "Tōkyō, 日本", "unit": "°C"})
    ]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (472 + 2048, 89)


# -- tool arguments are streamed as they arrive, and are always JSON ------------------------


def test_arguments_are_sent_on_the_event_that_brings_them():
    """The "{}" for a call without arguments waits for its block's end; real arguments never wait."""
    translator = StreamTranslator(completion_id=ID, created=CREATED, model=MODEL, include_usage=False)
    outputs = [
        [c["choices"][0]["delta"] for c in translator.feed(event, data)]
        for event, data in [
            message_start(),
            tool_start(0, "toolu_a", "f"),
            args(0, ""),
            args(0, '{"a"'),
            args(0, ": 1}"),
            block_stop(0),
            tool_start(1, "toolu_b", "g"),
            args(1, ""),
            block_stop(1),
        ]
    ]
    assert outputs == [
        [ROLE],
        [call_start(0, "toolu_a", "f")],
        [],
        [call_args(0, '{"a"')],
        [call_args(0, ": 1}")],
        [],
        [call_start(1, "toolu_b", "g")],
        [],
        [call_args(1, "{}")],
    ]


def _sse(events: list[Event]) -> bytes:
    return b"".join(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode() for event, data in events)


NO_ARGUMENT_STREAMS = [
    pytest.param(
        around(tool_start(0, "toolu_n", "get_time"), args(0, ""), block_stop(0), stop_reason="tool_use"),
        [("toolu_n", "get_time", {})],
        id="one-call-without-arguments",
    ),
    pytest.param(
        around(
            tool_start(0, "toolu_a", "get_weather"),
            args(0, ""),
            args(0, '{"city": "Oslo"}'),
            block_stop(0),
            tool_start(1, "toolu_b", "get_time"),
            args(1, ""),
            block_stop(1),
            stop_reason="tool_use",
        ),
        [("toolu_a", "get_weather", {"city": "Oslo"}), ("toolu_b", "get_time", {})],
        id="parallel-with-and-without-arguments",
    ),
]


@pytest.mark.parametrize("events, expected", NO_ARGUMENT_STREAMS)
def test_no_argument_calls_parse_as_json_however_the_bytes_are_split(events: list[Event], expected: list[Any]):
    """The upstream bytes split at every boundary, decoded, translated and accumulated by the
    openai SDK: every call's arguments parse as a JSON object."""
    raw = _sse(events)
    checked: dict[bytes, str] = {}  # the bytes sent for a split -> the split that checked them first
    for cut in range(len(raw) + 1):
        translator = StreamTranslator(completion_id=ID, created=CREATED, model=MODEL, include_usage=False)
        sent = b"".join(
            encode_chunk(c)
            for event, data in iter_sse([raw[:cut], raw[cut:]])
            for c in translator.feed(event, json.loads(data))
        )
        assert translator.done, f"split at byte {cut}"
        if sent in checked:  # the same bytes as an earlier split: the SDK would see the same
            continue
        checked[sent] = f"split at byte {cut}"
        state = sdk_types.chat_stream_state()
        for line in sent.split(b"\n\n")[:-1]:
            state.handle_chunk(sdk_types.chat_chunk(json.loads(line[6:])))
        calls = state.current_completion_snapshot.choices[0].message.tool_calls or []
        got = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls]
        assert got == expected, f"split at byte {cut}"


# -- encoding -------------------------------------------------------------------------------


def test_encode_chunk_is_compact_utf8():
    assert encode_chunk({"a": "日本 °", "b": [1, None]}) == 'data: {"a":"日本 °","b":[1,null]}\n\n'.encode()


def test_encode_chunk_escapes_a_lone_surrogate():
    encoded = encode_chunk({"content": "a\ud83db"})
    assert encoded == b'data: {"content":"a\\ud83db"}\n\n'


def test_done():
    assert DONE == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(
            {"error": {"message": "Overloaded", "type": "server_error", "param": None, "code": "overloaded"}},
            id="envelope",
        ),
        pytest.param(
            {"message": "Overloaded", "type": "server_error", "param": None, "code": "overloaded"},
            id="bare-error-object",
        ),
    ],
)
def test_encode_error(payload: dict[str, Any]):
    assert encode_error(payload) == (
        b'data: {"error":{"message":"Overloaded","type":"server_error","param":null,"code":"overloaded"}}\n\n'
    )
