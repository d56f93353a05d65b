"""Anthropic message / stream -> Responses response and events: one row per rule of
docs/responses.md ("Output", "Reasoning", "Streaming").

Every response object is validated with the openai SDK's ``Response`` type and every event with
its ``ResponseStreamEvent`` union; a stream's final response equals the JSON translation of the
same reply (recorded fixtures and synthetic streams built from a message).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from ezat_compat.domain import Usage
from ezat_compat.translate.ids import encode_tool_id
from ezat_compat.translate.responses_response import (
    ItemIds,
    anthropic_to_response,
    client_view,
    response_skeleton,
    usage_to_responses,
)
from ezat_compat.translate.responses_stream import ResponseEvents
from ezat_compat.translate.responses_tools import ClientTool
from ezat_compat.upstream.sse import iter_sse
from tests.support import sdk_types

FIXTURES = Path(__file__).parent.parent / "fixtures"
TOOLS = {
    "get_weather": ClientTool("function", "get_weather"),
    "apply_patch": ClientTool("custom", "apply_patch"),
    "multi_agent__spawn": ClientTool("function", "spawn", "multi_agent"),
}


SIG = "EuYBCkQYAiJAjAcQ3n+6Rk9VnW/2QhLcHqRiDb0xV7t3ZC4yWn8pD1fU=="
THINK = {"type": "thinking", "thinking": "Check the weather.", "signature": SIG}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix=="}
USAGE = {"input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20, "output_tokens": 7}


def seal(blocks: list[dict[str, Any]]) -> str:
    return "sealed:" + json.dumps(blocks, sort_keys=True)


def skeleton(**req: Any) -> dict[str, Any]:
    return response_skeleton(
        {"model": "m", **req}, response_id="resp_r1", created=1700000000, model="M-as-sent", store=True
    )


def message(
    content: list[dict[str, Any]], stop_reason: str = "end_turn", usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": stop_reason,
        "usage": usage or USAGE,
    }


EXPLAINED = {"type": "refusal", "category": "cyber", "explanation": "This request was declined."}


def refusal_message(item_id: str, refusal: str) -> dict[str, Any]:
    content = [{"type": "refusal", "refusal": refusal}]
    return {"id": item_id, "type": "message", "status": "completed", "role": "assistant", "content": content}


def message_item(item_id: str, text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "content": content}


def refused(content: list[dict[str, Any]], stop_details: dict[str, Any] | None) -> dict[str, Any]:
    msg = message(content, "refusal")
    if stop_details is not None:
        msg["stop_details"] = stop_details
    return msg


def to_response(msg: dict[str, Any], *, summary: bool = False, sealed: bool = True) -> dict[str, Any]:
    response, _ = anthropic_to_response(
        msg, skeleton(), ids=ItemIds("k"), tools=TOOLS, summary=summary, seal=seal if sealed else None
    )
    sdk_types.response(response)
    return response


def stream_of(msg: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The Anthropic stream of ``msg``, as the real API sends it (text and arguments in pieces)."""
    start = {**msg, "content": [], "stop_reason": None, "usage": {**msg["usage"], "output_tokens": 1}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(msg["content"]):
        kind = block["type"]
        opening = copy.deepcopy(block)
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            opening = {"type": "text", "text": ""}
            text = block["text"]
            for citation in block.get("citations") or ():
                deltas.append({"type": "citations_delta", "citation": citation})
            deltas += [{"type": "text_delta", "text": text[k : k + 3]} for k in range(0, len(text), 3)]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind in ("tool_use", "server_tool_use"):
            opening = {**block, "input": {}}
            raw = json.dumps(block["input"], separators=(",", ":")) if block["input"] else ""
            deltas = [{"type": "input_json_delta", "partial_json": raw[k : k + 5]} for k in range(0, len(raw), 5)]
            deltas = deltas or [{"type": "input_json_delta", "partial_json": ""}]
        events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": opening}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}) for d in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    stop = {"stop_reason": msg["stop_reason"]} | (
        {"stop_details": msg["stop_details"]} if "stop_details" in msg else {}
    )
    delta = {"type": "message_delta", "delta": stop, "usage": msg["usage"]}
    return [*events, ("message_delta", delta), ("message_stop", {"type": "message_stop"})]


