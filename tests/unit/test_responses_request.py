"""Responses request -> Anthropic request: one row per rule of docs/responses.md.

Every translated request is validated with the anthropic SDK's request types. Each row's id
names the rule; the comment names the reference page's section.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ezat_compat.dialects import invalid_request
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.responses_request import ResponsesTranslation, input_items, responses_to_anthropic
from ezat_compat.translate.responses_tools import ClientTool, flat_name
from ezat_compat.wire.loading import RequestValidationError
from ezat_compat.wire.responses import load_responses_request
from tests.support.anthropic_types import validate_anthropic_request
from tests.support.translation import BASE_MODEL, PDF_URL, PNG_URL

USER = {"role": "user", "content": "Hi"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"},
}
SPAWN = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}}
NAMESPACE = {"type": "namespace", "name": "multi_agent", "description": "Agents", "tools": [SPAWN]}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
BLOCK = {"type": "thinking", "thinking": "Let me see.", "signature": "sig=="}


def model(**changes: Any) -> Any:
    return dataclasses.replace(BASE_MODEL, **changes)


def unseal(sealed: Any, path: str) -> list[dict[str, Any]]:
    """The test's seal: a list of blocks stands for itself; anything else is "tampered"."""
    if isinstance(sealed, list):
        return sealed
    raise InvalidRequestError(f"{path}: tampered", param=path)


def translate(
    extra: dict[str, Any] | None = None, *, auto_cache: bool = False, check: bool = True, **model_changes: Any
) -> ResponsesTranslation:
    body: dict[str, Any] = {"model": "test", "input": [USER], **(extra or {})}
    try:  # the schema first, as the dialect loads the body
        req = load_responses_request(body)
    except RequestValidationError as exc:
        raise invalid_request(exc) from None
    result = responses_to_anthropic(req, input_items(req), model(**model_changes), unseal=unseal, auto_cache=auto_cache)
    for slot in result.image_slots:  # what the image step makes of each downloaded URL
        if slot.pdf:
            slot.block["source"] = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}
        else:
            slot.block["source"] = {"type": "base64", "media_type": "image/png", "data": PNG_URL.split(",", 1)[1]}
    if check:  # (the SDK's request types have no thinking blocks: rows that put some back skip it)
        validate_anthropic_request(result.body)
    return result


def refused(extra: dict[str, Any] | None = None, **model_changes: Any) -> tuple[str, str | None]:
    try:
        translate(extra, **model_changes)
    except InvalidRequestError as exc:
        assert exc.status == 400 and exc.openai_type == "invalid_request_error"
        return exc.message, exc.param
    raise AssertionError("the request was not refused")


# ---------------------------------------------------------------- request fields


def test_string_input_is_one_user_message() -> None:
    t = translate({"input": "Hello"})
    assert t.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]


def test_instructions_first_then_system_and_developer_messages_wherever_they_appear() -> None:
    # Request fields: instructions; Input items: system / developer joined into the system prompt.
    t = translate(
        {
            "instructions": "Be brief.",
            "input": [
                {"type": "message", "role": "developer", "content": "A"},
                USER,
                {"role": "system", "content": [{"type": "input_text", "text": "B"}]},
            ],
        }
    )
    assert [b["text"] for b in t.body["system"]] == ["Be brief.", "A", "B"]
    assert len(t.body["messages"]) == 1


@pytest.mark.parametrize(
    ("effort", "expected_effort", "thinking"),
    [
        pytest.param("high", "high", {"type": "adaptive"}, id="high-thinks"),
        pytest.param("minimal", "low", None, id="minimal-no-thinking"),
        pytest.param("none", "low", None, id="none-no-thinking"),
    ],
)
def test_reasoning_effort_as_chat_reasoning_effort(effort: str, expected_effort: str, thinking: Any) -> None:
    t = translate({"reasoning": {"effort": effort}})
    assert t.body["output_config"]["effort"] == expected_effort
    assert t.body.get("thinking") == thinking
    assert t.thinking is (thinking is not None)


def test_reasoning_effort_the_model_lacks_names_reasoning_effort() -> None:
    message, param = refused({"reasoning": {"effort": "max"}}, efforts=("low", "medium", "high"))
    assert param == "reasoning.effort" and '"max" is not supported' in message


