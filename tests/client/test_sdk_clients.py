"""Real client libraries against the real gateway and the strict simulator: the request id the
OpenAI SDK reads (``x-request-id``), and structured output as instructor (JSON_SCHEMA mode) and
LangChain (``with_structured_output(dict, method="json_schema")``) send it. The simulator
refuses a schema that breaks Anthropic's structured-output rules, so an answer means what
reached it passed them (Chat Completions reference, "Structured output"; Anthropic's structured
outputs guide, "JSON Schema limitations").
"""

from __future__ import annotations

import json
from typing import Any

import instructor
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration
MODEL = "anthropic/claude-sonnet-5-5"


def _objects(schema: Any) -> list[dict[str, Any]]:
    """Every object schema inside ``schema`` (properties, items, $defs, anyOf…)."""
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            found.append(schema)
        for value in schema.values():
            found += _objects(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _objects(value)
    return found


def upstream_schema(sim: Sim) -> dict[str, Any]:
    """The structured-output schema of the last request the simulator accepted, checked against
    the rules it holds every schema to (it answered, so they passed): every object closed."""
    body = sim.bodies()[-1]
    schema = body["output_config"]["format"]["schema"]
    assert "$schema" not in json.dumps(schema)
    objects = _objects(schema)
    assert objects and all(o.get("additionalProperties") is False for o in objects), schema
    return schema


@pytest.fixture()
def client(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0, timeout=30)


# ---------------------------------------------------------------- request ids (x-request-id)


def test_openai_python_reads_the_request_id(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    completion = raw.parse()
    assert completion._request_id is not None
    assert completion._request_id == raw.headers["request-id"] == raw.headers["x-request-id"]
    assert completion.id == f"chatcmpl-{completion._request_id}"
    again = client.chat.completions.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert again._request_id and again._request_id != completion._request_id


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"model": "anthropic/no-such-model"}, openai.NotFoundError),
        ({"model": MODEL, "temperature": 7}, openai.BadRequestError),
        ({"model": MODEL, "messages": [{"role": "user", "content": "[[sim:status=529]]"}]}, openai.APIStatusError),
    ],
    ids=["404", "400", "upstream-529"],
)
def test_openai_python_reads_the_request_id_of_an_error(
    client: openai.OpenAI, kwargs: dict[str, Any], error: type[openai.APIStatusError]
) -> None:
    params: dict[str, Any] = {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(error) as caught:
        client.chat.completions.create(**params)
    assert caught.value.request_id is not None
    assert caught.value.request_id == caught.value.response.headers["request-id"]


def test_openai_python_stream_request_id(client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, max_tokens=16, stream=True, messages=[{"role": "user", "content": "hi"}]
    ) as response:
        ids = {chunk.id for chunk in response.parse()}
        assert response.headers["x-request-id"] == response.headers["request-id"]
    assert ids == {"chatcmpl-" + response.headers["request-id"]}


# ---------------------------------------------------------------- structured output libraries


class City(BaseModel):
    name: str = Field(min_length=1, description="The city's name")
    population: int = Field(ge=0)


class Weather(BaseModel):
    """The weather in one city."""

    city: City
    temperature_c: float
    tags: list[str] = Field(max_length=5)
    note: str | None = None


def test_instructor_json_schema_mode(client: openai.OpenAI, sim: Sim) -> None:
    sim.clear()
    patched = instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA)
    weather = patched.chat.completions.create(
        model=MODEL,
        max_tokens=400,
        max_retries=0,
        response_model=Weather,
        messages=[{"role": "user", "content": "The weather in Oslo, as JSON."}],
    )
    assert isinstance(weather, Weather) and isinstance(weather.city, City)
    schema = upstream_schema(sim)
    assert set(schema["properties"]) == {"city", "temperature_c", "tags", "note"}
    assert len(sim.bodies()) == 1  # no retry: the first answer validated


DICT_SCHEMA: dict[str, Any] = {
    "title": "forecast",
    "description": "A short forecast",
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 200},
        "days": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"day": {"type": "string", "format": "date"}, "high_c": {"type": "number"}},
                "required": ["day", "high_c"],
            },
        },
    },
    "required": ["summary", "days"],
}


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_langchain_with_structured_output_json_schema(gateway: Gateway, key: str, sim: Sim, stream: bool) -> None:
    sim.clear()
    llm = ChatOpenAI(
        model=MODEL, base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0, timeout=30, max_tokens=400
    )  # type: ignore[call-arg]
    structured = llm.with_structured_output(DICT_SCHEMA, method="json_schema")
    prompt = "A two-day forecast for Oslo."
    result: Any = list(structured.stream(prompt))[-1] if stream else structured.invoke(prompt)
    assert isinstance(result, dict) and set(result) == {"summary", "days"}
    assert isinstance(result["days"], list) and result["days"] and set(result["days"][0]) == {"day", "high_c"}
    schema = upstream_schema(sim)
    assert schema["properties"]["days"]["items"]["required"] == ["day", "high_c"]
    assert len(sim.bodies()) == 1
