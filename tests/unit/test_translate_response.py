"""Anthropic message -> chat.completion (spec: "Request and response", "Finish reasons"),
and upstream error text -> client error text."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezat_compat.domain import Usage
from ezat_compat.translate.ids import encode_tool_id
from ezat_compat.translate.response import anthropic_to_openai, merge_usage, usage_from_anthropic, usage_to_openai
from ezat_compat.translate.upstream_errors import rewrite_upstream_message
from tests.support import sdk_types


def message(content: list[dict[str, Any]], stop_reason: str | None = "end_turn", **usage: Any) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5, **usage},
    }


def completion(msg: dict[str, Any], model: str = "Claude-Sonnet-5.5 ") -> dict[str, Any]:
    out = anthropic_to_openai(msg, completion_id="chatcmpl-req1", created=1793318400, model=model)
    sdk_types.chat_completion(out)  # the official SDK's type parses it
    return out


def test_shape_of_a_plain_reply() -> None:
    out = completion(message([{"type": "text", "text": "Hello"}]))
    assert out == {
        "id": "chatcmpl-req1",
        "object": "chat.completion",
        "created": 1793318400,
        "model": "Claude-Sonnet-5.5 ",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
    }


@pytest.mark.parametrize(
    "stop_reason, finish",
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        ("something_new", "stop"),
        (None, "stop"),
    ],
)
def test_finish_reasons(stop_reason: str | None, finish: str) -> None:
    assert completion(message([{"type": "text", "text": "x"}], stop_reason))["choices"][0]["finish_reason"] == finish


def test_only_tool_calls_gives_null_content_and_json_arguments() -> None:
    out = completion(
        message(
            [
                {"type": "thinking", "thinking": "secret", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo", "n": 1}},
                {"type": "tool_use", "id": encode_tool_id("call:7"), "name": "b", "input": {}},
            ],
            "tool_use",
        )
    )
    reply = out["choices"][0]["message"]
    assert reply["content"] is None and reply["refusal"] is None
    assert reply["tool_calls"] == [
        {
            "id": "toolu_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo","n":1}'},
        },
        {"id": "call:7", "type": "function", "function": {"name": "b", "arguments": "{}"}},
    ]
    assert "secret" not in str(out)  # thinking text is never returned


def test_text_blocks_joined_and_kept_beside_tool_calls() -> None:
    out = completion(
        message(
            [
                {"type": "text", "text": "a"},
                {"type": "text", "text": "b"},
                {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            ],
            "tool_use",
        )
    )
    assert out["choices"][0]["message"]["content"] == "ab"


@pytest.mark.parametrize(
    "usage, expected",
    [
        (
            {
                "input_tokens": 100,
                "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 50,
                "output_tokens": 20,
                "output_tokens_details": {"thinking_tokens": 12},
            },
            {
                "prompt_tokens": 1050,
                "completion_tokens": 20,
                "total_tokens": 1070,
                "prompt_tokens_details": {"cached_tokens": 900, "cache_write_tokens": 50},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        ),
        (
            {
                "input_tokens": 3,
                "cache_read_input_tokens": None,
                "cache_creation_input_tokens": None,
                "output_tokens": 1,
                "output_tokens_details": None,
            },
            {
                "prompt_tokens": 3,
                "completion_tokens": 1,
                "total_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        ),
    ],
    ids=["cache-and-reasoning", "nulls-are-zero"],
)
def test_usage_block(usage: dict[str, Any], expected: dict[str, Any]) -> None:
    assert usage_to_openai(usage_from_anthropic(usage)) == expected


def test_message_delta_usage_merges_over_message_start() -> None:
    start = usage_from_anthropic({"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1})
    merged = merge_usage(start, {"output_tokens": 30, "output_tokens_details": {"thinking_tokens": 8}})
    assert (merged.input_tokens, merged.cache_read_tokens, merged.output_tokens, merged.reasoning_tokens) == (
        10,
        5,
        30,
        8,
    )


SOURCE_MAP = {
    ("system", 0): "messages[0]",
    ("messages", 0): "messages[1]",
    ("messages", 0, 1): "messages[1].content[2]",
    ("messages", 1, 0): "messages[2].tool_calls[0]",
    ("tools", 0): "tools[3]",
}


@pytest.mark.parametrize(
    "upstream, expected",
    [
        (
            "messages.0.content.1.image.source.base64.media_type: Input should be 'image/png'",
            ("messages[1].content[2]: Input should be 'image/png'", "messages[1].content[2]"),
        ),
        (
            "messages.1.content.0.tool_use.id: String should match pattern",
            ("messages[2].tool_calls[0]: String should match pattern", "messages[2].tool_calls[0]"),
        ),
        ("messages.0: bad turn", ("messages[1]: bad turn", "messages[1]")),
        ("system.0.text: too long", ("messages[0]: too long", "messages[0]")),
        ("tools.0.input_schema: bad", ("tools[3]: bad", "tools[3]")),
        (
            "messages: text content blocks must be non-empty",
            ("messages: text content blocks must be non-empty", "messages"),
        ),
        ("messages.7.content.0: no such turn", ("no such turn", None)),
        ("output_config.format.schema: invalid", ("invalid", None)),
        ("Overloaded", ("Overloaded", None)),
        (
            f"unexpected `tool_use_id` found in `tool_result` blocks: {encode_tool_id('call:1')}",
            ("unexpected `tool_use_id` found in `tool_result` blocks: call:1", None),
        ),
    ],
    ids=[
        "block-path",
        "tool-use-path",
        "turn-path",
        "system",
        "tools",
        "bare-messages",
        "unknown-index",
        "translated-only-field",
        "no-path",
        "encoded-id-decoded",
    ],
)
def test_upstream_400_paths_point_into_the_clients_request(upstream: str, expected: tuple[str, str | None]) -> None:
    assert rewrite_upstream_message(upstream, SOURCE_MAP) == expected


# ---------------------------------------------------------------- merge_usage, field by field

_COUNT_VALUES = st.sampled_from([None, 0, 1, 5, -3, True, 2.5, "7", [], {}, [1]])
_DETAILS = st.sampled_from([None, 0, {}, {"thinking_tokens": 4}, {"thinking_tokens": "x"}, [], "x"])
_SERVER = st.sampled_from([None, 0, {}, {"web_search_requests": 2}, {"web_search_requests": -1}, [], "x"])


def _merged_by_the_rule(base: Usage, update: dict[str, Any]) -> Usage:
    """Fields present (not null) win, each read as ``usage_from_anthropic`` reads it; the details
    and the server tool use when they are truthy."""
    new = usage_from_anthropic(update)
    present = {key: update.get(key) is not None for key in update}
    return Usage(
        input_tokens=new.input_tokens if present.get("input_tokens") else base.input_tokens,
        cache_write_tokens=new.cache_write_tokens
        if present.get("cache_creation_input_tokens")
        else base.cache_write_tokens,
        cache_read_tokens=new.cache_read_tokens if present.get("cache_read_input_tokens") else base.cache_read_tokens,
        output_tokens=new.output_tokens if present.get("output_tokens") else base.output_tokens,
        reasoning_tokens=new.reasoning_tokens if update.get("output_tokens_details") else base.reasoning_tokens,
        web_searches=new.web_searches if update.get("server_tool_use") else base.web_searches,
    )


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "input_tokens": _COUNT_VALUES,
            "cache_creation_input_tokens": _COUNT_VALUES,
            "cache_read_input_tokens": _COUNT_VALUES,
            "output_tokens": _COUNT_VALUES,
            "output_tokens_details": _DETAILS,
            "server_tool_use": _SERVER,
        },
    )
)
def test_merge_usage_takes_each_field_present(update: dict[str, Any]) -> None:
    base = Usage(1, 2, 3, 4, 5, 6)
    assert merge_usage(base, update) == _merged_by_the_rule(base, update)
    assert merge_usage(base, None) is base