def test_reasoning_summary_asks_for_summaries() -> None:
    assert translate({"reasoning": {"effort": "low", "summary": "auto"}}).summary is True
    assert translate({"reasoning": {"effort": "low"}}).summary is False


def test_text_format_json_schema_is_structured_output_fitted() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}}
    t = translate({"text": {"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}}})
    fmt = t.body["output_config"]["format"]
    assert fmt["type"] == "json_schema"
    assert fmt["schema"]["additionalProperties"] is False
    assert "minLength" not in fmt["schema"]["properties"]["a"]


def test_text_format_text_is_nothing() -> None:
    assert "output_config" not in translate({"text": {"format": {"type": "text"}, "verbosity": "low"}}).body


@pytest.mark.parametrize(
    ("extra", "changes", "param", "fragment"),
    [
        pytest.param(
            {"text": {"format": {"type": "json_object"}}}, {}, "text.format.type", "json_object", id="json-object"
        ),
        pytest.param(
            {"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            {"structured_output": False},
            "text.format",
            "does not support structured output",
            id="no-structured-output",
        ),
        pytest.param(
            {"text": {"format": {"type": "json_schema", "schema": {"type": "object", "additionalProperties": True}}}},
            {},
            "text.format.schema",
            "additionalProperties",
            id="inexpressible-schema",
        ),
        pytest.param({"max_output_tokens": 64001}, {}, "max_output_tokens", "at most 64000", id="max-output-tokens"),
        pytest.param({"max_output_tokens": "9"}, {}, "max_output_tokens", "integer", id="max-output-tokens-type"),
        pytest.param(
            {"temperature": 3},
            {},
            "temperature",
            "Must be greater than or equal to 0 and less than or equal to 2.",
            id="temperature-range",
        ),
        pytest.param({"reasoning": {"effort": "huge"}}, {}, "reasoning.effort", "use one of", id="effort-unknown"),
        pytest.param(
            {"reasoning": {"summary": "long"}}, {}, "reasoning.summary", "auto, concise", id="summary-unknown"
        ),
    ],
)
def test_refused_values(extra: dict[str, Any], changes: dict[str, Any], param: str, fragment: str) -> None:
    message, got = refused(extra, **changes)
    assert (got or "").startswith(param) and fragment in message


def test_max_output_tokens_is_max_tokens_with_the_default() -> None:
    assert translate({"max_output_tokens": 100}).body["max_tokens"] == 100
    assert translate().body["max_tokens"] == 32000
    assert translate(max_output_tokens=8000).body["max_tokens"] == 8000


@pytest.mark.parametrize(
    ("extra", "sampling", "expected"),
    [
        pytest.param({"temperature": 1.5}, True, {"temperature": 1}, id="capped-at-1"),
        pytest.param({"top_p": 0.5}, True, {"top_p": 0.5}, id="top-p"),
        pytest.param({"temperature": 0.2, "top_p": 0.5}, True, {"temperature": 0.2}, id="never-both"),
        pytest.param({"temperature": 0.2}, False, {}, id="model-without-sampling"),
        pytest.param({"temperature": 0.2, "reasoning": {"effort": "low"}}, True, {}, id="not-while-thinking"),
    ],
)
def test_sampling_gated_per_model(extra: dict[str, Any], sampling: bool, expected: dict[str, Any]) -> None:
    body = translate(extra, sampling=sampling).body
    assert {k: body[k] for k in ("temperature", "top_p") if k in body} == expected


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        pytest.param({"background": True}, "background", "not supported", id="background"),
        pytest.param({"conversation": "conv_1"}, "conversation", "previous_response_id", id="conversation"),
        pytest.param({"prompt": {"id": "pmpt_1"}}, "prompt", "templates", id="prompt"),
        pytest.param({"top_logprobs": 2}, "top_logprobs", "log probabilities", id="top-logprobs"),
        pytest.param(
            {"include": ["message.output_text.logprobs"]}, "include[0]", "not supported", id="include-logprobs"
        ),
        pytest.param({"include": ["file_search_call.everything"]}, "include[0]", "not supported", id="include-unknown"),
        pytest.param(
            {"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]},
            "include[1]",
            '"message.output_text.logprobs" is not supported',
            id="include-second",
        ),
    ],
)
def test_refused_fields_name_the_field(extra: dict[str, Any], param: str, fragment: str) -> None:
    message, got = refused(extra)
    assert got == param and message.startswith(f"{param}: ") and fragment in message


@pytest.mark.parametrize(
    ("include", "encrypted"),
    [
        pytest.param(["web_search_call.action.sources"], False, id="web-search-sources"),
        pytest.param(["web_search_call.results"], False, id="web-search-results"),
        pytest.param(["code_interpreter_call.outputs"], False, id="code-interpreter-outputs"),
        pytest.param(["computer_call_output.output.image_url"], False, id="computer-call-image"),
        pytest.param(["file_search_call.results"], False, id="file-search-results"),
        pytest.param(["message.input_image.image_url"], False, id="input-image-url"),
        pytest.param(["web_search_call.action.sources", "reasoning.encrypted_content"], True, id="beside-encrypted"),
    ],
)
def test_include_values_that_cant_change_the_answer_are_ignored(include: list[str], encrypted: bool) -> None:
    t = translate({"include": include})
    assert t.encrypted is encrypted and "include" not in t.body


def test_accepted_values_of_refused_fields_pass() -> None:
    t = translate({"background": False, "top_logprobs": 0, "include": ["reasoning.encrypted_content"]})
    assert t.encrypted is True


def test_unknown_and_ignored_fields_are_never_forwarded() -> None:
    extra = {
        "client_metadata": {"x": 1},
        "metadata": {"a": "b"},
        "user": "u",
        "safety_identifier": "s",
        "truncation": "auto",
        "service_tier": "flex",
        "max_tool_calls": 3,
        "stream_options": {"include_obfuscation": False},
        "prompt_cache_retention": "24h",
        "zzz": 1,
    }
    body = translate(extra).body
    assert set(body) == {"max_tokens", "messages"}


def test_prompt_cache_key_is_the_session() -> None:
    assert translate({"prompt_cache_key": "conv-9"}).session == "conv-9"


def test_auto_cache_breakpoints_unless_off() -> None:
    on = translate({"instructions": "S"}, auto_cache=True).body
    assert on["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert on["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    off = translate({"instructions": "S"}, auto_cache=False).body
    assert "cache_control" not in off["system"][-1]


# ---------------------------------------------------------------- input items and parts


def test_parts_text_image_pdf() -> None:
    t = translate(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Look"},
                        {"type": "input_image", "image_url": PNG_URL, "detail": "high"},
                        {"type": "input_file", "file_data": PDF_URL, "filename": "a.pdf"},
                        {"type": "input_text", "text": "  "},
                    ],
                }
            ]
        }
    )
    content = t.body["messages"][0]["content"]
    assert [b["type"] for b in content] == ["text", "image", "document"]
    assert content[1]["source"]["media_type"] == "image/png"
    assert content[2]["title"] == "a.pdf"


