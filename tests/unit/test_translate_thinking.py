"""Thinking kept across tool loops (Chat Completions reference, "Reasoning"; Anthropic's extended-thinking
guide, "Preserving thinking blocks"): what a reply keeps, the same from its stream, and how a
later request gets the blocks back — one row per rule.

The recorded streams in tests/fixtures are checked against the anthropic SDK's own accumulator
first, so "the stream and its message" is the API's equivalence, not ours.
"""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ezat_compat.domain import Model, Price
from ezat_compat.translate.ids import encode_tool_id
from ezat_compat.translate.request import openai_to_anthropic
from ezat_compat.translate.thinking import (
    ThinkingCollector,
    assistant_tool_ids,
    blocks_to_keep,
    restore_thinking,
    thinking_of_reply,
    without_thinking,
)
from ezat_compat.upstream.sse import iter_sse
from tests.support import sdk_types

FIXTURES = Path(__file__).parent.parent / "fixtures"
RECORDED = ["thinking_tools", "redacted_thinking_tool"]
SIG = "EuYBCkQYAiJAjAcQ3n+6Rk9VnW/2QhLcHqRiDb0xV7t3ZC4yWn8pD1fUaL+o9s2gXJrE5MmkQe0z=="

THINK = {"type": "thinking", "thinking": "Check the weather first.", "signature": SIG}
THINK_2 = {"type": "thinking", "thinking": "Now the forecast.", "signature": SIG[::-1]}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP=="}
TEXT = {"type": "text", "text": "Let me check."}


def tool_use(tool_id: str, name: str = "get_weather", **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}


# ---------------------------------------------------------------- replies


@pytest.mark.parametrize(
    "content, expected",
    [
        pytest.param([THINK, TEXT, tool_use("toolu_1")], (["toolu_1"], [THINK]), id="thinking-text-tool"),
        pytest.param(
            [THINK, tool_use("toolu_1"), tool_use("toolu_2")], (["toolu_1", "toolu_2"], [THINK]), id="parallel"
        ),
        pytest.param([REDACTED, tool_use("toolu_1")], (["toolu_1"], [REDACTED]), id="redacted-only"),
        pytest.param(
            [REDACTED, THINK, tool_use("toolu_1")],
            (["toolu_1"], [REDACTED, THINK]),
            id="redacted-then-thinking-in-order",
        ),
        pytest.param([THINK, TEXT], None, id="no-tool-call-nothing-to-keep"),
        pytest.param([TEXT, tool_use("toolu_1")], None, id="tool-call-without-thinking"),
        pytest.param([tool_use("toolu_1"), THINK], None, id="thinking-after-the-call-not-kept"),
        pytest.param(
            [THINK, tool_use(encode_tool_id("call:weather/1"))], (["call:weather/1"], [THINK]), id="client-ids-decoded"
        ),
        pytest.param(
            [{**THINK, "thinking": ""}, tool_use("toolu_1")],
            (["toolu_1"], [{**THINK, "thinking": ""}]),
            id="omitted-thinking-text-kept-with-signature",
        ),
    ],
)
def test_thinking_of_reply(content: list[dict[str, Any]], expected: Any) -> None:
    before = copy.deepcopy(content)
    assert thinking_of_reply(content) == expected
    assert content == before


def test_kept_blocks_are_copies() -> None:
    content = [THINK, tool_use("toolu_1")]
    kept = blocks_to_keep(content)
    assert kept == [THINK] and kept[0] is not THINK


def _events(name: str) -> list[tuple[str, dict[str, Any]]]:
    raw = (FIXTURES / f"anthropic_stream_{name}.sse").read_bytes()
    return [(event, json.loads(data)) for event, data in iter_sse([raw])]


def _message(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"anthropic_message_{name}.json").read_text())


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_stream_is_its_message(name: str) -> None:
    """The fixture pair is consistent by the anthropic SDK's accumulator."""
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot = None
    bufs: dict[int, bytes] = {}
    for event, data in _events(name):
        if event == "ping":
            continue
        snapshot = accumulate_event(event=sdk_types.anthropic_event(data), current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    assert snapshot.model_dump(exclude_none=True, exclude={"usage"})["content"] == _message(name)["content"]


@pytest.mark.parametrize("name", RECORDED)
def test_collector_gives_what_the_message_gives(name: str) -> None:
    collector = ThinkingCollector()
    for event, data in _events(name):
        collector.feed(event, data)
    expected = thinking_of_reply(_message(name)["content"])
    assert expected is not None
    assert collector.result() == expected


@pytest.mark.parametrize("name", RECORDED)
def test_collector_signature_survives_byte_for_byte(name: str) -> None:
    collector = ThinkingCollector()
    for event, data in _events(name):
        collector.feed(event, data)
    result = collector.result()
    assert result is not None
    got = json.dumps(result[1], ensure_ascii=False)
    want = json.dumps(blocks_to_keep(_message(name)["content"]), ensure_ascii=False)
    assert got.encode() == want.encode()


def _start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, **delta: Any) -> tuple[str, dict[str, Any]]:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def _stop(index: int) -> tuple[str, dict[str, Any]]:
    return "content_block_stop", {"type": "content_block_stop", "index": index}


