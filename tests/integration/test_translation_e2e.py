"""The full translation through the real gateway and the simulator: tools round
trip, a PDF, a data-URL image, structured output, reasoning with tools, refusals — and every
request that reached the upstream validates against the anthropic SDK's types."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.integration.harness import Gateway, Sim
from tests.support.anthropic_types import validate_anthropic_request

MODEL = "anthropic/claude-sonnet-5-5"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
PDF = "JVBERi0xLjQKJcOkw7zDtsOfCjIgMCBvYmoKPDwvTGVuZ3RoIDMgMCBSPj4Kc3RyZWFtCg=="
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
pytestmark = pytest.mark.integration


@pytest.fixture()
def client(gateway: Gateway, key: str, sim: Sim) -> openai.OpenAI:
    sim.clear()
    return openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0)


def last_upstream(sim: Sim) -> dict[str, Any]:
    body = sim.bodies()[-1]
    validate_anthropic_request(body)
    return body


def test_tools_round_trip(client: openai.OpenAI, sim: Sim) -> None:
    messages: list[Any] = [{"role": "user", "content": "What's the weather in Oslo? Use the tool."}]
    first = client.chat.completions.create(model=MODEL, max_tokens=64, messages=messages, tools=TOOLS)
    assert first.choices[0].finish_reason == "tool_calls"
    call = (first.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "example"}
    messages.append(first.choices[0].message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "9°C and clear"})
    second = client.chat.completions.create(model=MODEL, max_tokens=64, messages=messages, tools=TOOLS)
    assert second.choices[0].finish_reason == "stop" and "9°C and clear" in (second.choices[0].message.content or "")
    upstream = last_upstream(sim)
    assert [m["role"] for m in upstream["messages"]] == ["user", "assistant", "user"]
    result = upstream["messages"][2]["content"][0]
    result.pop("cache_control", None)  # the automatic breakpoint on the newest message
    assert result == {"type": "tool_result", "tool_use_id": call.id, "content": "9°C and clear"}


def test_pdf_and_data_url_image(client: openai.OpenAI, sim: Sim) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        max_tokens=32,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe both."},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"}},
                    {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "a.pdf"}},
                ],
            }
        ],
    )
    assert completion.choices[0].message.content
    blocks = last_upstream(sim)["messages"][0]["content"]
    assert [b["type"] for b in blocks] == ["text", "image", "document"]
    assert blocks[1]["source"] == {"type": "base64", "media_type": "image/png", "data": PNG}
    assert blocks[2]["source"]["media_type"] == "application/pdf"


def test_structured_output(client: openai.OpenAI, sim: Sim) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "temp": {"type": "integer"}},
        "required": ["city", "temp"],
        "additionalProperties": False,
    }
    completion = client.chat.completions.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "Weather as JSON"}],
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}},
    )
    assert json.loads(completion.choices[0].message.content or "") == {"city": "example", "temp": 1}
    upstream = last_upstream(sim)
    assert upstream["output_config"]["format"] == {"type": "json_schema", "schema": schema}
    assert "tools" not in upstream


def test_reasoning_with_tools(client: openai.OpenAI, sim: Sim) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        max_completion_tokens=2000,
        reasoning_effort="high",
        tools=TOOLS,
        messages=[{"role": "user", "content": "Use the tool for Oslo."}],
    )
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens > 0
    assert completion.choices[0].message.content is None  # thinking text is never returned
    upstream = last_upstream(sim)
    assert upstream["thinking"] == {"type": "adaptive"} and upstream["output_config"]["effort"] == "high"
    forced = client.chat.completions.create(
        model=MODEL,
        max_completion_tokens=2000,
        reasoning_effort="high",
        tools=TOOLS,
        tool_choice="required",
        messages=[{"role": "user", "content": "Oslo"}],
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    assert "thinking" not in last_upstream(sim)


def test_budget_model_sampling_and_prefill(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    client = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0)
    client.chat.completions.create(
        model="claude-haiku-4-5",
        max_tokens=100,
        temperature=1.7,
        top_p=0.5,
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, "}],
    )
    upstream = last_upstream(sim)
    assert upstream["temperature"] == 1 and "top_p" not in upstream
    assert upstream["messages"][-1]["content"][0]["text"] == "Hello,"  # prefill without trailing space


def test_always_thinking_model_refuses_a_forced_tool(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="claude-thinker",
            max_tokens=64,
            tools=TOOLS,
            tool_choice="required",
            messages=[{"role": "user", "content": "x"}],
        )
    assert info.value.body["param"] == "tool_choice"  # type: ignore[index]


@pytest.mark.parametrize(
    "marker, finish", [("[[sim:refusal]]", "content_filter"), ("[[sim:context]]", "length"), ("[[sim:pause]]", "stop")]
)
def test_finish_reasons_from_the_upstream(client: openai.OpenAI, marker: str, finish: str) -> None:
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": f"x {marker}"}]
    )
    assert completion.choices[0].finish_reason == finish


def test_max_tokens_cut_is_length(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "x [[sim:words=50]]"}]
    )
    assert completion.choices[0].finish_reason == "length" and completion.usage is not None
    assert completion.usage.completion_tokens <= 3


def test_automatic_cache_breakpoints_and_cache_usage(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    client = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0)
    system = "You are a careful assistant. " * 60
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "First question?"}]
    first = client.chat.completions.create(model=MODEL, max_tokens=16, messages=messages)
    upstream = last_upstream(sim)
    assert upstream["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert upstream["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cache_write_tokens > 0  # type: ignore[attr-defined]
    second = client.chat.completions.create(model=MODEL, max_tokens=16, messages=messages)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    off = client.chat.completions.create(
        model=MODEL,
        max_tokens=16,
        messages=messages,
        extra_headers={"x-ezat-cache": "off"},
        prompt_cache_key="conversation-42",
    )
    assert off.usage is not None
    upstream = last_upstream(sim)
    assert "cache_control" not in json.dumps(upstream) and "conversation-42" not in json.dumps(upstream)