def test_a_pdf_by_url_is_a_document_the_gateway_downloads() -> None:
    part = {"type": "input_file", "file_url": "https://example.com/a.pdf", "filename": "report.pdf"}
    t = translate(
        {"input": [{"role": "user", "content": [part, {"type": "input_text", "text": "Sum it up"}]}]}, check=False
    )
    document, _text = t.body["messages"][0]["content"]
    assert document["type"] == "document" and document["title"] == "report.pdf"
    (slot,) = t.image_slots
    assert (slot.path, slot.url, slot.pdf, slot.block is document) == (
        "input[0].content[0].file_url",
        "https://example.com/a.pdf",
        True,
        True,
    )


def test_image_url_to_download_is_a_slot_named_by_its_path() -> None:
    t = translate(
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x.test/a.png"}]}]}
    )
    assert [(s.path, s.url) for s in t.image_slots] == [("input[0].content[0].image_url", "https://x.test/a.png")]


@pytest.mark.parametrize(
    ("part", "changes", "param", "fragment"),
    [
        pytest.param(
            {"type": "input_image", "file_id": "file_1"},
            {},
            "input[0].content[0].file_id",
            "file ids",
            id="image-file-id",
        ),
        pytest.param(
            {"type": "input_image", "image_url": "ftp://x"},
            {},
            "input[0].content[0].image_url",
            "http(s)",
            id="image-scheme",
        ),
        pytest.param(
            {"type": "input_image", "image_url": PNG_URL},
            {"vision": False},
            "input[0].content[0]",
            "images",
            id="no-vision",
        ),
        pytest.param(
            {"type": "input_file", "file_id": "file_1"}, {}, "input[0].content[0].file_id", "file ids", id="file-id"
        ),
        pytest.param(
            {"type": "input_file", "file_url": "file:///etc/passwd"},
            {},
            "input[0].content[0].file_url",
            "http(s)",
            id="file-url-scheme",
        ),
        pytest.param(
            {"type": "input_file", "file_url": "https:///a.pdf"},
            {},
            "input[0].content[0].file_url",
            "http(s)",
            id="file-url-without-host",
        ),
        pytest.param(
            {"type": "input_file", "file_data": PNG_URL}, {}, "input[0].content[0].file_data", "only PDF", id="not-pdf"
        ),
        pytest.param(
            {"type": "input_file", "file_data": PDF_URL}, {"pdf": False}, "input[0].content[0]", "PDF", id="no-pdf"
        ),
        pytest.param(  # as chat's: on the part itself
            {"type": "input_audio", "input_audio": {}}, {}, "input[0].content[0]", "audio input is not", id="audio"
        ),
        pytest.param(
            {"type": "hologram"}, {}, "input[0].content[0].type", "Must be one of: input_text", id="unknown-part"
        ),
    ],
)
def test_refused_parts(part: dict[str, Any], changes: dict[str, Any], param: str, fragment: str) -> None:
    message, got = refused({"input": [{"role": "user", "content": [part]}]}, **changes)
    assert got == param and fragment in message


