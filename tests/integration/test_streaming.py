"""``stream: true`` through the real gateway (Chat Completions reference, "Streaming"; API
reference, "Response Body"): chunk order, usage chunk, keep-alive, mid-stream errors, early close."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest
import requests
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.integration.harness import Gateway, Sim

MODEL = "anthropic/claude-sonnet-5-5"
pytestmark = pytest.mark.integration
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def stream_lines(gateway: Gateway, key: str, body: dict[str, Any]) -> tuple[requests.Response, list[str]]:
    with requests.post(
        gateway.url + "/openai/v1/chat/completions",
        json={**body, "stream": True},
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=60,
    ) as resp:
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    return resp, lines


def data_of(lines: list[str]) -> list[Any]:
    return [line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def body(text: str = "Count from 1 to 10.", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": text}], **extra}


def test_the_spec_stream_with_the_openai_sdk(gateway: Gateway, key: str) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Count from 1 to 10."}],
    )
    chunks = list(stream)
    first, last_choice, usage_chunk = chunks[0], chunks[-2], chunks[-1]
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert last_choice.choices[0].finish_reason == "stop"
    assert last_choice.choices[0].delta.content is None and last_choice.choices[0].delta.role is None
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + usage_chunk.usage.completion_tokens
    assert {(c.id, c.created, c.model) for c in chunks} == {(first.id, first.created, MODEL)}
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_sse_rules_and_headers(gateway: Gateway, key: str) -> None:
    resp, lines = stream_lines(gateway, key, body(stream_options={"include_usage": True}))
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["cache-control"] == "no-cache" and resp.headers["x-accel-buffering"] == "no"
    assert "content-length" not in resp.headers
    events = data_of(lines)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[0]["id"] == "chatcmpl-" + resp.headers["request-id"]
    assert events[-3]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert events[-2]["choices"] == [] and set(events[-2]["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    }


def test_no_usage_chunk_without_include_usage(gateway: Gateway, key: str) -> None:
    _, lines = stream_lines(gateway, key, body())
    events = data_of(lines)
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1]) and all("usage" not in e for e in events[:-1])


def test_usage_is_recorded_before_done(gateway: Gateway) -> None:
    key = gateway.new_key("stream-usage-org")
    resp, lines = stream_lines(gateway, key, body(stream_options={"include_usage": True}))
    usage = data_of(lines)[-2]["usage"]
    (row,) = gateway.usage("--org", "stream-usage-org")  # read right after [DONE], no waiting
    assert row["request_id"] == resp.headers["request-id"] and row["status"] == 200 and not row["estimated"]
    assert row["output_tokens"] == usage["completion_tokens"]
    assert row["input_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"] == usage["prompt_tokens"]


def test_tool_calls_stream_id_and_name_first_then_arguments(gateway: Gateway, key: str) -> None:
    _, lines = stream_lines(
        gateway, key, body("What's the weather in Oslo? Use the tool. [[sim:tools=3]]", tools=TOOLS)
    )
    events = data_of(lines)[:-1]
    calls = [e["choices"][0]["delta"]["tool_calls"][0] for e in events if e["choices"][0]["delta"].get("tool_calls")]
    starts = [c for c in calls if "id" in c]
    assert [c["index"] for c in starts] == [0, 1, 2]
    assert all(c["function"]["name"] == "get_weather" and c["type"] == "function" for c in starts)
    for index in range(3):
        mine = [c for c in calls if c["index"] == index]
        assert "id" in mine[0] and all("id" not in c for c in mine[1:])
        assert json.loads("".join(c["function"].get("arguments", "") for c in mine)) == {"city": "example"}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    state = ChatCompletionStreamState()
    for event in events:
        state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(event))
    final = state.get_final_completion()
    assert len(final.choices[0].message.tool_calls or []) == 3


def test_thinking_is_never_sent_but_counted(gateway: Gateway, key: str) -> None:
    _, lines = stream_lines(
        gateway, key, body("Think first.", reasoning_effort="high", stream_options={"include_usage": True})
    )
    events = data_of(lines)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    assert "think" not in text.lower() or "Think first" in text
    assert events[-2]["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_keepalive_pings_while_the_upstream_is_silent(gateway: Gateway, key: str) -> None:
    started = time.monotonic()
    _, lines = stream_lines(gateway, key, body("Wait for it [[sim:stall=2.6]]"))
    assert time.monotonic() - started >= 2.5
    assert lines.count(": ping") >= 2  # keepalive_s = 1 in this gateway
    assert lines[-1] == "data: [DONE]"
    openai_lines = [line for line in lines if not line.startswith(":")]
    assert all(line.startswith("data: ") for line in openai_lines)


@pytest.mark.parametrize("marker", ["[[sim:cut=5]]", "[[sim:error_after=5]]"], ids=["connection-cut", "error-event"])
def test_failure_after_the_start_sends_an_error_then_done_and_is_not_billed(gateway: Gateway, marker: str) -> None:
    key = gateway.new_key(f"midstream-{marker[6:9]}")
    org = f"midstream-{marker[6:9]}"
    resp, lines = stream_lines(
        gateway, key, body(f"Tell me more {marker} [[sim:words=40]]", stream_options={"include_usage": True})
    )
    assert resp.status_code == 200
    events = data_of(lines)
    assert events[-1] == "[DONE]"
    assert set(events[-2]) == {"error"} and set(events[-2]["error"]) == {"message", "type", "param", "code"}
    assert not any(e != "[DONE]" and "usage" in e and e.get("choices") == [] for e in events)
    (row,) = gateway.usage("--org", org)
    assert row["cost_usd"] == "0.000000" and row["status"] >= 500


def test_failure_before_the_first_chunk_is_a_normal_json_error(gateway: Gateway, key: str) -> None:
    resp = requests.post(
        gateway.url + "/openai/v1/chat/completions",
        json={**body("hi"), "stream": True, "model": "gpt-9"},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert resp.status_code == 404 and resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"]["code"] == "model_not_found"


def test_client_closing_early_closes_the_upstream_and_bills_an_estimate(gateway: Gateway, sim: Sim) -> None:
    key = gateway.new_key("early-close-org")
    sim.clear()
    resp = requests.post(
        gateway.url + "/openai/v1/chat/completions",
        json=body("Long story [[sim:words=400,token_delay_ms=100]]", max_tokens=2000, stream=True),
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=60,
    )
    seen = 0
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            seen += 1
            if seen == 3:  # the role chunk and two content chunks
                break
    resp.close()
    deadline = time.monotonic() + 15
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = gateway.usage("--org", "early-close-org")
        if rows and sim.stats()["streams_aborted"] >= 1:
            break
        time.sleep(0.2)
    (row,) = rows
    assert row["estimated"] is True and row["status"] == 499
    assert 0 < row["output_tokens"] < 400 and float(row["cost_usd"]) > 0
    assert sim.stats()["streams_aborted"] == 1  # the upstream connection was closed at once
    assert sim.stats()["open_streams"] == 0


def test_keepalive_pings_while_the_model_is_thinking(gateway: Gateway, key: str) -> None:
    # The upstream is not silent (thinking deltas keep coming) but nothing reaches the client.
    started = time.monotonic()
    _, lines = stream_lines(
        gateway,
        key,
        body("Ponder [[sim:thinking_tokens=100,token_delay_ms=150]]", reasoning_effort="high", max_tokens=2000),
    )
    elapsed = time.monotonic() - started
    first_content = next(i for i, line in enumerate(lines) if '"content":"' in line and '"content":""' not in line)
    pings_before_text = lines[:first_content].count(": ping")
    assert elapsed > 2 and pings_before_text >= int(elapsed * 0.4), (elapsed, lines[:first_content])