def _thinking_events(index: int, start: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        _start(index, start),
        _delta(index, type="thinking_delta", thinking="Check the weather"),
        _delta(index, type="thinking_delta", thinking=" first."),
        _delta(index, type="signature_delta", signature=SIG),
        _stop(index),
    ]


TOOL_EVENTS = [_start(1, tool_use("toolu_1")), _delta(1, type="input_json_delta", partial_json=""), _stop(1)]


@pytest.mark.parametrize(
    "events, expected",
    [
        pytest.param(
            _thinking_events(0, {"type": "thinking", "thinking": "", "signature": ""}) + TOOL_EVENTS,
            (["toolu_1"], [THINK]),
            id="start-with-empty-signature",
        ),
        pytest.param(
            _thinking_events(0, {"type": "thinking", "thinking": ""}) + TOOL_EVENTS,
            (["toolu_1"], [THINK]),
            id="start-without-signature-key",
        ),
        pytest.param(
            [_start(0, REDACTED), _stop(0), ("ping", {"type": "ping"}), *TOOL_EVENTS],
            (["toolu_1"], [REDACTED]),
            id="redacted-arrives-whole",
        ),
        pytest.param(
            _thinking_events(0, {"type": "thinking", "thinking": "", "signature": ""}), None, id="no-tool-call"
        ),
        pytest.param(
            _thinking_events(0, {"type": "thinking", "thinking": "", "signature": ""})[:-1] + TOOL_EVENTS,
            None,
            id="thinking-block-never-stopped",
        ),
        pytest.param(
            [*TOOL_EVENTS[:1], _start(2, REDACTED), _stop(2), *TOOL_EVENTS[1:]], None, id="thinking-after-the-call"
        ),
        pytest.param(
            [
                ("content_block_start", "odd"),
                _start(0, REDACTED),
                ("content_block_delta", {"index": 0, "delta": 3}),
                _stop(0),
                *TOOL_EVENTS,
            ],  # type: ignore[list-item]
            (["toolu_1"], [REDACTED]),
            id="odd-upstream-data-ignored",
        ),
    ],
)
def test_collector(events: list[tuple[str, Any]], expected: Any) -> None:
    collector = ThinkingCollector()
    for event, data in events:
        collector.feed(event, data)
    assert collector.result() == expected


# ---------------------------------------------------------------- requests

PRICE = Price(Decimal(3), Decimal(15), Decimal("3.75"), Decimal("0.3"))
MODEL = Model(
    id="anthropic/claude-sonnet-5-5",
    aliases=("claude-sonnet-5-5",),
    price=PRICE,
    deployments=(),
)


def _call(call_id: str, city: str = "Tokyo") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "20°C"}


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def translate(messages: list[dict[str, Any]], **req: Any) -> Any:
    request = {"model": "claude-sonnet-5-5", "messages": messages, "tools": TOOLS, "reasoning_effort": "high", **req}
    return openai_to_anthropic(request, MODEL)