def test_assistant_output_text_and_refusal() -> None:
    t = translate(
        {
            "input": [
                USER,
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello"}, {"type": "refusal", "refusal": "no"}],
                },
                {"role": "user", "content": "More"},
            ]
        }
    )
    assert t.body["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}


def test_function_call_and_output_become_tool_use_and_tool_result_first_in_their_turn() -> None:
    t = translate(
        {
            "input": [
                USER,
                CALL,
                {"type": "function_call", "call_id": "call 2", "name": "get_weather", "arguments": ""},
                {"role": "user", "content": "and"},
                OUTPUT,
                {
                    "type": "function_call_output",
                    "call_id": "call 2",
                    "output": [{"type": "input_text", "text": "rain"}],
                },
            ],
            "tools": [WEATHER],
        }
    )
    assistant = t.body["messages"][1]["content"]
    assert assistant[0] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}}
    assert assistant[1]["input"] == {} and assistant[1]["id"].startswith("ezat-")
    user = t.body["messages"][2]["content"]
    assert [b["type"] for b in user] == ["tool_result", "tool_result", "text"]
    assert user[0]["content"] == "sunny" and user[1]["content"] == [{"type": "text", "text": "rain"}]
    assert user[1]["tool_use_id"] == assistant[1]["id"]


def test_custom_tool_call_and_output() -> None:
    t = translate(
        {
            "input": [
                USER,
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
            ],
            "tools": [PATCH],
        }
    )
    assert t.body["messages"][1]["content"][0]["input"] == {"input": "*** Begin Patch"}
    assert t.body["messages"][2]["content"][0]["tool_use_id"] == "c1"


def test_namespaced_function_call_is_flattened() -> None:
    call = {
        "type": "function_call",
        "call_id": "c1",
        "name": "spawn_agent",
        "namespace": "multi_agent",
        "arguments": "{}",
    }
    t = translate({"input": [USER, call, {**OUTPUT, "call_id": "c1"}], "tools": [NAMESPACE]})
    assert t.body["messages"][1]["content"][0]["name"] == "multi_agent__spawn_agent"


def test_reasoning_with_encrypted_content_is_put_back_where_it_was() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": [BLOCK]}
    t = translate(
        {"input": [USER, reasoning, CALL, OUTPUT], "tools": [WEATHER], "reasoning": {"effort": "high"}}, check=False
    )
    assert t.body["messages"][1]["content"][0] == BLOCK
    assert t.body["messages"][1]["content"][1]["type"] == "tool_use"


