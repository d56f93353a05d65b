"""The wire schemas of the three dialects: one wording for one fault, in the spec's path form
(Chat Completions reference, "Ignored and refused fields"; docs/responses.md, "Refused fields",
"Input items", "Tools"), and a 400 for any JSON — never another error.

Each row is one rule: the body, then the exact ``path: message`` the gateway answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import Schema, ValidationError

from ezat_compat.wire.anthropic import load_messages_request
from ezat_compat.wire.loading import ByKeys, RequestValidationError
from ezat_compat.wire.openai import ChatCompletionRequestSchema, load_chat_request
from ezat_compat.wire.paths import first_error, format_error
from ezat_compat.wire.responses import load_responses_request

USER = {"role": "user", "content": "hi"}
CHAT = {"model": "m", "messages": [USER]}
RESPONSES = {"model": "m", "input": "hi"}
NATIVE = {"model": "m", "max_tokens": 5, "messages": [USER]}
LOADERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "chat": load_chat_request,
    "responses": load_responses_request,
    "messages": load_messages_request,
}


def refusal(dialect: str, body: Any) -> str:
    try:
        LOADERS[dialect](body)
    except RequestValidationError as exc:
        return format_error(exc.path, exc.message)
    raise AssertionError(f"{dialect} accepted {body!r}")


def chat_part(part: dict[str, Any]) -> dict[str, Any]:
    return {**CHAT, "messages": [{"role": "user", "content": [part]}]}


def responses_part(part: dict[str, Any]) -> dict[str, Any]:
    return {**RESPONSES, "input": [{"role": "user", "content": [part]}]}


# One fault, one wording: (fault, dialect, body, the answer).
SAME_FAULT = [
    ("body-not-an-object", "chat", [], "The request body must be a JSON object."),
    ("body-not-an-object", "responses", "hi", "The request body must be a JSON object."),
    ("body-not-an-object", "messages", None, "The request body must be a JSON object."),
    ("model-missing", "chat", {"messages": [USER]}, "model: Missing data for required field."),
    ("model-missing", "responses", {"input": "hi"}, "model: Missing data for required field."),
    ("model-missing", "messages", {"max_tokens": 5}, "model: Missing data for required field."),
    ("model-not-a-string", "chat", {**CHAT, "model": 5}, "model: Not a valid string."),
    ("model-not-a-string", "responses", {**RESPONSES, "model": ["m"]}, "model: Not a valid string."),
    ("model-not-a-string", "messages", {**NATIVE, "model": {}}, "model: Not a valid string."),
    ("model-null", "chat", {**CHAT, "model": None}, "model: Field may not be null."),
    ("model-null", "responses", {**RESPONSES, "model": None}, "model: Field may not be null."),
    ("model-null", "messages", {**NATIVE, "model": None}, "model: Field may not be null."),
    ("model-too-long", "chat", {**CHAT, "model": "m" * 129}, "model: Length must be between 1 and 128."),
    ("model-too-long", "responses", {**RESPONSES, "model": ""}, "model: Length must be between 1 and 128."),
    ("stream-not-a-boolean", "chat", {**CHAT, "stream": "yes"}, "stream: Not a valid boolean."),
    ("stream-not-a-boolean", "responses", {**RESPONSES, "stream": 1}, "stream: Not a valid boolean."),
    ("store-not-a-boolean", "responses", {**RESPONSES, "store": "no"}, "store: Not a valid boolean."),
    ("parallel-not-a-boolean", "chat", {**CHAT, "parallel_tool_calls": 0}, "parallel_tool_calls: Not a valid boolean."),
    ("parallel-not-a-boolean", "responses", {**RESPONSES, "parallel_tool_calls": "x"},
     "parallel_tool_calls: Not a valid boolean."),
    ("limit-not-an-integer", "chat", {**CHAT, "max_tokens": "64"}, "max_tokens: Not a valid integer."),
    ("limit-not-an-integer", "responses", {**RESPONSES, "max_output_tokens": 1.5},
     "max_output_tokens: Not a valid integer."),
    ("limit-below-1", "chat", {**CHAT, "max_completion_tokens": 0},
     "max_completion_tokens: Must be greater than or equal to 1."),
    ("limit-below-1", "responses", {**RESPONSES, "max_output_tokens": 0},
     "max_output_tokens: Must be greater than or equal to 1."),
    ("temperature-out-of-range", "chat", {**CHAT, "temperature": 3},
     "temperature: Must be greater than or equal to 0 and less than or equal to 2."),
    ("temperature-out-of-range", "responses", {**RESPONSES, "temperature": -1},
     "temperature: Must be greater than or equal to 0 and less than or equal to 2."),
    ("top-p-not-a-number", "chat", {**CHAT, "top_p": "1"}, "top_p: Not a valid number."),
    ("top-p-not-a-number", "responses", {**RESPONSES, "top_p": True}, "top_p: Not a valid number."),
    ("top-logprobs", "chat", {**CHAT, "top_logprobs": 2}, "top_logprobs: log probabilities are not available"),
    ("top-logprobs", "responses", {**RESPONSES, "top_logprobs": 2},
     "top_logprobs: log probabilities are not available"),
    ("effort-unknown", "chat", {**CHAT, "reasoning_effort": "huge"},
     "reasoning_effort: use one of none, minimal, low, medium, high, xhigh, max"),
    ("effort-unknown", "responses", {**RESPONSES, "reasoning": {"effort": "huge"}},
     "reasoning.effort: use one of none, minimal, low, medium, high, xhigh, max"),
    ("audio-part", "chat", chat_part({"type": "input_audio", "input_audio": {}}),
     "messages[0].content[0]: audio input is not supported"),
    ("audio-part", "responses", responses_part({"type": "input_audio"}),
     "input[0].content[0]: audio input is not supported"),
    ("part-type-unknown", "chat", chat_part({"type": "hologram"}),
     "messages[0].content[0].type: Must be one of: text, image_url, file."),
    ("part-type-unknown", "responses", responses_part({"type": "hologram"}),
     "input[0].content[0].type: Must be one of: input_text, output_text, text, summary_text, refusal, input_image, "
     "input_file."),
    ("part-not-an-object", "chat", chat_part("hi"),  # type: ignore[arg-type]
     "messages[0].content[0]: Not a valid object."),
    ("part-not-an-object", "responses", responses_part(5),  # type: ignore[arg-type]
     "input[0].content[0]: Not a valid object."),
    ("text-missing", "chat", chat_part({"type": "text"}),
     "messages[0].content[0].text: Missing data for required field."),
    ("text-missing", "responses", responses_part({"type": "input_text"}),
     "input[0].content[0].text: Missing data for required field."),
    ("image-url-missing", "chat", chat_part({"type": "image_url", "image_url": {}}),
     "messages[0].content[0].image_url.url: Missing data for required field."),
    ("image-url-missing", "responses", responses_part({"type": "input_image"}),
     "input[0].content[0].image_url: Missing data for required field."),
    ("content-wrong-type", "chat", {**CHAT, "messages": [{"role": "user", "content": 5}]},
     "messages[0].content: Must be a string or a list."),
    ("content-wrong-type", "responses", {**RESPONSES, "input": [{"role": "user", "content": {}}]},
     "input[0].content: Must be a string or a list."),
    ("role-unknown", "chat", {**CHAT, "messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role: Must be one of: system, developer, user, assistant, tool."),
    ("role-unknown", "responses", {**RESPONSES, "input": [{"role": "robot", "content": "x"}]},
     "input[0].role: Must be one of: user, assistant, system, developer."),
    ("call-id-empty", "chat",
     {**CHAT, "messages": [USER, {"role": "assistant", "tool_calls": [{"id": "", "function": {"name": "f"}}]}]},
     "messages[1].tool_calls[0].id: Shorter than minimum length 1."),
    ("call-id-empty", "responses",
     {**RESPONSES, "input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]},
     "input[0].call_id: Shorter than minimum length 1."),
    ("json-object-format", "chat", {**CHAT, "response_format": {"type": "json_object"}},
     'response_format: type "json_object" is not supported; use "json_schema" with a schema (objects need '
     '"additionalProperties": false)'),
    ("json-object-format", "responses", {**RESPONSES, "text": {"format": {"type": "json_object"}}},
     'text.format.type: type "json_object" is not supported; use "json_schema" with a schema (objects need '
     '"additionalProperties": false)'),
    ("object-wanted", "chat", {**CHAT, "stream_options": 5}, "stream_options: Not a valid object."),
    ("object-wanted", "responses", {**RESPONSES, "reasoning": "high"}, "reasoning: Not a valid object."),
    ("tag-null", "chat", chat_part({"type": None}), "messages[0].content[0].type: Field may not be null."),
    ("tag-null", "responses", {**RESPONSES, "input": [{"type": None}]}, "input[0].type: Field may not be null."),
    ("tag-missing", "chat", {**CHAT, "messages": [{"content": "x"}]},
     "messages[0].role: Missing data for required field."),
    ("tag-missing", "responses", {**RESPONSES, "tools": [{"name": "f"}]},
     "tools[0].type: Missing data for required field."),
    ("tools-not-a-list", "chat", {**CHAT, "tools": {}}, "tools: Not a valid list."),
    ("tools-not-a-list", "responses", {**RESPONSES, "tools": "x"}, "tools: Not a valid list."),
    ("parameters-not-an-object", "chat",
     {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters: Not a valid object."),
    ("parameters-not-an-object", "responses",
     {**RESPONSES, "tools": [{"type": "function", "name": "f", "parameters": 1}]},
     "tools[0].parameters: Not a valid object."),
]  # fmt: skip


@pytest.mark.parametrize(
    ("dialect", "body", "answer"), [row[1:] for row in SAME_FAULT], ids=[f"{r[0]}-{r[1]}" for r in SAME_FAULT]
)
def test_one_fault_has_one_wording(dialect: str, body: Any, answer: str) -> None:
    assert refusal(dialect, body) == answer


# The Responses refusals docs/responses.md words, word for word.
RESPONSES_REFUSED = [
    ("background", {"background": True},
     "background: background responses are not supported; send the request and wait for it"),
    ("conversation", {"conversation": "conv_1"},
     "conversation: conversations are not supported; use previous_response_id"),
    ("prompt", {"prompt": {"id": "pmpt_1"}}, "prompt: prompt templates are not supported; send instructions and input"),
    ("top-logprobs", {"top_logprobs": 5}, "top_logprobs: log probabilities are not available"),
    ("include", {"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]},
     'include[1]: "message.output_text.logprobs" is not supported'),
    ("include-unknown", {"include": ["web_search_call.action.sources", "web_search_call.everything"]},
     'include[1]: "web_search_call.everything" is not supported'),
    ("include-not-a-string", {"include": [["file_search_call.results"]]},
     'include[0]: ["file_search_call.results"] is not supported'),
    ("item-reference-without-id", {"input": [USER, {"type": "item_reference"}]},
     "input[1].id: Missing data for required field."),
    ("item-reference-id-not-a-string", {"input": [USER, {"type": "item_reference", "id": 7}]},
     "input[1].id: Not a valid string."),
    ("unknown-item", {"input": [{"type": "computer_call"}]},
     'input[0].type: unsupported input item type "computer_call"'),
    ("built-in-tool", {"tools": [{"type": "code_interpreter"}]},
     'tools[0].type: the built-in tool "code_interpreter" is not supported'),
    ("unknown-tool", {"tools": [{"type": "laser"}]},
     'tools[0].type: unsupported tool type "laser"; use function or custom tools'),
    ("namespace-member", {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "mcp"}]}]},
     "tools[0].tools[0].type: must be function or custom"),
    ("summary-unknown", {"reasoning": {"summary": "long"}}, "reasoning.summary: use one of auto, concise, detailed"),
    ("image-file-id", {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]},
     "input[0].content[0].file_id: file ids are not supported; send the file's data (image_url: a data URL or an "
     "http(s) URL)"),
    ("pdf-file-id", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]},
     "input[0].content[0].file_id: file ids are not supported; send the file's data (file_data: "
     "data:application/pdf;base64,…)"),
    ("generate-summary-unknown", {"reasoning": {"generate_summary": "long"}},
     "reasoning.generate_summary: use one of auto, concise, detailed"),
    ("previous-response-id-empty", {"previous_response_id": ""},
     "previous_response_id: Shorter than minimum length 1."),
]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "answer"), [row[1:] for row in RESPONSES_REFUSED], ids=[r[0] for r in RESPONSES_REFUSED]
)
def test_responses_refusals_are_worded_as_the_reference_words_them(extra: dict[str, Any], answer: str) -> None:
    assert refusal("responses", {**RESPONSES, **extra}) == answer


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"background": False, "top_logprobs": 0}, id="refused-fields-off"),
        pytest.param({"input": [{"role": "user", "content": "typeless"}]}, id="typeless-item-is-a-message"),
        pytest.param({"max_output_tokens": 64.0}, id="whole-float-limit"),
        pytest.param({"top_logprobs": False, "background": 0}, id="falsy-refused-fields"),
        pytest.param({"reasoning": {"summary": "auto", "generate_summary": "x"}}, id="generate-summary-unread"),
        pytest.param({"tools": [{"type": "web_search_preview", "search_context_size": "low"}]}, id="web-search-tool"),
        pytest.param({"prompt_cache_key": 5, "metadata": {"a": "b"}, "user": 1}, id="ignored-fields"),
        pytest.param({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, id="strict-not-a-boolean"),
    ],
)
def test_responses_bodies_accepted_as_before(extra: dict[str, Any]) -> None:
    load_responses_request({**RESPONSES, **extra})


# ---------------------------------------------------------------- any JSON

SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=6)
JSON = st.recursive(
    SCALARS | st.sampled_from(["user", "text", "message", "function", "input_text", "image_url"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["type", "role", "content", "text", "name", "tools", "x"]), inner, max_size=3)
    ),
    max_leaves=10,
)
FIELDS = st.sampled_from(
    ["model", "messages", "input", "tools", "stream", "max_tokens", "text", "reasoning", "include", "response_format"]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(LOADERS)), st.dictionaries(FIELDS, JSON, max_size=4) | JSON)
def test_any_json_loads_or_is_refused_naming_the_part(dialect: str, body: Any) -> None:
    try:
        LOADERS[dialect](body)
    except RequestValidationError as exc:
        assert exc.message


# ---------------------------------------------------------------- ByKeys


def full_outcome(schema: Schema, body: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", repr(schema.load(body))
    except ValidationError as exc:
        return "error", first_error(exc.messages)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(CHAT, id="minimal"),
        pytest.param({**CHAT, "max_tokens": 64, "stream": True, "seed": 1}, id="bench-body"),
        pytest.param({"messages": [USER], "n": 2}, id="required-field-missing"),
        pytest.param({**CHAT, "audio": {}, "stream": "x"}, id="field-and-schema-errors"),
        pytest.param({**CHAT, "functions": [], "n": 3, "logprobs": True}, id="several-refusals"),
    ],
)
def test_by_keys_loads_as_the_full_schema(body: dict[str, Any]) -> None:
    by_keys = ByKeys(ChatCompletionRequestSchema)
    expected = full_outcome(ChatCompletionRequestSchema(), body)
    assert full_outcome(by_keys.schema_for(body), body) == expected
    assert set(by_keys.schema_for(body).fields) <= set(body) | {"model", "messages"}


def test_by_keys_keeps_a_bounded_number_of_schemas() -> None:
    by_keys = ByKeys(ChatCompletionRequestSchema, limit=3)
    names = ["stream", "n", "top_p", "stop", "user"]
    for name in names:
        by_keys.schema_for({**CHAT, name: None})
    assert len(by_keys.variants) == 3
    assert by_keys.schema_for({**CHAT, "n": 1}) is not by_keys.full  # built before the limit
    assert by_keys.schema_for({**CHAT, "stop": "x", "n": 1}) is by_keys.full  # past it