def rounds(n: int) -> list[dict[str, Any]]:
    """A tool loop after ``n`` rounds: each round one assistant call ``call_k`` and its result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    for k in range(n):
        messages += [{"role": "assistant", "content": None, "tool_calls": [_call(f"call_{k}")]}, _result(f"call_{k}")]
    return messages


def blocks_for(k: int) -> list[dict[str, Any]]:
    return [{**THINK, "thinking": f"round {k}", "signature": f"{SIG}{k}"}]


def stash_of(n: int) -> dict[str, list[dict[str, Any]]]:
    return {f"call_{k}": blocks_for(k) for k in range(n)}


def _contents(body: dict[str, Any]) -> list[list[str]]:
    return [[b["type"] for b in m["content"]] for m in body["messages"] if m["role"] == "assistant"]


def test_first_round_has_no_tool_turn() -> None:
    body = translate([{"role": "user", "content": "Weather?"}]).body
    assert assistant_tool_ids(body) == []
    assert restore_thinking(body, {}) is True


def test_several_rounds_each_turn_gets_its_own_blocks() -> None:
    body = translate(rounds(3)).body
    assert assistant_tool_ids(body) == [["call_0"], ["call_1"], ["call_2"]]
    assert restore_thinking(body, stash_of(3)) is True
    turns = [m for m in body["messages"] if m["role"] == "assistant"]
    assert [t["content"][0] for t in turns] == [blocks_for(0)[0], blocks_for(1)[0], blocks_for(2)[0]]
    assert _contents(body) == [["thinking", "tool_use"]] * 3


def test_prefix_stays_the_same_from_round_to_round() -> None:
    """Round N+1's request starts with round N's messages, thinking and all (the cache prefix)."""
    earlier = translate(rounds(2)).body
    later = translate(rounds(3)).body
    restore_thinking(earlier, stash_of(2))
    restore_thinking(later, stash_of(3))
    for old, new in zip(earlier["messages"][:-1], later["messages"], strict=False):
        assert [{k: v for k, v in b.items() if k != "cache_control"} for b in old["content"]] == [
            {k: v for k, v in b.items() if k != "cache_control"} for b in new["content"]
        ]


def test_parallel_calls_in_one_turn_get_the_blocks_once() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in two cities?"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [_call("call_a"), _call("call_b", "Osaka")]},
        _result("call_a"),
        _result("call_b"),
    ]
    body = translate(messages).body
    assert assistant_tool_ids(body) == [["call_a", "call_b"]]
    assert restore_thinking(body, {"call_a": [REDACTED, THINK], "call_b": [REDACTED, THINK]}) is True
    assert body["messages"][1]["content"][:2] == [REDACTED, THINK]
    assert _contents(body) == [["redacted_thinking", "thinking", "text", "tool_use", "tool_use"]]


def test_calls_split_over_messages_the_translation_merged() -> None:
    """Some clients send one assistant message per parallel call; the translation merges them."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in two cities?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_a")]},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_b", "Osaka")]},
        _result("call_a"),
        _result("call_b"),
    ]
    body = translate(messages).body
    assert restore_thinking(body, {"call_a": [THINK], "call_b": [THINK]}) is True
    assert _contents(body) == [["thinking", "tool_use", "tool_use"]]


def test_client_tool_ids_that_the_translation_encoded() -> None:
    odd = "call:weather/1"
    body = translate([*rounds(0), {"role": "assistant", "tool_calls": [_call(odd)]}, _result(odd)]).body
    assert body["messages"][1]["content"][0]["id"] == encode_tool_id(odd)
    assert assistant_tool_ids(body) == [[odd]]
    assert restore_thinking(body, {odd: [THINK]}) is True
    assert body["messages"][1]["content"][0] == THINK


@pytest.mark.parametrize(
    "found",
    [
        pytest.param({}, id="expired-or-foreign"),
        pytest.param(stash_of(2), id="latest-turn-missing"),
        pytest.param({**stash_of(3), "call_2": []}, id="latest-turn-empty"),
    ],
)
def test_latest_turn_without_blocks_changes_nothing(found: dict[str, Any]) -> None:
    body = translate(rounds(3)).body
    before = copy.deepcopy(body)
    assert restore_thinking(body, found) is False
    assert body == before


@pytest.mark.parametrize(
    "found",
    [
        pytest.param({"call_a": [THINK]}, id="client-added-a-call"),
        pytest.param({"call_a": [THINK], "call_b": [THINK_2]}, id="calls-from-two-replies"),
    ],
)
def test_turn_edited_by_the_client(found: dict[str, Any]) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [_call("call_a"), _call("call_b")]},
        _result("call_a"),
        _result("call_b"),
    ]
    body = translate(messages).body
    before = copy.deepcopy(body)
    assert restore_thinking(body, found) is False
    assert body == before


def test_earlier_turn_without_blocks_is_left_as_is() -> None:
    """Prior assistant turns may omit their thinking; only the final one must start with it."""
    body = translate(rounds(3)).body
    found = stash_of(3)
    del found["call_0"]
    assert restore_thinking(body, found) is True
    assert _contents(body) == [["tool_use"], ["thinking", "tool_use"], ["thinking", "tool_use"]]


def test_text_only_assistant_turns_untouched() -> None:
    messages: list[dict[str, Any]] = [
        *rounds(1),
        {"role": "assistant", "content": "It is 20°C in Tokyo."},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ]
    body = translate(messages).body
    assert assistant_tool_ids(body) == [["call_0"]]
    assert restore_thinking(body, {}) is True  # the final assistant turn has no tool call
    assert _contents(body) == [["tool_use"], ["text"]]
    assert restore_thinking(body, stash_of(1)) is True
    assert _contents(body) == [["thinking", "tool_use"], ["text"]]