def test_reasoning_without_encrypted_content_and_web_search_calls_are_left_out() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "x"}]}
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}}
    t = translate({"input": [USER, reasoning, search, CALL, OUTPUT], "tools": [WEATHER]})
    assert [b["type"] for b in t.body["messages"][1]["content"]] == ["tool_use"]


def test_tampered_encrypted_content_is_refused_naming_it() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "garbage"}
    _message, param = refused({"input": [USER, reasoning, CALL, OUTPUT], "tools": [WEATHER]})
    assert param == "input[1].encrypted_content"


@pytest.mark.parametrize(
    ("items", "param", "fragment"),
    [
        pytest.param([], "input", "at least one user message", id="empty"),
        pytest.param([{"role": "system", "content": "S"}], "input", "at least one user message", id="system-only"),
        pytest.param([USER, {"role": "tool", "content": "x"}], "input[1].role", "user, assistant", id="bad-role"),
        pytest.param([USER, CALL], "input[1]", "has no output", id="call-without-output"),
        pytest.param(
            [USER, CALL, USER, {"role": "assistant", "content": "x"}],
            "input[1]",
            "has no output",
            id="output-missing-before-assistant",
        ),
        pytest.param([USER, OUTPUT], "input[1].call_id", "no function_call", id="unknown-call-id"),
        pytest.param([USER, CALL, OUTPUT, OUTPUT], "input[3].call_id", "already has an output", id="two-outputs"),
        pytest.param([USER, CALL, CALL], "input[2].call_id", "used twice", id="call-id-twice"),
        pytest.param(
            [USER, {**CALL, "arguments": "{"}], "input[1].arguments", "not valid JSON", id="arguments-not-json"
        ),
        pytest.param(
            [USER, {**CALL, "arguments": "[1]"}], "input[1].arguments", "JSON object", id="arguments-not-object"
        ),
        pytest.param([USER, {"type": "computer_call"}], "input[1].type", "unsupported input item", id="unknown-item"),
        pytest.param([USER, {"role": "assistant", "content": "Pre"}], "input[1].content", "prefill", id="no-prefill"),
        pytest.param(
            [{"role": "user", "content": 5}], "input[0].content", "Must be a string or a list.", id="content-type"
        ),
    ],
)
def test_refused_conversations(items: list[dict[str, Any]], param: str, fragment: str) -> None:
    message, got = refused({"input": items, "tools": [WEATHER]})
    assert got == param and fragment in message


def test_input_of_the_wrong_type() -> None:
    message, param = refused({"input": 5})
    assert (param, message) == ("input", "input: Must be a string or a list.")