def run_stream(
    events: list[tuple[str, dict[str, Any]]], *, summary: bool = False, include: bool = False
) -> tuple[ResponseEvents, list[dict[str, Any]]]:
    translator = ResponseEvents(
        skeleton(), ids=ItemIds("k"), tools=TOOLS, summary=summary, seal=seal, include_encrypted=include
    )
    out = []
    for name, data in events:
        for kind, payload in translator.feed(name, data):
            assert payload["type"] == kind
            out.append(payload)
    assert translator.done
    out.append(translator.final_event()[1])
    for payload in out:
        sdk_types.response_event(payload)
    assert [p["sequence_number"] for p in out] == list(range(len(out)))
    # type first, sequence_number last: EventWriter splices a response event's bytes on that order
    assert all(next(iter(p)) == "type" and list(p)[-1] == "sequence_number" for p in out)
    return translator, out


def recorded(name: str) -> list[tuple[str, dict[str, Any]]]:
    raw = (FIXTURES / f"anthropic_stream_{name}.sse").read_bytes()
    return [(event, json.loads(data)) for event, data in iter_sse(iter([raw]))]


# ---------------------------------------------------------------- output


def test_text_becomes_one_message_with_output_text_and_the_request_echoed() -> None:
    r = to_response(message([{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]))
    assert r["id"] == "resp_r1" and r["object"] == "response" and r["model"] == "M-as-sent"
    assert r["status"] == "completed" and r["incomplete_details"] is None
    assert r["output"] == [
        {
            "id": "msg_k001",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}],
        }
    ]


def test_usage_counts_all_input_and_details() -> None:
    usage = {**USAGE, "output_tokens_details": {"thinking_tokens": 3}}
    r = to_response(message([{"type": "text", "text": "x"}], usage=usage))
    assert r["usage"] == {
        "input_tokens": 130,
        "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 20},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 137,
    }
    assert usage_to_responses(Usage())["total_tokens"] == 0


@pytest.mark.parametrize(
    ("stop_reason", "status", "reason"),
    [
        pytest.param("end_turn", "completed", None, id="end-turn"),
        pytest.param("tool_use", "completed", None, id="tool-use"),
        pytest.param("stop_sequence", "completed", None, id="stop-sequence"),
        pytest.param("pause_turn", "completed", None, id="pause-turn"),
        pytest.param("max_tokens", "incomplete", "max_output_tokens", id="max-tokens"),
        pytest.param("model_context_window_exceeded", "incomplete", "max_output_tokens", id="context-window"),
        pytest.param("refusal", "completed", None, id="refusal"),
    ],
)
def test_status_and_incomplete_reason(stop_reason: str, status: str, reason: str | None) -> None:
    r = to_response(message([{"type": "text", "text": "x"}], stop_reason))
    assert r["status"] == status
    assert r["incomplete_details"] == ({"reason": reason} if reason else None)


REFUSALS = [
    pytest.param([{"type": "text", "text": "I can't help with that."}], None,
                 [refusal_message("msg_k001", "I can't help with that.")], id="text-becomes-the-refusal"),
    pytest.param([{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}], None,
                 [refusal_message("msg_k001", "Hello")], id="text-blocks-joined"),
    pytest.param([], None, [refusal_message("msg_k001", "The model declined to answer.")], id="no-text-default"),
    pytest.param([{"type": "text", "text": "Hello.."}], EXPLAINED,
                 [refusal_message("msg_k001", "This request was declined.")], id="explanation-wins"),
    pytest.param([], {"type": "refusal", "category": None, "explanation": None},
                 [refusal_message("msg_k001", "The model declined to answer.")], id="null-explanation-default"),
    pytest.param([THINK], None, [{"id": "rs_k001", "type": "reasoning", "summary": []},
                                 refusal_message("msg_k002", "The model declined to answer.")], id="after-thinking"),
    pytest.param([{"type": "text", "text": "Let me look."},
                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
                  {"type": "text", "text": "No."}], None,
                 [message_item("msg_k001", "Let me look."), {"type": "function_call"},
                  refusal_message("msg_k003", "No.")], id="only-the-last-message"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "stop_details", "output"), REFUSALS)