def test_turn_that_already_starts_with_thinking_is_left_alone() -> None:
    body = translate(rounds(1)).body
    body["messages"][1]["content"].insert(0, THINK_2)
    assert restore_thinking(body, {}) is True
    assert body["messages"][1]["content"][0] == THINK_2


def test_restored_blocks_are_exact_copies_not_shared() -> None:
    found = stash_of(2)
    body = translate(rounds(2)).body
    restore_thinking(body, found)
    restored = body["messages"][1]["content"][0]
    assert restored == found["call_0"][0] and restored is not found["call_0"][0]
    assert "cache_control" not in restored


def test_cache_breakpoints_stay_where_the_translation_put_them() -> None:
    body = translate(rounds(2)).body
    marked = [
        (k, m) for k, msg in enumerate(body["messages"]) for m, b in enumerate(msg["content"]) if "cache_control" in b
    ]
    restore_thinking(body, stash_of(2))
    after = [
        (k, m) for k, msg in enumerate(body["messages"]) for m, b in enumerate(msg["content"]) if "cache_control" in b
    ]
    assert marked == after == [(len(body["messages"]) - 1, 0)]  # the newest message, untouched by insertion


def test_source_map_follows_the_inserted_blocks() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "tool_calls": [_call("call_a")]},
        _result("call_a"),
    ]
    translation = translate(messages)
    source = dict(translation.source_map)
    assert (
        source[("messages", 1, 0)] == "messages[1].content[0]"
        and source[("messages", 1, 1)] == "messages[1].tool_calls[0]"
    )
    assert restore_thinking(translation.body, {"call_a": [REDACTED, THINK]}, translation.source_map) is True
    assert translation.source_map[("messages", 1, 0)] == "messages[1]"
    assert translation.source_map[("messages", 1, 1)] == "messages[1]"
    assert translation.source_map[("messages", 1, 2)] == "messages[1].content[0]"
    assert translation.source_map[("messages", 1, 3)] == "messages[1].tool_calls[0]"
    assert translation.source_map[("messages", 2, 0)] == source[("messages", 2, 0)]


# ---------------------------------------------------------------- thinking off


BUDGET = Model(
    id="anthropic/claude-haiku-4-5",
    aliases=("claude-haiku-4-5",),
    price=PRICE,
    deployments=(),
    sampling=True,
    thinking="budget",
    efforts=("low", "medium", "high"),
)
SAMPLING = Model(
    id="anthropic/claude-sampler",
    aliases=("claude-sampler",),
    price=PRICE,
    deployments=(),
    sampling=True,
)


@pytest.mark.parametrize(
    "model, extra",
    [
        pytest.param(MODEL, {}, id="adaptive"),
        pytest.param(SAMPLING, {"temperature": 0.2}, id="adaptive-temperature-comes-back"),
        pytest.param(BUDGET, {"temperature": 0}, id="budget-temperature-comes-back"),
        pytest.param(BUDGET, {"top_p": 0.5}, id="budget-top-p-comes-back"),
    ],
)
def test_without_thinking_is_the_request_with_thinking_not_requested(model: Model, extra: dict[str, Any]) -> None:
    """The body equals the translation's own body when thinking isn't requested (a forced tool
    call with the same effort), apart from ``tool_choice`` itself."""
    name = model.aliases[0]
    req = {"model": name, "messages": rounds(1), "tools": TOOLS, "reasoning_effort": "high", **extra}
    body = openai_to_anthropic(req, model).body
    assert "thinking" in body
    without_thinking(body, req, model)
    forced = openai_to_anthropic({**req, "tool_choice": "required"}, model).body
    forced.pop("tool_choice")
    assert "thinking" not in body
    assert body == forced


def test_without_thinking_keeps_effort_and_max_tokens() -> None:
    req = {"model": "claude-sonnet-5-5", "messages": rounds(1), "tools": TOOLS, "reasoning_effort": "high"}
    body = openai_to_anthropic(req, MODEL).body
    max_tokens = body["max_tokens"]
    without_thinking(body, req, MODEL)
    assert body["output_config"] == {"effort": "high"} and body["max_tokens"] == max_tokens


def test_without_thinking_leaves_a_request_without_thinking_alone() -> None:
    req = {"model": "claude-sampler", "messages": rounds(1), "tools": TOOLS, "temperature": 0.3}
    body = openai_to_anthropic(req, SAMPLING).body
    before = copy.deepcopy(body)
    without_thinking(body, req, SAMPLING)
    assert body == before