def test_prefill_for_models_with_it_strips_trailing_whitespace() -> None:
    t = translate({"input": [USER, {"role": "assistant", "content": "Pre "}]}, prefill=True)
    assert t.body["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "Pre"}]}


# ---------------------------------------------------------------- tools


def test_function_tool_with_strict_is_fitted_and_forwarded() -> None:
    strict = {**WEATHER, "strict": True}
    t = translate({"tools": [strict, {**WEATHER, "name": "plain"}]})
    first, second = t.body["tools"]
    assert first["strict"] is True and first["input_schema"]["additionalProperties"] is False
    assert "strict" not in second and "additionalProperties" not in second["input_schema"]
    assert t.tools == {"get_weather": ClientTool("function", "get_weather"), "plain": ClientTool("function", "plain")}


def test_custom_tool_takes_one_string_and_its_grammar_is_described() -> None:
    t = translate({"tools": [PATCH]})
    tool = t.body["tools"][0]
    assert tool["name"] == "apply_patch"
    assert tool["input_schema"]["properties"] == {
        "input": {"type": "string", "description": "The tool's input, as free text."}
    }
    assert tool["input_schema"]["required"] == ["input"]
    assert "lark grammar" in tool["description"] and "start: begin_patch" in tool["description"]
    assert t.tools["apply_patch"] == ClientTool("custom", "apply_patch")


def test_namespace_tools_become_ordinary_tools_that_round_trip() -> None:
    t = translate({"tools": [NAMESPACE]})
    assert [tool["name"] for tool in t.body["tools"]] == ["multi_agent__spawn_agent"]
    assert t.tools["multi_agent__spawn_agent"] == ClientTool("function", "spawn_agent", "multi_agent")


@pytest.mark.parametrize(
    ("namespace", "name", "flat"),
    [("ns", "tool", "ns__tool"), ("ns_", "_tool", "ns__tool"), (None, "tool", "tool")],
)
def test_flat_names(namespace: str | None, name: str, flat: str) -> None:
    assert flat_name(namespace, name) == flat


def test_web_search_for_a_model_with_it() -> None:
    tool = {
        "type": "web_search",
        "filters": {"allowed_domains": ["example.com"]},
        "user_location": {"type": "approximate", "city": "Oslo", "country": "NO"},
        "search_context_size": "high",
    }
    t = translate({"tools": [tool, WEATHER]}, web_search=True, check=False)  # (server tools: not in the checker)
    assert t.body["tools"][0] == {
        "type": "web_search_20250305",
        "name": "web_search",
        "allowed_domains": ["example.com"],
        "user_location": {"type": "approximate", "city": "Oslo", "country": "NO"},
    }


@pytest.mark.parametrize("kind", ["web_search", "web_search_preview", "web_search_2025_08_26"])
def test_web_search_left_out_for_a_model_without_it(kind: str) -> None:
    t = translate({"tools": [{"type": kind}, WEATHER]})
    assert [tool["name"] for tool in t.body["tools"]] == ["get_weather"]
    assert "tools" not in translate({"tools": [{"type": kind}]}).body


@pytest.mark.parametrize(
    "kind",
    [
        "file_search",
        "code_interpreter",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
    ],
)
def test_built_in_tools_without_an_equivalent_are_refused_naming_the_type(kind: str) -> None:
    message, param = refused({"tools": [WEATHER, {"type": kind}]})
    assert param == "tools[1].type" and "not supported" in message


@pytest.mark.parametrize(
    ("tools", "param", "fragment"),
    [
        pytest.param([{"type": "laser"}], "tools[0].type", "unsupported tool type", id="unknown-type"),
        pytest.param([{**WEATHER, "name": "get weather"}], "tools[0].name", "a-zA-Z0-9", id="bad-name"),
        pytest.param([WEATHER, WEATHER], "tools[1].name", "duplicate", id="duplicate"),
        pytest.param(
            [{**WEATHER, "parameters": {"type": "array"}}], "tools[0].parameters.type", '"object"', id="not-object"
        ),
        pytest.param(
            [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}],
            "tools[0].tools[0].type",
            "function or custom",
            id="namespace-member",
        ),
        pytest.param(
            [{"type": "namespace", "name": "n" * 100, "tools": [{**SPAWN, "name": "t" * 40}]}],
            "tools[0].tools[0].name",
            "namespace",
            id="namespace-too-long",
        ),
        pytest.param([{"type": "function"}], "tools[0].name", "required", id="no-name"),
    ],
)
def test_refused_tools(tools: list[dict[str, Any]], param: str, fragment: str) -> None:
    message, got = refused({"tools": tools})
    assert got == param and fragment in message


def test_tools_on_a_model_without_tools() -> None:
    assert refused({"tools": [WEATHER]}, tools=False)[1] == "tools"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        pytest.param("auto", {"type": "auto"}, id="auto"),
        pytest.param("none", {"type": "none"}, id="none"),
        pytest.param("required", {"type": "any"}, id="required"),
        pytest.param(
            {"type": "function", "name": "get_weather"}, {"type": "tool", "name": "get_weather"}, id="function"
        ),
        pytest.param({"type": "custom", "name": "apply_patch"}, {"type": "tool", "name": "apply_patch"}, id="custom"),
        pytest.param(
            {"type": "function", "name": "spawn_agent", "namespace": "multi_agent"},
            {"type": "tool", "name": "multi_agent__spawn_agent"},
            id="namespaced",
        ),
    ],
)
def test_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    t = translate({"tools": [WEATHER, PATCH, NAMESPACE], "tool_choice": choice})
    assert t.body["tool_choice"] == expected


