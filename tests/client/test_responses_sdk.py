"""The official ``openai`` Python SDK on the Responses endpoint (docs/responses.md), against the
gateway and the strict simulator: ``responses.create``, ``responses.stream``,
``responses.parse`` with a pydantic model, ``previous_response_id`` and a function-tool loop."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from tests.integration.harness import Gateway, Sim

MODEL = "anthropic/claude-sonnet-5-5"
pytestmark = pytest.mark.integration
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Weather(BaseModel):
    city: str
    degrees: int


def client(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0)


def test_create(gateway: Gateway, key: str) -> None:
    response = client(gateway, key).responses.create(model=MODEL, input="What is a prompt cache?", max_output_tokens=64)
    assert response.status == "completed" and response.model == MODEL
    assert response.output_text.endswith("You said: What is a prompt cache?")
    assert response.id == "resp_" + (response._request_id or "")
    assert response.usage is not None and response.usage.total_tokens > 0


def test_stream(gateway: Gateway, key: str) -> None:
    deltas = []
    with client(gateway, key).responses.stream(model=MODEL, input="Count to five", max_output_tokens=64) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert final.status == "completed" and "".join(deltas) == final.output_text and len(deltas) > 1


def test_parse_with_a_pydantic_model(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    response = client(gateway, key).responses.parse(model=MODEL, input="Weather in Oslo as JSON", text_format=Weather)
    parsed = response.output_parsed
    assert isinstance(parsed, Weather)
    (sent,) = sim.bodies()
    schema = sent["output_config"]["format"]["schema"]
    assert schema["additionalProperties"] is False and set(schema["required"]) == {"city", "degrees"}


def test_previous_response_id(gateway: Gateway, key: str, sim: Sim) -> None:
    api = client(gateway, key)
    first = api.responses.create(model=MODEL, input="My name is Ada.")
    sim.clear()
    second = api.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    (sent,) = sim.bodies()
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert api.responses.retrieve(first.id).output_text == first.output_text
    items = api.responses.input_items.list(second.id)
    assert [item.content[0].text for item in items.data] == ["What is my name?"]  # type: ignore[union-attr]
    api.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(first.id)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_function_tool_loop_with_reasoning(gateway: Gateway, key: str, sim: Sim, stream: bool) -> None:
    api = client(gateway, key)
    history: list = [{"role": "user", "content": "Weather in Oslo? Use the tool [[sim:tools=2]]"}]
    sim.clear()
    for _ in range(2):
        kwargs = {"model": MODEL, "input": history, "tools": [WEATHER], "reasoning": {"effort": "high"}}
        if stream:
            with api.responses.stream(**kwargs) as events:
                response = events.get_final_response()
        else:
            response = api.responses.create(**kwargs)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        history += response.output
        for call in calls:
            assert json.loads(call.arguments) == {"city": "example"}
            history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"})
    assert response.output_text.startswith("Tool results: sunny, 21 C")
    bodies = sim.bodies()
    assert len(bodies) == 2 and all("thinking" in body for body in bodies)
    assert bodies[1]["messages"][1]["content"][0]["type"] == "thinking"  # kept across the loop
