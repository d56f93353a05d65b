"""OpenAI request -> Anthropic request: one row per rule of the Chat Completions reference.

Every translated request is also validated with the anthropic SDK's ``MessageCreateParams``.
Each row's id names the rule; the comment names the spec section.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ezat_compat.translate.ids import decode_tool_id, encode_tool_id
from tests.support.translation import BASE_MODEL as BASE_MODEL  # test_responses_request.py imports it from here
from tests.support.translation import PDF_URL, PNG_URL, USER, refused, translate

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


# ---------------------------------------------------------------- Messages


def test_system_and_developer_joined_wherever_they_appear_as_separate_blocks() -> None:
    # Messages: system/developer "Joined into one system prompt, wherever they appear".
    t = translate(
        messages=[
            {"role": "system", "content": "A"},
            USER,
            {"role": "developer", "content": [{"type": "text", "text": "B"}, {"type": "text", "text": "C"}]},
        ]
    )
    assert t.body["system"] == [
        {"type": "text", "text": "A"},
        {"type": "text", "text": "B"},
        {"type": "text", "text": "C"},
    ]
    assert t.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]


def test_system_part_cache_control_maps_one_to_one() -> None:
    t = translate(
        messages=[
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "A"},
                    {"type": "text", "text": "B", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                ],
            },
            USER,
        ]
    )
    assert t.body["system"][0] == {"type": "text", "text": "A"}
    assert t.body["system"][1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_user_parts_text_image_data_url_and_pdf() -> None:
    # Messages: user "A string, or parts: text, image_url, file (a PDF as file_data)".
    t = translate(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look"},
                    {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "high"}},
                    {"type": "file", "file": {"file_data": PDF_URL, "filename": "a.pdf"}},
                ],
            }
        ]
    )
    content = t.body["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "Look"}
    assert content[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_URL.split(",", 1)[1]},
    }
    assert content[2]["type"] == "document"
    assert content[2]["source"] == {"type": "base64", "media_type": "application/pdf", "data": PDF_URL.split(",", 1)[1]}


def test_http_image_urls_become_slots_to_download() -> None:
    t = translate(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "x"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                ],
            }
        ]
    )
    assert [(s.path, s.url) for s in t.image_slots] == [
        ("messages[0].content[1].image_url.url", "https://example.com/a.png")
    ]
    assert t.image_slots[0].block is t.body["messages"][0]["content"][1]


@pytest.mark.parametrize("arguments", ["", None, "   "], ids=["empty", "null", "blank"])
def test_tool_call_empty_arguments_become_empty_object(arguments: str | None) -> None:
    # Messages: assistant tool_calls -> tool_use; "" or null arguments -> {}.
    call = {**CALL, "function": {"name": "get_weather", "arguments": arguments}}
    t = translate(
        {"tools": [WEATHER_TOOL]},
        messages=[
            USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "9°C"},
        ],
    )
    assert t.body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    ]


@pytest.mark.parametrize(
    "arguments, reason",
    [
        ("{oops", "is not valid JSON: Expecting property name"),
        ("[1, 2]", "must be a JSON object"),
        ('{"a": NaN}', "is not valid JSON: NaN, Infinity and -Infinity are not valid JSON numbers"),
        ('{"a": 1e400}', "is not valid JSON: the number 1e400 is too large for a double"),
        (
            '{"a": "\\ud800"}',
            "contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode text (at a)",
        ),
        ('{"a": ' + "[" * 300 + "]" * 300 + "}", "is nested more than 200 levels deep (at a)"),
        ("[" * 5000 + "]" * 5000, "is nested more than 200 levels deep"),
    ],
    ids=["invalid-json", "not-an-object", "nan", "overflow", "lone-surrogate", "too-deep", "far-too-deep"],
)
def test_tool_call_bad_arguments_refused_naming_the_path(arguments: str, reason: str) -> None:
    call = {**CALL, "id": "call_2", "function": {"name": "get_weather", "arguments": arguments}}
    message, param = refused(
        {"tools": [WEATHER_TOOL]}, messages=[USER, {"role": "assistant", "tool_calls": [CALL, call]}]
    )
    assert message.startswith(f"messages[1].tool_calls[1].function.arguments: {reason}")
    assert param == "messages[1].tool_calls[1].function.arguments"


def test_assistant_text_and_refusal_parts() -> None:
    # Messages: assistant "Text and tool_calls. refusal parts are dropped."
    t = translate(
        messages=[
            USER,
            {"role": "assistant", "content": [{"type": "text", "text": "Sure"}, {"type": "refusal", "refusal": "no"}]},
            {"role": "user", "content": "Go"},
        ]
    )
    assert t.body["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "Sure"}]}


def test_tool_results_of_one_turn_sent_together_first_in_the_user_turn() -> None:
    # Messages: tool "Results that follow one assistant turn are sent together."
    call2 = {**CALL, "id": "call_2"}
    t = translate(
        {"tools": [WEATHER_TOOL]},
        messages=[
            USER,
            {"role": "assistant", "content": "Checking", "tool_calls": [CALL, call2]},
            {"role": "tool", "tool_call_id": "call_1", "content": "9°C"},
            {"role": "user", "content": "and then?"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "11°C"}]},
        ],
    )
    turn = t.body["messages"][2]
    assert turn["role"] == "user"
    assert [b["type"] for b in turn["content"]] == ["tool_result", "tool_result", "text"]
    assert turn["content"][0] == {"type": "tool_result", "tool_use_id": "call_1", "content": "9°C"}
    assert turn["content"][1]["content"] == [{"type": "text", "text": "11°C"}]
    assert len(t.body["messages"]) == 3


def test_consecutive_messages_from_one_side_merged() -> None:
    t = translate(
        messages=[
            USER,
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "A"},
            {"role": "assistant", "content": "B"},
            {"role": "user", "content": "C"},
        ]
    )
    assert [m["role"] for m in t.body["messages"]] == ["user", "assistant", "user"]
    assert [b["text"] for b in t.body["messages"][0]["content"]] == ["Hi", "again"]
    assert [b["text"] for b in t.body["messages"][1]["content"]] == ["A", "B"]


def test_empty_text_never_sent_as_an_empty_block() -> None:
    t = translate(
        messages=[
            {"role": "system", "content": "  "},
            USER,
            {"role": "assistant", "content": ""},
            {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "x"}]},
        ]
    )
    assert "system" not in t.body
    assert t.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "x"}]}
    ]


def test_a_trailing_empty_user_message_is_refused() -> None:
    assert refused(messages=[USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": " "}]) == (
        "messages[2].content: must not be empty",
        "messages[2].content",
    )


def test_tool_call_ids_outside_the_alphabet_are_mapped_the_same_on_both_sides() -> None:
    odd = "functions.get_weather:0"
    call = {**CALL, "id": odd}
    t = translate(
        {"tools": [WEATHER_TOOL]},
        messages=[
            USER,
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": odd, "content": "9"},
        ],
    )
    use_id = t.body["messages"][1]["content"][0]["id"]
    assert use_id == t.body["messages"][2]["content"][0]["tool_use_id"] == encode_tool_id(odd)
    assert use_id != odd and decode_tool_id(use_id) == odd


@pytest.mark.parametrize("tool_id", ["call_1", "toolu_01ABC-x", "ezat-abc", "a:b", "日本", "a b/c"])
def test_tool_id_mapping_is_reversible(tool_id: str) -> None:
    encoded = encode_tool_id(tool_id)
    assert all((c.isalnum() and c.isascii()) or c in "_-" for c in encoded)
    assert decode_tool_id(encoded) == tool_id


def test_tool_message_without_a_matching_call_is_refused() -> None:
    assert refused(messages=[USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}]) == (
        'messages[1].tool_call_id: no tool call with id "nope" in the assistant message before this one',
        "messages[1].tool_call_id",
    )


def test_tool_result_given_twice_is_refused() -> None:
    message, param = refused(
        {"tools": [WEATHER_TOOL]},
        messages=[
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a"},
            {"role": "tool", "tool_call_id": "call_1", "content": "b"},
        ],
    )
    assert param == "messages[3].tool_call_id" and "already has a result" in message


@pytest.mark.parametrize("tail", [[{"role": "user", "content": "next"}], []], ids=["followed-by-user", "at-the-end"])
def test_tool_call_left_without_result_is_refused(tail: list[dict[str, Any]]) -> None:
    message, param = refused(
        {"tools": [WEATHER_TOOL]},
        messages=[
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            *tail,
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "y"},
        ],
    )
    assert param == "messages[1].tool_calls[0]"
    assert message.startswith('messages[1].tool_calls[0]: tool call "call_1" has no result')


@pytest.mark.parametrize(
    "messages",
    [[{"role": "system", "content": "S"}], [{"role": "developer", "content": "D"}], []],
    ids=["only-system", "only-developer", "empty"],
)
def test_no_message_but_system_is_refused(messages: list[dict[str, Any]]) -> None:
    # Messages: "messages: must contain at least one user message".
    assert refused(messages=messages) == ("messages: must contain at least one user message", "messages")


def test_trailing_assistant_refused_on_models_without_prefill() -> None:
    message, param = refused(messages=[USER, {"role": "assistant", "content": "The answer is"}], prefill=False)
    assert param == "messages[1]"
    assert message.startswith("messages[1]: model test does not support assistant message prefill")


def test_trailing_assistant_sent_as_prefill_without_trailing_whitespace() -> None:
    t = translate(messages=[USER, {"role": "assistant", "content": "The answer is "}], prefill=True)
    assert t.body["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]}


@pytest.mark.parametrize(
    "url, reason",
    [
        (
            "data:image/bmp;base64,Qk0=",
            'image type "image/bmp" is not supported; use image/jpeg, image/png, image/gif or image/webp',
        ),
        ("data:image/png,rawbytes", "data URLs must be base64: data:<type>;base64,<data>"),
        ("ftp://example.com/a.png", "must be an http(s) URL or a base64 data URL (data:<type>;base64,<data>)"),
    ],
    ids=["bmp", "not-base64", "ftp"],
)
def test_bad_image_urls_refused_naming_the_part(url: str, reason: str) -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}
    ]
    assert refused(messages=messages) == (
        f"messages[0].content[1].image_url.url: {reason}",
        "messages[0].content[1].image_url.url",
    )


JPEG_B64 = "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8U"


@pytest.mark.parametrize(
    "url, reason",
    [
        ("data:image/png;base64,!!not base64!!", "the data is not valid base64"),
        ("data:image/png;base64,aGVsbG8gd29ybGQ=", "the data is not a JPEG, PNG, GIF or WebP image"),
    ],
    ids=["not-base64", "not-an-image"],
)
def test_data_url_bytes_are_checked(url: str, reason: str) -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    assert refused(messages=messages) == (
        f"messages[0].content[0].image_url.url: {reason}",
        "messages[0].content[0].image_url.url",
    )


def test_data_url_media_type_comes_from_the_bytes() -> None:
    # Spec "Images and PDFs": the bytes decide, not the label (a JPEG labelled image/png).
    t = translate(
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{JPEG_B64}"}}],
            }
        ]
    )
    assert t.body["messages"][0]["content"][0]["source"]["media_type"] == "image/jpeg"


@pytest.mark.parametrize(
    "data, reason",
    [("!!", "the data is not valid base64"), ("aGVsbG8gd29ybGQ=", "the data is not a PDF file")],
    ids=["not-base64", "not-a-pdf"],
)
def test_pdf_bytes_are_checked(data: str, reason: str) -> None:
    assert refused(
        messages=[
            {
                "role": "user",
                "content": [{"type": "file", "file": {"file_data": f"data:application/pdf;base64,{data}"}}],
            }
        ]
    ) == (f"messages[0].content[0].file.file_data: {reason}", "messages[0].content[0].file.file_data")


def test_pdf_must_be_a_pdf_data_url() -> None:
    message, param = refused(
        messages=[{"role": "user", "content": [{"type": "file", "file": {"file_data": "data:text/plain;base64,aGk="}}]}]
    )
    assert param == "messages[0].content[0].file.file_data" and "only PDF files are supported" in message


def test_images_refused_on_models_without_vision() -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]}]
    assert refused(messages=messages, vision=False)[1] == "messages[0].content[0]"


# ---------------------------------------------------------------- Tools


def test_function_tools_passed_with_name_description_schema_strict_and_cache_control() -> None:
    tool = {
        "type": "function",
        "cache_control": {"type": "ephemeral"},
        "function": {
            "name": "f",
            "description": "d",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    }
    t = translate({"tools": [tool, {"type": "function", "function": {"name": "g"}}]})
    assert t.body["tools"] == [
        {
            "name": "f",
            "description": "d",
            "input_schema": tool["function"]["parameters"],
            "strict": True,
            "cache_control": {"type": "ephemeral"},
        },
        {"name": "g", "input_schema": {"type": "object", "properties": {}}},
    ]


@pytest.mark.parametrize(
    "names, index, reason",
    [
        (["bad name"], 0, "must be 1 to 128 characters"),
        (["a" * 129], 0, "must be 1 to 128 characters"),
        (["ok", "ok"], 1, 'duplicate tool name "ok"'),
    ],
    ids=["space", "too-long", "duplicate"],
)
def test_tool_names_checked(names: list[str], index: int, reason: str) -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    message, param = refused({"tools": tools})
    assert param == f"tools[{index}].function.name" and reason in message


@pytest.mark.parametrize(
    "choice, expected",
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"type": "tool", "name": "get_weather"}),
    ],
    ids=["auto", "none", "required", "named"],
)
def test_tool_choice_mapping(choice: Any, expected: dict[str, Any]) -> None:
    assert translate({"tools": [WEATHER_TOOL], "tool_choice": choice}).body["tool_choice"] == expected


@pytest.mark.parametrize(
    "choice, expected",
    [
        (None, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", {"type": "any", "disable_parallel_tool_use": True}),
        ("none", {"type": "none"}),
    ],
    ids=["default", "required", "not-with-none"],
)
def test_parallel_tool_calls_false(choice: Any, expected: dict[str, Any]) -> None:
    extra: dict[str, Any] = {"tools": [WEATHER_TOOL], "parallel_tool_calls": False}
    if choice is not None:
        extra["tool_choice"] = choice
    assert translate(extra).body["tool_choice"] == expected


def test_without_tools_tool_choice_and_parallel_are_ignored() -> None:
    body = translate({"tool_choice": "required", "parallel_tool_calls": False}).body
    assert "tool_choice" not in body and "tools" not in body
    assert "tool_choice" not in translate({"tools": [], "tool_choice": {"bogus": 1}}).body


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_forced_tool_choice_refused_by_models_without_it(choice: Any) -> None:
    message, param = refused({"tools": [WEATHER_TOOL], "tool_choice": choice}, forced_tool_choice=False)
    assert param == "tool_choice" and "does not support a forced tool choice" in message
    assert translate({"tools": [WEATHER_TOOL], "tool_choice": "auto"}, forced_tool_choice=False)


def test_named_tool_choice_must_name_a_tool() -> None:
    assert refused({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}}) == (
        'tool_choice.function.name: no tool named "x" in tools',
        "tool_choice.function.name",
    )


def test_unknown_tool_choice_refused() -> None:
    assert refused({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"})[1] == "tool_choice"


# ---------------------------------------------------------------- Reasoning


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_reasoning_none_and_minimal_low_effort_without_thinking(effort: str) -> None:
    body = translate({"reasoning_effort": effort}).body
    assert body["output_config"] == {"effort": "low"}
    assert "thinking" not in body  # omitted, never "disabled"


@pytest.mark.parametrize("effort", ["low", "medium", "high", "xhigh", "max"])
def test_reasoning_levels_set_effort_with_adaptive_thinking(effort: str) -> None:
    t = translate({"reasoning_effort": effort})
    assert t.body["output_config"] == {"effort": effort}
    assert t.body["thinking"] == {"type": "adaptive"} and t.thinking


def test_reasoning_level_the_model_does_not_offer_refused() -> None:
    assert refused({"reasoning_effort": "xhigh"}, efforts=("low", "medium", "high", "max")) == (
        'reasoning_effort: "xhigh" is not supported by model test; supported values: none, minimal, low, medium, '
        "high, max",
        "reasoning_effort",
    )


def test_unknown_reasoning_effort_refused_with_the_spec_message() -> None:
    assert refused({"reasoning_effort": "extreme"}) == (
        "reasoning_effort: use one of none, minimal, low, medium, high, xhigh, max",
        "reasoning_effort",
    )


def test_no_thinking_when_tool_choice_forces_a_tool() -> None:
    body = translate({"reasoning_effort": "high", "tools": [WEATHER_TOOL], "tool_choice": "required"}).body
    assert "thinking" not in body and body["output_config"] == {"effort": "high"}


def test_budget_thinking_models_get_a_budget_below_max_tokens() -> None:
    body = translate(
        {"reasoning_effort": "high", "max_tokens": 4000}, thinking="budget", efforts=("low", "medium", "high")
    ).body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 3999}
    assert "output_config" not in body


def test_without_reasoning_effort_nothing_is_requested() -> None:
    body = translate().body
    assert "thinking" not in body and "output_config" not in body


# ---------------------------------------------------------------- Sampling


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"temperature": 1.5}, {"temperature": 1}),
        ({"temperature": 0}, {"temperature": 0}),
        ({"top_p": 0.9}, {"top_p": 0.9}),
        ({"top_p": 1}, {}),
        ({"temperature": 0.2, "top_p": 0.5}, {"temperature": 0.2}),
    ],
    ids=["temperature-capped", "temperature-zero", "top-p", "top-p-one-dropped", "never-both"],
)
def test_sampling_on_sampling_models(extra: dict[str, Any], expected: dict[str, Any]) -> None:
    body = translate(extra, sampling=True).body
    assert {k: body[k] for k in ("temperature", "top_p") if k in body} == expected


@pytest.mark.parametrize(
    "extra, changes",
    [
        ({"temperature": 0.5, "top_p": 0.5}, {"sampling": False}),
        ({"temperature": 0.5, "reasoning_effort": "low"}, {"sampling": True}),
        ({"temperature": 0.5}, {"sampling": True, "thinking": "always"}),
    ],
    ids=["model-without-sampling", "thinking-on", "always-thinking"],
)
def test_sampling_dropped_silently(extra: dict[str, Any], changes: dict[str, Any]) -> None:
    body = translate(extra, **changes).body
    assert "temperature" not in body and "top_p" not in body


# ---------------------------------------------------------------- Output length and format


@pytest.mark.parametrize(
    "extra, changes, expected",
    [
        ({"max_tokens": 10, "max_completion_tokens": 20}, {}, 20),
        ({"max_tokens": 10}, {}, 10),
        ({}, {}, 32_000),
        ({}, {"max_output_tokens": 8_192}, 8_192),
    ],
    ids=["completion-tokens-win", "max-tokens", "default", "model-max-lower"],
)
def test_output_limit(extra: dict[str, Any], changes: dict[str, Any], expected: int) -> None:
    assert translate(extra, **changes).body["max_tokens"] == expected


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_output_limit_above_the_model_maximum_refused(field: str) -> None:
    assert refused({field: 64_001}) == (f"{field}: must be at most 64000 for model test", field)


@pytest.mark.parametrize(
    "stop, expected",
    [
        ("END", ["END"]),
        (["a", "b"], ["a", "b"]),
        (["\n", " ", "x"], ["x"]),
        ([" "], None),
        (None, None),
    ],
    ids=["string", "list", "whitespace-dropped", "only-whitespace", "null"],
)
def test_stop_sequences(stop: Any, expected: list[str] | None) -> None:
    assert translate({"stop": stop}).body.get("stop_sequences") == expected


def test_json_schema_becomes_native_structured_output() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    body = translate({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}).body
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert "tools" not in body and "tool_choice" not in body  # never a forced tool


def test_text_response_format_sends_nothing() -> None:
    assert "output_config" not in translate({"response_format": {"type": "text"}}).body


def test_structured_output_refused_by_models_without_it() -> None:
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    assert refused({"response_format": rf}, structured_output=False)[1] == "response_format"


# ---------------------------------------------------------------- Prompt caching


def _marks(body: dict[str, Any]) -> list[str]:
    found = []
    for i, block in enumerate(body.get("system", [])):
        if "cache_control" in block:
            found.append(f"system[{i}]")
    for i, tool in enumerate(body.get("tools", [])):
        if "cache_control" in tool:
            found.append(f"tools[{i}]")
    for i, message in enumerate(body["messages"]):
        for j, block in enumerate(message["content"]):
            if "cache_control" in block:
                found.append(f"messages[{i}][{j}]")
    return found


def test_automatic_breakpoints_end_of_system_and_newest_message() -> None:
    t = translate(
        messages=[
            {"role": "system", "content": "S"},
            USER,
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": [{"type": "text", "text": "B"}, {"type": "text", "text": "C"}]},
        ],
        auto_cache=True,
    )
    assert _marks(t.body) == ["system[0]", "messages[2][1]"]
    assert t.body["messages"][2]["content"][1]["cache_control"] == {"type": "ephemeral"}


def test_automatic_breakpoint_on_tools_without_a_system_prompt() -> None:
    t = translate({"tools": [WEATHER_TOOL, {"type": "function", "function": {"name": "b"}}]}, auto_cache=True)
    assert _marks(t.body) == ["tools[1]", "messages[0][0]"]


def test_automatic_breakpoint_never_on_an_empty_tool_result() -> None:
    t = translate(
        {"tools": [WEATHER_TOOL]},
        messages=[
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": ""},
        ],
        auto_cache=True,
    )
    assert _marks(t.body) == ["tools[0]"]


@pytest.mark.parametrize("where", ["part", "system", "tool"])
def test_client_breakpoints_kept_and_none_added(where: str) -> None:
    mark = {"type": "ephemeral", "ttl": "1h"}
    messages: list[dict[str, Any]] = [{"role": "system", "content": "S"}, USER]
    tools = [WEATHER_TOOL]
    if where == "part":
        messages[1] = {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": mark}]}
    elif where == "system":
        messages[0] = {"role": "system", "content": [{"type": "text", "text": "S", "cache_control": mark}]}
    else:
        tools = [{**WEATHER_TOOL, "cache_control": mark}]
    t = translate({"tools": tools}, messages=messages, auto_cache=True)
    assert len(_marks(t.body)) == 1
    assert json.dumps(mark) in json.dumps(t.body)


def test_no_automatic_breakpoints_when_caching_is_off_or_unsupported() -> None:
    messages = [{"role": "system", "content": "S"}, USER]
    assert _marks(translate(messages=messages, auto_cache=False).body) == []  # x-ezat-cache: off
    assert _marks(translate(messages=messages, auto_cache=True, caching=False).body) == []


def test_more_than_four_client_breakpoints_refused() -> None:
    mark = {"type": "ephemeral"}
    parts = [{"type": "text", "text": str(i), "cache_control": mark} for i in range(5)]
    assert refused(messages=[{"role": "user", "content": parts}])[1] == "messages[0].content[4].cache_control"


def test_prompt_cache_key_reaches_the_router_not_the_upstream() -> None:
    t = translate({"prompt_cache_key": "conversation-42"})
    assert t.session == "conversation-42"
    assert "conversation-42" not in json.dumps(t.body)


def test_prompt_cache_key_longer_than_256_refused() -> None:
    assert refused({"prompt_cache_key": "k" * 257})[1] == "prompt_cache_key"


# ---------------------------------------------------------------- Ignored and refused


def test_ignored_fields_never_reach_the_upstream() -> None:
    ignored = {
        "user": "u",
        "seed": 1,
        "presence_penalty": 1,
        "frequency_penalty": 1,
        "store": True,
        "metadata": {"a": "b"},
        "service_tier": "auto",
        "unknown_field": {"x": 1},
        "n": 1,
        "logprobs": False,
        "top_logprobs": 0,
        "logit_bias": {},
        "modalities": ["text"],
        "prediction": {"type": "content"},
    }
    body = translate(ignored).body
    for name in ignored:
        assert name not in body
    assert set(body) == {"max_tokens", "messages"}


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"n": 2}, "n: only 1 choice per request is supported"),
        ({"logprobs": True}, "logprobs: log probabilities are not available"),
        ({"top_logprobs": 3}, "top_logprobs: log probabilities are not available"),
        ({"logit_bias": {"50256": -100}}, "logit_bias: is not supported"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "modalities: only text output is supported"),
        ({"modalities": ["text", "audio"]}, "modalities: only text output is supported"),
        ({"web_search_options": {}}, "web_search_options: is not supported"),
        ({"functions": [{"name": "f"}]}, "functions: the legacy functions API is not supported; use tools"),
        ({"function_call": "auto"}, "functions: the legacy functions API is not supported; use tools"),
        (
            {"response_format": {"type": "json_object"}},
            'response_format: type "json_object" is not supported; use "json_schema" with a schema (objects need '
            '"additionalProperties": false)',
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type: only function tools are supported"),
        ({"reasoning_effort": "ultra"}, "reasoning_effort: use one of none, minimal, low, medium, high, xhigh, max"),
    ],
    ids=[
        "n",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "audio",
        "modalities",
        "web_search_options",
        "functions",
        "function_call",
        "json_object",
        "tool-type",
        "reasoning_effort",
    ],
)
def test_refused_fields_table(extra: dict[str, Any], message: str) -> None:
    got, param = refused(extra)
    assert got == message
    assert param == message.split(":", 1)[0]


@pytest.mark.parametrize(
    "messages, message",
    [
        (
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}]}],
            "messages[0].content[0]: audio input is not supported",
        ),
        (
            [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-abc"}}]}],
            "messages[0].content[0].file: send the PDF as file_data (a base64 data URL); file_id is not supported",
        ),
        (
            [{"role": "function", "name": "f", "content": "x"}],
            'messages[0].role: the legacy "function" role is not supported; use tools',
        ),
    ],
    ids=["input_audio", "file_id", "function-role"],
)
def test_refused_parts_and_roles_table(messages: list[dict[str, Any]], message: str) -> None:
    got, param = refused(messages=messages)
    assert got == message
    assert param == message.split(":", 1)[0]


def test_refused_indexes_point_at_the_clients_request() -> None:
    messages = [
        {"role": "system", "content": "S"},
        USER,
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "input_audio", "input_audio": {}}]},
    ]
    assert refused(messages=messages)[0] == "messages[3].content[1]: audio input is not supported"


@pytest.mark.parametrize(
    "extra, path",
    [
        ({"max_tokens": "64"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"stream": "yes"}, "stream"),
        ({"model": ""}, "model"),
        ({"messages": "hi"}, "messages"),
        ({"model": "m" * 129}, "model"),
    ],
    ids=[
        "string-int",
        "zero",
        "temperature-range",
        "top-p-range",
        "stream-not-bool",
        "empty-model",
        "messages-string",
        "model-too-long",
    ],
)
def test_wrong_types_refused_naming_the_field(extra: dict[str, Any], path: str) -> None:
    assert refused(extra)[1] == path


def test_every_option_at_once_still_validates_against_the_sdk_types() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    t = translate(
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "reasoning_effort": "max",
            "max_completion_tokens": 1000,
            "stop": ["END"],
            "temperature": 0.3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        },
        messages=[
            {"role": "system", "content": "S"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": PNG_URL}},
                    {"type": "file", "file": {"file_data": PDF_URL}},
                ],
            },
            {"role": "assistant", "content": "x", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "9"},
        ],
        auto_cache=True,
        sampling=True,
    )
    assert t.stream and t.include_usage and t.thinking