def test_parallel_tool_calls_false_disables_parallel_use() -> None:
    t = translate({"tools": [WEATHER], "parallel_tool_calls": False})
    assert t.body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_forced_tool_choice_turns_thinking_off() -> None:
    t = translate({"tools": [WEATHER], "tool_choice": "required", "reasoning": {"effort": "high"}})
    assert "thinking" not in t.body and t.thinking is False


@pytest.mark.parametrize(
    ("choice", "changes", "param", "fragment"),
    [
        pytest.param(
            {"type": "function", "name": "nope"}, {}, "tool_choice.name", "no function tool", id="unknown-name"
        ),
        pytest.param(
            {"type": "custom", "name": "get_weather"}, {}, "tool_choice.name", "no custom tool", id="wrong-kind"
        ),
        pytest.param(
            "required", {"forced_tool_choice": False}, "tool_choice", "forced tool choice", id="forced-unsupported"
        ),
        pytest.param({"type": "allowed_tools", "tools": []}, {}, "tool_choice", "must be", id="allowed-tools"),
        pytest.param({"type": "web_search"}, {}, "tool_choice.type", "no web search", id="web-search-absent"),
    ],
)
def test_refused_tool_choices(choice: Any, changes: dict[str, Any], param: str, fragment: str) -> None:
    message, got = refused({"tools": [WEATHER], "tool_choice": choice}, **changes)
    assert got == param and fragment in message


def test_source_map_names_the_client_paths() -> None:
    t = translate({"instructions": "S", "input": [USER, CALL, OUTPUT], "tools": [WEATHER]})
    assert t.source_map[("system", 0)] == "instructions"
    assert t.source_map[("messages", 1, 0)] == "input[1]"
    assert t.source_map[("messages", 2, 0)] == "input[2]"
    assert t.source_map[("tools", 0)] == "tools[0]"


# ---------------------------------------------------------------- Codex: tool search and Responses-lite tools
# The shapes are Codex's (openai/codex): the tool codex-rs/tools/src/tool_spec.rs (ToolSpec::ToolSearch,
# create_tools_json_for_responses_lite), the items codex-rs/protocol/src/models.rs (ResponseItem::
# ToolSearchCall, ToolSearchOutput, AdditionalTools), the tools found codex-rs/tools/src/tool_search.rs.

SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
    "required": ["query"],
    "additionalProperties": False,
}
TOOL_SEARCH = {
    "type": "tool_search",
    "execution": "client",
    "description": "Search the tools of connected apps and MCP servers.",
    "parameters": SEARCH_PARAMETERS,
}
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
LITE_TOOLS = {  # Codex's Responses-lite: top-level tools folded into the "functions" namespace, in input
    "type": "additional_tools",
    "role": "developer",
    "tools": [{"type": "namespace", "name": "functions", "description": "Tools", "tools": [EXEC, PATCH]}, TOOL_SEARCH],
}
SEARCH_CALL = {
    "type": "tool_search_call",
    "call_id": "search-1",
    "execution": "client",
    "status": "completed",
    "arguments": {"query": "calendar create", "limit": 1},
}
FOUND = {
    "type": "function",
    "name": "create_event",
    "description": "",
    "strict": False,
    "defer_loading": True,
    "parameters": {"type": "object", "properties": {}},
}
SEARCH_OUTPUT = {
    "type": "tool_search_output",
    "call_id": "search-1",
    "status": "completed",
    "execution": "client",
    "tools": [{"type": "namespace", "name": "mcp__calendar__", "description": "Calendar", "tools": [FOUND]}],
}


def test_a_client_run_tool_search_is_a_tool_the_model_calls() -> None:
    t = translate({"tools": [WEATHER, TOOL_SEARCH]})
    assert t.body["tools"][1] == {
        "name": "tool_search",
        "description": "Search the tools of connected apps and MCP servers.",
        "input_schema": SEARCH_PARAMETERS,
    }
    assert t.tools["tool_search"] == ClientTool("tool_search", "tool_search")


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        pytest.param({"type": "tool_search", "execution": "server"}, "tools[1].execution", id="server"),
        pytest.param({"type": "tool_search"}, "tools[1].execution", id="hosted-by-default"),
    ],
)
def test_a_tool_search_we_cant_run_is_refused_naming_it(tool: dict[str, Any], param: str) -> None:
    message, got = refused({"tools": [WEATHER, tool]})
    assert got == param
    assert message == f'{param}: the built-in tool "tool_search" is supported only with "execution": "client"'