def test_a_refusal_is_a_refusal_part_of_a_completed_response(
    content: list[dict[str, Any]], stop_details: dict[str, Any] | None, output: list[dict[str, Any]]
) -> None:
    r = to_response(refused(content, stop_details), sealed=False)
    assert r["status"] == "completed" and r["incomplete_details"] is None
    assert r["usage"]["output_tokens"] == USAGE["output_tokens"]
    assert [{k: item[k] for k in want} for item, want in zip(r["output"], output, strict=True)] == output


@pytest.mark.parametrize(("content", "stop_details", "output"), REFUSALS)
def test_a_streamed_refusal_ends_as_the_json_translation(
    content: list[dict[str, Any]], stop_details: dict[str, Any] | None, output: list[dict[str, Any]]
) -> None:
    msg = refused(content, stop_details)
    translator, out = run_stream(stream_of(msg))
    assert translator.final_response() == to_response(msg)
    assert out[-1]["type"] == "response.completed"
    refusal = output[-1]["content"][0]["refusal"]
    where = {"item_id": output[-1]["id"], "output_index": len(output) - 1, "content_index": 0}
    tail = [{k: v for k, v in p.items() if k != "sequence_number"} for p in out[-6:-1]]
    assert tail == [
        {"type": "response.content_part.added", **where, "part": {"type": "refusal", "refusal": ""}},
        {"type": "response.refusal.delta", **where, "delta": refusal},
        {"type": "response.refusal.done", **where, "refusal": refusal},
        {"type": "response.content_part.done", **where, "part": {"type": "refusal", "refusal": refusal}},
        {"type": "response.output_item.done", "output_index": where["output_index"], "item": output[-1]},
    ]
    assert "response.output_text.done" not in kinds(out[-7:])


def test_tool_calls_function_custom_and_namespaced() -> None:
    content = [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": encode_tool_id("call:2"), "name": "apply_patch", "input": {"input": "*** Begin"}},
        {"type": "tool_use", "id": "toolu_3", "name": "multi_agent__spawn", "input": {}},
    ]
    r = to_response(message(content, "tool_use"))
    first, second, third = r["output"]
    assert first == {
        "id": "fc_k001",
        "type": "function_call",
        "status": "completed",
        "arguments": '{"city":"Oslo"}',
        "call_id": "toolu_1",
        "name": "get_weather",
    }
    assert second["type"] == "custom_tool_call" and second["input"] == "*** Begin" and second["call_id"] == "call:2"
    assert third["name"] == "spawn" and third["namespace"] == "multi_agent" and third["arguments"] == "{}"


@pytest.mark.parametrize(
    ("summary", "expected_summary"),
    [
        pytest.param(False, [], id="no-summary-without-reasoning-summary"),
        pytest.param(True, [{"type": "summary_text", "text": "Check the weather."}], id="summary-text"),
    ],
)
def test_reasoning_items_one_per_thinking_block(summary: bool, expected_summary: list[Any]) -> None:
    r = to_response(message([THINK, REDACTED, {"type": "text", "text": "x"}]), summary=summary)
    thought, redacted, _ = r["output"]
    assert thought["type"] == "reasoning" and thought["summary"] == expected_summary
    assert redacted["summary"] == []
    assert thought["encrypted_content"] == seal([THINK]) and redacted["encrypted_content"] == seal([REDACTED])


def test_encrypted_content_only_for_clients_that_asked() -> None:
    r = to_response(message([THINK, {"type": "text", "text": "x"}]))
    assert "encrypted_content" not in client_view(r, False)["output"][0]
    assert client_view(r, True)["output"][0]["encrypted_content"] == seal([THINK])
    assert "encrypted_content" not in to_response(message([THINK]), sealed=False)["output"][0]


