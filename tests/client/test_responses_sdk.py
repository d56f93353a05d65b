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


def _references(response: openai.types.responses.Response) -> list[dict[str, str]]:
    """What the AI SDK's ``openai(model)`` sends back of a stored response: a reference per item."""
    return [{"type": "item_reference", "id": item.id} for item in response.output if item.id]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_item_references_replay_a_stored_tool_loop(gateway: Gateway, key: str, sim: Sim, stream: bool) -> None:
    """Store on, reasoning on, a tool loop, then a second user turn: every earlier output item
    (reasoning, the function call, the message) goes back as an item_reference, as the AI SDK
    sends them, and becomes the stored item, its thinking back exactly as signed."""
    api = client(gateway, key)
    history: list = [{"role": "user", "content": "Weather in Oslo? Use the tool"}]
    sim.clear()

    def turn() -> openai.types.responses.Response:
        kwargs = {"model": MODEL, "input": history, "tools": [WEATHER], "reasoning": {"effort": "high"}}
        if stream:
            with api.responses.stream(**kwargs) as events:
                return events.get_final_response()
        return api.responses.create(**kwargs)

    first = turn()
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    history += _references(first)
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"})
    second = turn()
    assert second.output_text.startswith("Tool results: sunny, 21 C")
    history += [*_references(second), {"role": "user", "content": "Thanks. And tomorrow?"}]
    third = turn()
    assert third.status == "completed"
    bodies = sim.bodies()
    assert len(bodies) == 3
    last = bodies[2]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert [b["type"] for b in last[1]["content"]] == ["thinking", "tool_use"]
    assert last[1]["content"][0] == bodies[1]["messages"][1]["content"][0]  # the same signed thinking
    assert last[1]["content"][1]["id"] == call.call_id
    assert last[3]["content"][-1]["text"] == second.output_text
    items = api.responses.input_items.list(third.id, order="asc").data
    assert [item.id for item in items[1:3]] == [first.output[0].id, call.id]  # stored as resolved


def test_item_references_from_a_store_false_request_and_beside_previous_response_id(
    gateway: Gateway, key: str, sim: Sim
) -> None:
    api = client(gateway, key)
    first = api.responses.create(model=MODEL, input="My name is Ada.")
    other = api.responses.create(model=MODEL, input="I live in Oslo.")
    sim.clear()
    stateless = api.responses.create(
        model=MODEL,
        store=False,
        input=[{"role": "user", "content": "Hi"}, *_references(first), {"role": "user", "content": "Who am I?"}],
    )
    assert stateless.store is False
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(stateless.id)
    continued = api.responses.create(
        model=MODEL, previous_response_id=first.id, input=[*_references(other), {"role": "user", "content": "Where?"}]
    )
    assert continued.status == "completed"
    one, two = sim.bodies()
    assert one["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": first.output_text}]}
    assert [m["role"] for m in two["messages"]] == ["user", "assistant", "user"]  # the two answers, one turn
    assert [b["text"] for b in two["messages"][1]["content"]] == [first.output_text, other.output_text]


def _not_found(api: openai.OpenAI, item_id: str, **kwargs: object) -> dict:
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.create(
            model=MODEL, input=[{"role": "user", "content": "Hi"}, {"type": "item_reference", "id": item_id}], **kwargs
        )
    assert caught.value.status_code == 404
    return caught.value.body  # type: ignore[return-value]


def test_an_unknown_or_another_organisations_item_is_the_same_404(gateway: Gateway, key: str) -> None:
    mine = client(gateway, key).responses.create(model=MODEL, input="Hello")
    item = mine.output[0].id
    theirs = client(gateway, gateway.new_key("other-org"))
    unknown = item[:-3] + "999"
    for body, missing in ((_not_found(theirs, item), item), (_not_found(theirs, unknown), unknown)):
        assert body == {
            "message": f"Item with id '{missing}' not found.",
            "type": "invalid_request_error",
            "param": "input[1].id",
            "code": None,
        }
    stateless = _not_found(client(gateway, key), "msg_abc", store=False)
    assert stateless["message"].startswith("Item with id 'msg_abc' not found. Items are not persisted when `store`")