def test_a_tool_search_round_trip_loads_the_tools_found() -> None:
    items = [USER, SEARCH_CALL, SEARCH_OUTPUT]
    t = translate({"input": items, "tools": [EXEC, TOOL_SEARCH]})
    assert [tool["name"] for tool in t.body["tools"]] == ["exec_command", "tool_search", "mcp__calendar__create_event"]
    assert "defer_loading" not in t.body["tools"][2]  # Anthropic's own deferral is not asked for
    assert t.tools["mcp__calendar__create_event"] == ClientTool("function", "create_event", "mcp__calendar__")
    assert t.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "search-1",
                    "name": "tool_search",
                    "input": {"query": "calendar create", "limit": 1},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "search-1",
                    "content": "Tools found, now available to call: mcp__calendar__create_event.",
                }
            ],
        },
    ]


def test_a_tool_found_twice_or_already_declared_is_declared_once() -> None:
    again = {**SEARCH_CALL, "call_id": "search-2"}
    output = {**SEARCH_OUTPUT, "call_id": "search-2", "tools": [*SEARCH_OUTPUT["tools"], EXEC]}
    t = translate({"input": [USER, SEARCH_CALL, SEARCH_OUTPUT, again, output], "tools": [EXEC, TOOL_SEARCH]})
    assert [tool["name"] for tool in t.body["tools"]] == ["exec_command", "tool_search", "mcp__calendar__create_event"]


def test_a_search_that_found_nothing_says_so() -> None:
    t = translate({"input": [USER, SEARCH_CALL, {**SEARCH_OUTPUT, "tools": []}], "tools": [TOOL_SEARCH]})
    assert t.body["messages"][2]["content"][0]["content"] == "No tools found."


def test_responses_lite_additional_tools_are_the_requests_tools() -> None:
    t = translate({"input": [LITE_TOOLS, USER], "parallel_tool_calls": False, "tool_choice": "auto"})
    assert [tool["name"] for tool in t.body["tools"]] == ["exec_command", "apply_patch", "tool_search"]
    assert t.tools["exec_command"] == ClientTool("function", "exec_command")  # the default namespace: none
    assert t.tools["apply_patch"] == ClientTool("custom", "apply_patch")
    assert t.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert t.body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_calls_in_the_default_namespace_are_its_members() -> None:
    call = {**CALL, "name": "exec_command", "namespace": "functions", "arguments": '{"cmd": "ls"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    t = translate({"input": [LITE_TOOLS, USER, call, output]})
    assert t.body["messages"][1]["content"][0]["name"] == "exec_command"


@pytest.mark.parametrize(
    ("items", "param", "fragment"),
    [
        pytest.param(
            [{**LITE_TOOLS, "tools": [{"type": "code_interpreter"}]}, USER],
            "input[0].tools[0].type",
            'the built-in tool "code_interpreter" is not supported',
            id="built-in-in-lite",
        ),
        pytest.param(
            [{**LITE_TOOLS, "tools": [WEATHER, WEATHER]}, USER],
            "input[0].tools[1].name",
            'duplicate tool name "get_weather"',
            id="duplicate-in-lite",
        ),
        pytest.param(
            [{"type": "additional_tools", "role": "developer"}, USER],
            "input[0].tools",
            "Missing data",
            id="lite-without-tools",
        ),
        pytest.param([USER, SEARCH_CALL], "input[1]", 'tool call "search-1" has no output', id="search-unanswered"),
        pytest.param([USER, SEARCH_OUTPUT], "input[1].call_id", "no function_call", id="search-output-alone"),
        pytest.param(
            [USER, {**SEARCH_CALL, "call_id": ""}], "input[1].call_id", "Shorter than minimum", id="no-call-id"
        ),
        pytest.param([USER, {**SEARCH_CALL, "arguments": "q"}], "input[1].arguments", "Not a valid", id="arguments"),
    ],
)
def test_refused_tool_search_and_lite_items(items: list[dict[str, Any]], param: str, fragment: str) -> None:
    message, got = refused({"input": items, "tools": [TOOL_SEARCH]})
    assert got == param and fragment in message, message
