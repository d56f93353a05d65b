"""Table tests of the simulator's pure core (ezat_compat/sim: errors, request, markers, validate,
cache, schema_json, replies, events)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from ezat_compat.sim.cache import InputUsage, PromptCache, count_input_tokens, prompt_units
from ezat_compat.sim.errors import InvalidRequestError, SimError, error_body, error_type_for
from ezat_compat.sim.events import encode_event, json_pieces, message_events, text_pieces
from ezat_compat.sim.markers import Markers, parse_markers
from ezat_compat.sim.replies import Reply, build_reply, message_json
from ezat_compat.sim.request import last_user_text, tokens
from ezat_compat.sim.schema_json import schema_value
from ezat_compat.sim.validate import ModelCaps, validate_request

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNgYGAAAAAEAAH2FzhVAAAAAElFTkSuQmCC"  # 1x1, black
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()
WEATHER = {
    "name": "get_weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}
CLOCK = {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}


def request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "Hello there"}],
    }
    body.update(overrides)
    return body


def user(*content: Any) -> dict[str, Any]:
    return {
        "role": "user",
        "content": list(content) if len(content) != 1 or not isinstance(content[0], str) else content[0],
    }


def assistant(*content: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": list(content) if len(content) != 1 or not isinstance(content[0], str) else content[0],
    }


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def tool_use(tool_id: str = "toolu_1", name: str = "get_weather") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"city": "Paris"}}


def tool_result(tool_id: str = "toolu_1", content: Any = "9°C and clear") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content}


def image(media_type: str = "image/png", data: str = PNG) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


CC = {"type": "ephemeral"}

# --------------------------------------------------------------------------------------------
# tokens and markers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("", 0, id="empty-is-zero"),
        pytest.param("a", 1, id="one-char-is-one"),
        pytest.param("abcd", 1, id="four-chars"),
        pytest.param("abcde", 2, id="five-chars-round-up"),
        pytest.param("é" * 8, 2, id="counts-characters-not-bytes"),
    ],
)
def test_tokens(value: str, expected: int) -> None:
    assert tokens(value) == expected


@pytest.mark.parametrize(
    ("value", "clean", "markers"),
    [
        pytest.param("plain text", "plain text", Markers(), id="no-marker"),
        pytest.param("hi [[sim:status=529]]", "hi", Markers(status=529), id="status"),
        pytest.param(
            "[[sim:status=429,retry_after=2.5]] go", "go", Markers(status=429, retry_after=2.5), id="two-keys-float"
        ),
        pytest.param(
            "a [[sim:refusal]] b [[sim:words=3]]", "a b", Markers(refusal=True, words=3), id="flag-and-several-markers"
        ),
        pytest.param(
            "[[sim:delay=0.2, stall=1, cut=3, error_after=4, token_delay_ms=5]]",
            "",
            Markers(delay=0.2, stall=1.0, cut=3, error_after=4, token_delay_ms=5),
            id="stream-keys",
        ),
        pytest.param(
            "[[sim:tools=2,thinking_tokens=7,pause,context]]",
            "",
            Markers(tools=2, thinking_tokens=7, pause=True, context=True),
            id="reply-keys",
        ),
    ],
)
def test_parse_markers(value: str, clean: str, markers: Markers) -> None:
    assert parse_markers(value) == (clean, markers)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("[[sim:colour=red]]", id="unknown-key"),
        pytest.param("[[sim:status=abc]]", id="not-a-number"),
        pytest.param("[[sim:refusal=1]]", id="flag-with-value"),
        pytest.param("[[sim:words]]", id="key-without-value"),
        pytest.param("[[sim:delay=-1]]", id="negative"),
    ],
)
def test_bad_markers_are_refused(value: str) -> None:
    with pytest.raises(InvalidRequestError, match="marker"):
        parse_markers(value)


def test_error_types_follow_anthropic() -> None:
    got = {status: error_type_for(status) for status in (400, 401, 403, 404, 413, 429, 500, 504, 529, 418, 599)}
    assert got == {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        504: "timeout_error",
        529: "overloaded_error",
        418: "invalid_request_error",
        599: "api_error",
    }
    body = error_body(SimError(529), "req_1")
    assert body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": "req_1",
    }


# --------------------------------------------------------------------------------------------
# validation: one row per rule
# --------------------------------------------------------------------------------------------

TOOL_USE_ERROR = (
    "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1. "
    "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
)
TOOL_RESULT_ERROR = (
    "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9. "
    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
)
INVALID = [
    (
        "body-not-object",
        ["not", "an", "object"],
        "body: Input should be a valid dictionary or object to extract fields from",
    ),
    ("missing-model", {"max_tokens": 5, "messages": [user("hi")]}, "model: Field required"),
    ("missing-max-tokens", {"model": "m", "messages": [user("hi")]}, "max_tokens: Field required"),
    ("missing-messages", {"model": "m", "max_tokens": 5}, "messages: Field required"),
    ("model-not-string", request(model=7), "model: Input should be a valid string"),
    ("max-tokens-not-int", request(max_tokens="5"), "max_tokens: Input should be a valid integer"),
    ("max-tokens-bool", request(max_tokens=True), "max_tokens: Input should be a valid integer"),
    ("max-tokens-zero", request(max_tokens=0), "max_tokens: Input should be greater than or equal to 1"),
    ("messages-empty", request(messages=[]), "messages: at least one message is required"),
    ("messages-not-list", request(messages={}), "messages: Input should be a valid list"),
    ("extra-field", request(frequency_penalty=1), "frequency_penalty: Extra inputs are not permitted"),
    (
        "role-developer",
        request(messages=[{"role": "developer", "content": "x"}]),
        "messages.0.role: Input should be 'user' or 'assistant'",
    ),
    (
        "role-system-first",  # a mid-conversation system message, where it may not be
        request(messages=[{"role": "system", "content": "x"}]),
        "messages.0: a system message must immediately follow a user message (or an assistant message ending in "
        "server tool use) and be the last message or be followed by an assistant message",
    ),
    ("content-missing", request(messages=[{"role": "user"}]), "messages.0.content: Field required"),
    (
        "content-empty-list",
        request(messages=[user("hi"), assistant("a"), {"role": "user", "content": []}]),
        "messages.2: all messages must have non-empty content except for the optional final assistant message",
    ),
    (
        "content-empty-string",
        request(messages=[{"role": "user", "content": ""}]),
        "messages.0: all messages must have non-empty content except for the optional final assistant message",
    ),
    (
        "block-unknown-type",
        request(messages=[user({"type": "video"})]),
        "messages.0.content.0: Input tag 'video' found using 'type' does not match any of the expected tags: "
        "'text', 'image', 'document', 'search_result', 'tool_use', 'tool_result', 'thinking', 'redacted_thinking', "
        "'server_tool_use', 'web_search_tool_result', 'web_fetch_tool_result', 'code_execution_tool_result', "
        "'container_upload'",
    ),
    (
        "block-not-object",
        request(messages=[user("a", "b")]),
        "messages.0.content.0: Input should be a valid dictionary or object to extract fields from",
    ),
    (
        "text-whitespace",
        request(messages=[user(text("  \n"))]),
        "messages: text content blocks must contain non-whitespace text",
    ),
    ("text-empty", request(messages=[user(text(""))]), "messages: text content blocks must be non-empty"),
    (
        "string-whitespace",
        request(messages=[user("   ")]),
        "messages: text content blocks must contain non-whitespace text",
    ),
    (
        "system-block-whitespace",
        request(system=[text(" ")]),
        "system: text content blocks must contain non-whitespace text",
    ),
    ("system-block-not-text", request(system=[image()]), "system.0.type: Input should be 'text'"),
    (
        "final-assistant-trailing-space",
        request(messages=[user("hi"), assistant("The answer is ")]),
        "messages: final assistant content cannot end with trailing whitespace",
    ),
    (
        "final-assistant-block-trailing-space",
        request(messages=[user("hi"), assistant(text("So\n"))]),
        "messages: final assistant content cannot end with trailing whitespace",
    ),
    (
        "tool-use-id-pattern",
        request(messages=[user("hi"), assistant(tool_use("bad id")), user(tool_result("bad id"))]),
        "messages.1.content.0.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'",
    ),
    (
        "tool-use-input-not-object",
        request(messages=[user("hi"), assistant({**tool_use(), "input": []}), user(tool_result())]),
        "messages.1.content.0.tool_use.input: Input should be a valid dictionary",
    ),
    ("tool-use-without-result", request(messages=[user("hi"), assistant(tool_use()), user("thanks")]), TOOL_USE_ERROR),
    ("tool-use-as-last-message", request(messages=[user("hi"), assistant(tool_use())]), TOOL_USE_ERROR),
    (
        "tool-result-not-first",
        request(messages=[user("hi"), assistant(tool_use()), user(text("x"), tool_result())]),
        TOOL_USE_ERROR,
    ),
    ("tool-result-unexpected", request(messages=[user(tool_result("toolu_9"))]), TOOL_RESULT_ERROR),
    (
        "tool-name-pattern",
        request(tools=[{**WEATHER, "name": "get weather"}]),
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
    ),
    (
        "tool-name-too-long",
        request(tools=[{**WEATHER, "name": "x" * 129}]),
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
    ),
    ("tool-names-unique", request(tools=[WEATHER, WEATHER]), "tools: Tool names must be unique."),
    ("tool-schema-missing", request(tools=[{"name": "x"}]), "tools.0.custom.input_schema: Field required"),
    (
        "tool-schema-not-object-type",
        request(tools=[{"name": "x", "input_schema": {"type": "array"}}]),
        "tools.0.custom.input_schema.type: Input should be 'object'",
    ),
    (
        "tool-choice-type",
        request(tools=[WEATHER], tool_choice={"type": "required"}),
        "tool_choice: Input tag 'required' found using 'type' does not match any of the expected tags: "
        "'auto', 'any', 'tool', 'none'",
    ),
    (
        "tool-choice-unknown-name",
        request(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}),
        "tool_choice.tool.name: Tool 'nope' not found in `tools`",
    ),
    (
        "tool-choice-name-missing",
        request(tools=[WEATHER], tool_choice={"type": "tool"}),
        "tool_choice.tool.name: Field required",
    ),
    (
        "thinking-type",
        request(thinking={"type": "on"}),
        "thinking: Input tag 'on' found using 'type' does not match any of the expected tags: "
        "'adaptive', 'enabled', 'disabled'",
    ),
    (
        "thinking-budget-missing",
        request(thinking={"type": "enabled"}),
        "thinking.enabled.budget_tokens: Field required",
    ),
    (
        "thinking-budget-small",
        request(thinking={"type": "enabled", "budget_tokens": 1000}),
        "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
    ),
    (
        "thinking-budget-not-below-max",
        request(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}),
        "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size",
    ),
    ("temperature-high", request(temperature=1.5), "temperature: Input should be less than or equal to 1"),
    ("temperature-negative", request(temperature=-0.1), "temperature: Input should be greater than or equal to 0"),
    ("top-p-high", request(top_p=2), "top_p: Input should be less than or equal to 1"),
    (
        "temperature-and-top-p",
        request(temperature=0.5, top_p=0.5),
        "`temperature` and `top_p` cannot both be specified for this model. Please use only one.",
    ),
    (
        "five-cache-breakpoints",
        request(
            system=[text("a", cache_control=CC), text("b", cache_control=CC)],
            tools=[{**WEATHER, "cache_control": CC}],
            messages=[user(text("c", cache_control=CC), text("d", cache_control=CC))],
        ),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    (
        "image-media-type",
        request(messages=[user(image("image/bmp"))]),
        "messages.0.content.0.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' "
        "or 'image/webp'",
    ),
    (
        "image-bad-base64",
        request(messages=[user(image(data="not base64!"))]),
        "messages.0.content.0.image.source.base64.data: Invalid base64 data",
    ),
    (
        "image-source-type",
        request(messages=[user({"type": "image", "source": {"type": "s3", "key": "f"}})]),
        "messages.0.content.0.image.source: Input tag 's3' found using 'type' does not match any of the expected "
        "tags: 'base64', 'url', 'file'",
    ),
    (
        "document-media-type",
        request(
            messages=[user({"type": "document", "source": {"type": "base64", "media_type": "image/png", "data": PDF}})]
        ),
        "messages.0.content.0.document.source.base64.media_type: Input should be 'application/pdf'",
    ),
    (
        "effort",
        request(output_config={"effort": "extreme"}),
        "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'",
    ),
    (
        "format-type",
        request(output_config={"format": {"type": "json_object"}}),
        "output_config.format.type: Input should be 'json_schema'",
    ),
    (
        "format-schema-missing",
        request(output_config={"format": {"type": "json_schema"}}),
        "output_config.format.schema: Field required",
    ),
    (
        "format-schema-not-object",
        request(output_config={"format": {"type": "json_schema", "schema": []}}),
        "output_config.format.schema: Input should be a valid dictionary",
    ),
    (
        "cache-control-type",
        request(messages=[user(text("hi", cache_control={"type": "forever"}))]),
        "messages.0.content.0.text.cache_control.type: Input should be 'ephemeral'",
    ),
    ("stop-sequences-not-strings", request(stop_sequences=[1]), "stop_sequences.0: Input should be a valid string"),
]


@pytest.mark.parametrize(("body", "message"), [pytest.param(b, m, id=i) for i, b, m in INVALID])
def test_invalid_requests_are_refused_with_anthropic_wording(body: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(body)
    assert caught.value.status == 400
    assert caught.value.error_type == "invalid_request_error"
    assert caught.value.message == message


VALID = [
    ("minimal", request()),
    ("consecutive-user-messages-merge", request(messages=[user("a"), user("b")])),
    ("prefill", request(messages=[user("hi"), assistant("The answer is")])),
    ("final-assistant-empty", request(messages=[user("hi"), assistant("")])),
    (
        "tool-round-trip",
        request(
            tools=[WEATHER],
            messages=[
                user("weather?"),
                assistant(text("Let me check."), tool_use()),
                user(tool_result(), text("thanks")),
            ],
        ),
    ),
    (
        "tool-round-trip-merged-user-turns",
        request(
            tools=[WEATHER],
            messages=[user("weather?"), assistant(tool_use()), user(tool_result()), user("and tomorrow?")],
        ),
    ),
    ("thinking-enabled", request(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024})),
    ("thinking-adaptive", request(thinking={"type": "adaptive"})),
    (
        "image-and-pdf",
        request(
            messages=[
                user(
                    image(),
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
                    text("what is this?"),
                )
            ]
        ),
    ),
    ("image-url", request(messages=[user({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}})])),
    (
        "four-breakpoints",
        request(
            system=[text("a", cache_control=CC)],
            tools=[{**WEATHER, "cache_control": CC}],
            messages=[user(text("c", cache_control=CC), text("d", cache_control=CC))],
        ),
    ),
    ("sampling-temperature", request(temperature=0.0, top_k=5)),
    (
        "structured-output",
        request(
            output_config={
                "effort": "low",
                "format": {"type": "json_schema", "schema": {"type": "object", "additionalProperties": False}},
            }
        ),
    ),
    ("tool-choice-named", request(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})),
]


@pytest.mark.parametrize("body", [pytest.param(b, id=i) for i, b in VALID])
def test_valid_requests_pass(body: dict[str, Any]) -> None:
    validate_request(body)


def test_no_prefill_refuses_a_trailing_assistant_message() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(request(messages=[user("hi"), assistant("Sure")]), caps=ModelCaps(prefill=False))
    assert caught.value.message == (
        "This model does not support assistant message prefill. The conversation must end with a user message."
    )


def test_count_tokens_needs_no_max_tokens_and_refuses_stream() -> None:
    validate_request({"model": "m", "messages": [user("hi")]}, count_only=True)
    with pytest.raises(InvalidRequestError, match="stream: Extra inputs are not permitted"):
        validate_request({"model": "m", "messages": [user("hi")], "stream": True}, count_only=True)


# --------------------------------------------------------------------------------------------
# input tokens
# --------------------------------------------------------------------------------------------


def test_input_tokens_follow_the_formula() -> None:
    tools = [WEATHER, CLOCK]
    body = request(
        system="You are terse.",  # 14 chars -> 4
        tools=tools,
        messages=[
            user("What's the weather?"),  # 19 -> 5
            assistant(tool_use()),  # {"city":"Paris"} 16 -> 4
            user(tool_result(), image()),  # 9°C and clear 13 -> 4; image capped by its data length
        ],
    )
    tools_json = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    expected = 4 + tokens(tools_json) + 5 + 4 + 4 + min(1000, len(PNG)) + 3 * 3
    assert count_input_tokens(body) == expected


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(request(messages=[user("x")]), id="one-char"),
        pytest.param(request(messages=[user(image())]), id="tiny-image"),
        pytest.param(
            request(
                messages=[
                    user(
                        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}}
                    )
                ]
            ),
            id="tiny-document",
        ),
        pytest.param(request(messages=[user("é" * 5000)]), id="non-ascii"),
        pytest.param(
            request(tools=[WEATHER, CLOCK] * 1, messages=[user("a"), assistant("b"), user("c")] * 3),
            id="many-short-messages",
        ),
    ],
)
def test_input_tokens_never_exceed_the_body_bytes(body: dict[str, Any]) -> None:
    for raw in (json.dumps(body, separators=(",", ":"), ensure_ascii=False), json.dumps(body)):
        assert count_input_tokens(body) <= len(raw.encode())


# --------------------------------------------------------------------------------------------
# prompt cache
# --------------------------------------------------------------------------------------------

LONG = "cacheable context " * 300  # 5400 chars -> 1350 tokens


def cached_request(*messages: dict[str, Any]) -> dict[str, Any]:
    return request(system=[text(LONG, cache_control=CC)], messages=list(messages) or [user("Hello")])


def account(cache: PromptCache, body: dict[str, Any], min_tokens: int = 1024) -> InputUsage:
    return cache.account(body["model"], prompt_units(body), min_tokens)


def test_cache_first_request_writes_second_reads() -> None:
    cache = PromptCache()
    body = cached_request()
    total = count_input_tokens(body)
    first, second = account(cache, body), account(cache, copy.deepcopy(body))
    assert first == InputUsage(total - 1350, 1350, 0)
    assert second == InputUsage(total - 1350, 0, 1350)


def test_cache_below_minimum_writes_nothing() -> None:
    cache = PromptCache()
    body = request(system=[text("short system prompt", cache_control=CC)])
    total = count_input_tokens(body)
    assert account(cache, body) == InputUsage(total)
    assert account(cache, body) == InputUsage(total)
    assert len(cache) == 0


def test_cache_without_breakpoints_is_plain_input() -> None:
    body = request(system=LONG)
    assert account(PromptCache(), body) == InputUsage(count_input_tokens(body))


def test_cache_next_turn_reads_the_previous_breakpoint_and_writes_the_rest() -> None:
    cache = PromptCache()
    turn1 = request(messages=[user(text(LONG, cache_control=CC))])
    first = account(cache, turn1)
    assert first.cache_creation_input_tokens == 1350 + 3
    turn2 = request(messages=[user(text(LONG)), assistant("Noted."), user(text("Go on", cache_control=CC))])
    second = account(cache, turn2)
    assert second.cache_read_input_tokens == 1353
    assert second.cache_creation_input_tokens == 3 + 2 + 3 + 2  # assistant turn and the new user turn
    assert second.input_tokens == 0
    assert sum(vars(second).values()) == count_input_tokens(turn2)


def test_cache_is_keyed_by_model_and_content() -> None:
    cache = PromptCache()
    account(cache, cached_request())
    other_model = {**cached_request(), "model": "other"}
    assert account(cache, other_model).cache_read_input_tokens == 0
    changed = request(system=[text(LONG + "!", cache_control=CC)])
    assert account(cache, changed).cache_read_input_tokens == 0


def test_cache_is_bounded_lru() -> None:
    cache = PromptCache(max_entries=2)
    bodies = [request(system=[text(f"{k} {LONG}", cache_control=CC)]) for k in range(3)]
    for body in bodies:
        account(cache, body)
    assert len(cache) == 2
    assert account(cache, bodies[0]).cache_read_input_tokens == 0  # evicted
    assert account(cache, bodies[2]).cache_read_input_tokens > 0


# --------------------------------------------------------------------------------------------
# schema-driven JSON
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        pytest.param({"type": "string"}, "example", id="string"),
        pytest.param({"type": "string", "enum": ["b", "a"]}, "b", id="enum-first"),
        pytest.param({"const": 3}, 3, id="const"),
        pytest.param({"type": "integer"}, 1, id="integer"),
        pytest.param({"type": "integer", "minimum": 5}, 5, id="integer-minimum"),
        pytest.param({"type": "number"}, 1.5, id="number"),
        pytest.param({"type": "boolean"}, True, id="boolean"),
        pytest.param({"type": "null"}, None, id="null"),
        pytest.param({"type": ["null", "integer"]}, 1, id="nullable"),
        pytest.param({"type": "array", "items": {"type": "string"}}, [], id="array"),
        pytest.param({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 1], id="array-min-items"),
        pytest.param({"type": "object"}, {}, id="empty-object"),
        pytest.param(
            {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["b"]},
            {"b": 1},
            id="required-only",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}},
            {"a": "example", "b": True},
            id="all-when-none-required",
        ),
        pytest.param(
            {"type": "object", "properties": {"o": {"type": "object", "properties": {"n": {"type": "number"}}}}},
            {"o": {"n": 1.5}},
            id="nested",
        ),
        pytest.param({"anyOf": [{"type": "null"}, {"type": "integer"}]}, 1, id="any-of-skips-null"),
        pytest.param(
            {
                "type": "object",
                "properties": {"p": {"$ref": "#/$defs/P"}},
                "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            },
            {"p": {"x": 1}},
            id="ref",
        ),
    ],
)
def test_schema_value(schema: dict[str, Any], expected: Any) -> None:
    assert schema_value(schema) == expected


# --------------------------------------------------------------------------------------------
# replies
# --------------------------------------------------------------------------------------------


def reply_for(body: dict[str, Any]) -> Reply:
    validate_request(body)
    clean, markers = parse_markers(last_user_text(body))
    return build_reply(body, clean, markers)


def test_plain_reply_echoes_the_last_user_text_without_markers() -> None:
    reply = reply_for(request(messages=[user("Hi sim [[sim:words=0]]"), assistant("x"), user("Ping [[sim:delay=0]]")]))
    assert reply.content == [{"type": "text", "text": "Hello from the simulator. You said: Ping"}]
    assert (reply.stop_reason, reply.stop_sequence, reply.thinking_tokens) == ("end_turn", None, 0)
    assert reply.output_tokens == tokens(reply.content[0]["text"])


def test_reply_is_deterministic() -> None:
    body = request(tools=[WEATHER], messages=[user("use a tool")])
    assert reply_for(body) == reply_for(copy.deepcopy(body))


def test_max_tokens_cuts_the_reply() -> None:
    reply = reply_for(request(max_tokens=3))
    assert reply.content == [{"type": "text", "text": "Hello from t"}]
    assert (reply.stop_reason, reply.output_tokens) == ("max_tokens", 3)


def test_stop_sequence_cuts_before_it() -> None:
    reply = reply_for(request(stop_sequences=["END", "simulator"], messages=[user("say END now")]))
    assert reply.content == [{"type": "text", "text": "Hello from the "}]
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "simulator")


def test_words_marker_makes_filler_text() -> None:
    reply = reply_for(request(messages=[user("[[sim:words=25]]")]))
    assert len(reply.content[0]["text"].split()) == 25


@pytest.mark.parametrize(
    ("marker", "stop_reason"),
    [
        pytest.param("refusal", "refusal", id="refusal"),
        pytest.param("pause", "pause_turn", id="pause"),
        pytest.param("context", "model_context_window_exceeded", id="context"),
    ],
)
def test_stop_reason_markers(marker: str, stop_reason: str) -> None:
    assert reply_for(request(messages=[user(f"hi [[sim:{marker}]]")])).stop_reason == stop_reason


def test_thinking_enabled_respects_the_budget_and_counts_in_output() -> None:
    body = request(
        max_tokens=4000,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[user("think hard [[sim:thinking_tokens=3000]]")],
    )
    reply = reply_for(body)
    thinking, answer = reply.content
    assert thinking["type"] == "thinking" and thinking["signature"]
    assert reply.thinking_tokens == tokens(thinking["thinking"]) == 3000
    assert reply.output_tokens == 3000 + tokens(answer["text"])
    budgeted = reply_for({**body, "messages": [user("think hard")]})
    assert 0 < budgeted.thinking_tokens <= 1024


def test_thinking_counts_toward_max_tokens() -> None:
    reply = reply_for(
        request(max_tokens=2000, thinking={"type": "adaptive"}, messages=[user("[[sim:thinking_tokens=5000]]")])
    )
    assert [b["type"] for b in reply.content] == ["thinking"]
    assert (reply.thinking_tokens, reply.output_tokens, reply.stop_reason) == (2000, 2000, "max_tokens")


def test_thinking_tokens_marker_without_thinking_has_no_block() -> None:
    reply = reply_for(request(messages=[user("hi [[sim:thinking_tokens=7]]")]))
    assert [b["type"] for b in reply.content] == ["text"]
    assert reply.thinking_tokens == 7
    assert reply.output_tokens == 7 + tokens(reply.content[0]["text"])


def test_omitted_thinking_display_sends_empty_thinking_text() -> None:
    reply = reply_for(request(thinking={"type": "adaptive", "display": "omitted"}))
    assert reply.content[0]["thinking"] == "" and reply.thinking_tokens > 0


TOOL_CASES = [
    ("word-tool-triggers", {"tools": [WEATHER], "messages": [user("Use the Tool please")]}, ["get_weather"]),
    ("no-trigger-means-text", {"tools": [WEATHER], "messages": [user("hello")]}, []),
    ("choice-any", {"tools": [WEATHER], "tool_choice": {"type": "any"}}, ["get_weather"]),
    ("choice-named", {"tools": [WEATHER, CLOCK], "tool_choice": {"type": "tool", "name": "get_time"}}, ["get_time"]),
    ("choice-none", {"tools": [WEATHER], "tool_choice": {"type": "none"}, "messages": [user("tool")]}, []),
    (
        "marker-cycles-tools",
        {"tools": [WEATHER, CLOCK], "messages": [user("[[sim:tools=3]]")]},
        ["get_weather", "get_time", "get_weather"],
    ),
    (
        "parallel-disabled",
        {
            "tools": [WEATHER, CLOCK],
            "messages": [user("[[sim:tools=3]]")],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        },
        ["get_weather"],
    ),
    (
        "after-tool-results-text",
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "any"},
            "messages": [user("tool"), assistant(tool_use()), user(tool_result())],
        },
        [],
    ),
]


@pytest.mark.parametrize(("overrides", "names"), [pytest.param(o, n, id=i) for i, o, n in TOOL_CASES])
def test_tool_use(overrides: dict[str, Any], names: list[str]) -> None:
    reply = reply_for(request(**overrides))
    uses = [b for b in reply.content if b["type"] == "tool_use"]
    assert [b["name"] for b in uses] == names
    if names:
        assert reply.stop_reason == "tool_use"
        assert all(b["id"].startswith("toolu_") and len(b["id"]) == 30 and b["id"][6:].isalnum() for b in uses)
        assert len({b["id"] for b in uses}) == len(uses)
    else:
        assert reply.stop_reason == "end_turn"


def test_tool_input_comes_from_the_schema() -> None:
    reply = reply_for(request(tools=[WEATHER], tool_choice={"type": "any"}))
    assert reply.content[0]["input"] == {"city": "example"}


def test_tool_results_are_quoted() -> None:
    reply = reply_for(
        request(
            tools=[WEATHER],
            messages=[
                user("weather?"),
                assistant(tool_use("a"), tool_use("b")),
                user(tool_result("a"), tool_result("b", [text("rain later")])),
            ],
        )
    )
    assert reply.content == [{"type": "text", "text": "Tool results: 9°C and clear; rain later"}]


@pytest.mark.parametrize(
    "after_results, uses_tool",
    [
        ("", False),  # tool results alone: the answer quotes them
        ("and the next city?", False),  # the word "tool" is not needed, nor enough, after results
        ('next [[sim:tool=get_weather,args={"city": "Lima"}]]', True),  # an agent loop's next round
    ],
    ids=["results-only", "text", "marker"],
)
def test_a_marker_next_to_tool_results_asks_for_another_call(after_results: str, uses_tool: bool) -> None:
    extra = [text(after_results)] if after_results else []
    messages = [user("weather?"), assistant(tool_use("a")), user(tool_result("a"), *extra)]
    body = request(tools=[WEATHER], messages=messages)
    reply = reply_for(body)
    if uses_tool:
        assert reply.stop_reason == "tool_use"
        assert [(b["type"], b["input"]) for b in reply.content] == [("tool_use", {"city": "Lima"})]
    else:
        assert reply.stop_reason == "end_turn" and reply.content[0]["text"].startswith("Tool results: ")


def test_structured_output_is_json_from_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    reply = reply_for(request(output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert json.loads(reply.content[0]["text"]) == {"name": "example", "age": 1}
    assert reply.stop_reason == "end_turn"


def test_message_json_shape() -> None:
    reply = reply_for(request())
    message = message_json("m", "msg_1", reply, InputUsage(5, 6, 7))
    assert message == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": reply.content,
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 5,
            "cache_creation_input_tokens": 6,
            "cache_read_input_tokens": 7,
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"thinking_tokens": 0},
        },
    }


# --------------------------------------------------------------------------------------------
# SSE events
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("one", id="one-word"),
        pytest.param("  leading and trailing  spaces ", id="spaces"),
        pytest.param("a b c d e f g h i j k", id="many-words"),
        pytest.param("x" * 200, id="long-word"),
        pytest.param("line one\nline two\n\n", id="newlines"),
    ],
)
def test_text_pieces_join_back(value: str) -> None:
    pieces = text_pieces(value)
    assert "".join(pieces) == value
    assert all(p and len(p) <= 48 + 2 for p in pieces) or not value


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({}, id="empty"),
        pytest.param({"a": "x"}, id="one-key"),
        pytest.param({"a": 1, "b": [1, 2], "c": {"d": True}}, id="nested"),
    ],
)
def test_json_pieces(value: dict[str, Any]) -> None:
    data = json.dumps(value)
    pieces = json_pieces(data)
    assert "".join(pieces) == data
    assert 2 <= len(pieces) <= 3


def test_message_events_order_and_usage() -> None:
    body = request(
        max_tokens=3000,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[WEATHER],
        messages=[user("use a tool")],
    )
    message = message_json("m", "msg_1", reply_for(body), InputUsage(10, 20, 30))
    events = message_events(message)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 20,
        "cache_read_input_tokens": 30,
        "output_tokens": 1,
    }
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert deltas.count("thinking_delta") >= 2 and deltas.count("signature_delta") == 1
    assert 2 <= deltas.count("input_json_delta") <= 3
    tool_start = next(d for n, d in events if n == "content_block_start" and d["index"] == 1)
    assert tool_start["content_block"]["input"] == {}
    partial = "".join(
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    assert json.loads(partial) == message["content"][1]["input"]
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == message["usage"]["output_tokens"]
    assert final["usage"]["output_tokens_details"] == {
        "thinking_tokens": message["usage"]["output_tokens_details"]["thinking_tokens"]
    }


def test_encode_event() -> None:
    assert encode_event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