def test_web_search_calls_and_url_citations() -> None:
    citation = {
        "type": "web_search_result_location",
        "url": "https://example.com/a",
        "title": "A",
        "cited_text": "x",
        "encrypted_index": "e",
    }
    content = [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "oslo weather"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "text", "text": "It is "},
        {"type": "text", "text": "sunny", "citations": [citation]},
    ]
    r = to_response(message(content))
    search, text = r["output"]
    assert search == {
        "id": "ws_k001",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "oslo weather"},
    }
    assert text["content"][0]["text"] == "It is sunny"
    assert text["content"][0]["annotations"] == [
        {"type": "url_citation", "start_index": 6, "end_index": 11, "url": "https://example.com/a", "title": "A"}
    ]


# ---------------------------------------------------------------- streams


def kinds(out: list[dict[str, Any]]) -> list[str]:
    return [p["type"] for p in out]


def test_text_stream_event_sequence() -> None:
    _, out = run_stream(stream_of(message([{"type": "text", "text": "Hello"}])))
    assert kinds(out) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(p["delta"] for p in out if p["type"] == "response.output_text.delta") == "Hello"
    assert out[0]["response"]["status"] == "in_progress" and out[0]["response"]["output"] == []
    assert out[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"


def test_function_call_arguments_stream_as_they_arrive() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    _, out = run_stream(stream_of(message([block], "tool_use")))
    added = next(p for p in out if p["type"] == "response.output_item.added")
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"
    deltas = [p["delta"] for p in out if p["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == '{"city":"Oslo"}'
    done = next(p for p in out if p["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"city":"Oslo"}' and done["name"] == "get_weather"


def test_a_call_without_arguments_streams_an_empty_object() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    _, out = run_stream(stream_of(message([block], "tool_use")))
    assert [p["delta"] for p in out if p["type"] == "response.function_call_arguments.delta"] == ["{}"]
    assert out[-1]["response"]["output"][0]["arguments"] == "{}"


def test_custom_tool_input_events() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "apply_patch", "input": {"input": "*** Begin Patch\n"}}
    _, out = run_stream(stream_of(message([block], "tool_use")))
    assert [p["type"] for p in out if "custom_tool_call_input" in p["type"]] == [
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
    ]
    assert out[-1]["response"]["output"][0]["input"] == "*** Begin Patch\n"


def test_reasoning_summary_events_only_when_asked() -> None:
    msg = message([THINK, {"type": "text", "text": "x"}])
    _, quiet = run_stream(stream_of(msg))
    assert not [k for k in kinds(quiet) if "reasoning_summary" in k]
    _, loud = run_stream(stream_of(msg), summary=True)
    assert [k for k in kinds(loud) if "reasoning_summary" in k] == [
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]


def test_stream_encrypted_content_only_when_included() -> None:
    msg = message([THINK, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}], "tool_use")
    translator, out = run_stream(stream_of(msg))
    assert all("encrypted_content" not in json.dumps(p) for p in out)
    assert translator.final_response()["output"][0]["encrypted_content"] == seal([THINK])  # the stored copy
    _, included = run_stream(stream_of(msg), include=True)
    done = next(p for p in included if p["type"] == "response.output_item.done")
    assert done["item"]["encrypted_content"] == seal([THINK])


@pytest.mark.parametrize(
    "content",
    [
        pytest.param([{"type": "text", "text": "Hello there, world"}], id="text"),
        pytest.param(
            [THINK, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}],
            id="thinking-and-call",
        ),
        pytest.param(
            [
                {"type": "text", "text": "I'll patch. "},
                {"type": "tool_use", "id": "toolu_1", "name": "apply_patch", "input": {"input": "diff"}},
                {"type": "tool_use", "id": "toolu_2", "name": "multi_agent__spawn", "input": {}},
            ],
            id="text-custom-namespaced",
        ),
        pytest.param(
            [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                {"type": "text", "text": "Found."},
            ],
            id="web-search",
        ),
    ],
)
@pytest.mark.parametrize("summary", [False, True])
def test_stream_final_response_equals_the_json_translation(content: list[dict[str, Any]], summary: bool) -> None:
    msg = message(content, "tool_use" if content[-1]["type"] == "tool_use" else "end_turn")
    translator, _ = run_stream(stream_of(msg), summary=summary)
    assert translator.final_response() == to_response(msg, summary=summary)


@pytest.mark.parametrize("name", ["thinking_tools", "redacted_thinking_tool"])
def test_recorded_streams_match_their_messages(name: str) -> None:
    msg = json.loads((FIXTURES / f"anthropic_message_{name}.json").read_text())
    translator, _out = run_stream(recorded(name), summary=True)

    def parsed(output: list[dict[str, Any]]) -> list[dict[str, Any]]:  # arguments stream as the model wrote them
        return [
            {**item, "arguments": json.loads(item["arguments"])} if "arguments" in item else item for item in output
        ]

    assert parsed(translator.final_response()["output"]) == parsed(to_response(msg, summary=True)["output"])


def test_blocks_the_upstream_never_stopped_are_closed_at_message_stop() -> None:
    events = [e for e in stream_of(message([{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]))]
    events = [e for e in events if e[0] != "content_block_stop"]
    _, out = run_stream(events)
    assert "response.output_item.done" in kinds(out)


def test_an_error_event_ends_with_error_then_response_failed() -> None:
    translator = ResponseEvents(
        skeleton(), ids=ItemIds("k"), tools=TOOLS, summary=False, seal=None, include_encrypted=False
    )
    head = stream_of(message([{"type": "text", "text": "Hello"}]))[:3]
    for name, data in head:
        translator.feed(name, data)
    translator.feed("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert translator.error == {"type": "overloaded_error", "message": "Overloaded"} and not translator.done
    assert translator.feed("content_block_delta", head[2][1]) == []
    failed = translator.failed_events({"message": "The upstream is overloaded.", "code": None, "param": None})
    assert [k for k, _ in failed] == ["error", "response.failed"]
    for _, payload in failed:
        sdk_types.response_event(payload)
    response = failed[1][1]["response"]
    assert response["status"] == "failed" and response["error"]["message"] == "The upstream is overloaded."


def test_produced_chars_count_text_arguments_and_thinking() -> None:
    msg = message([THINK, {"type": "text", "text": "abcd"}])
    translator, _ = run_stream(stream_of(msg))
    assert translator.produced_chars == len(THINK["thinking"]) + 4


def test_a_client_run_tool_search_call_is_a_tool_search_call_item_json_and_stream() -> None:
    """Codex reads ``tool_search_call`` with ``execution: "client"`` and its arguments as an object
    (openai/codex codex-rs/protocol/src/models.rs, ResponseItem::ToolSearchCall)."""
    tools = {**TOOLS, "tool_search": ClientTool("tool_search", "tool_search")}
    args = {"query": "calendar create", "limit": 1}
    msg = message([THINK, {"type": "tool_use", "id": "search-1", "name": "tool_search", "input": args}], "tool_use")
    response, _ = anthropic_to_response(msg, skeleton(), ids=ItemIds("k"), tools=tools, summary=False, seal=None)
    sdk_types.response(response)
    expected = {
        "id": "tsc_k002",
        "type": "tool_search_call",
        "status": "completed",
        "call_id": "search-1",
        "execution": "client",
        "arguments": args,
    }
    assert response["output"][1] == expected
    translator = ResponseEvents(
        skeleton(), ids=ItemIds("k"), tools=tools, summary=False, seal=None, include_encrypted=False
    )
    out = [payload for name, data in stream_of(msg) for _, payload in translator.feed(name, data)]
    for payload in out:
        sdk_types.response_event(payload)
    added = [p for p in out if p["type"] == "response.output_item.added"][1]
    assert added["item"]["type"] == "tool_search_call" and added["item"]["status"] == "in_progress"
    done = [p for p in out if p["type"] == "response.output_item.done"][1]
    assert done["item"] == expected
    assert not [p for p in out if "function_call_arguments" in p["type"]]
    assert translator.final_response()["output"] == response["output"]
