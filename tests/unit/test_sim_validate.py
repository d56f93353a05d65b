"""The simulator's validator against the real API's rules: one row per ``validate.RULES`` entry.

Each row has a body that breaks the rule, the exact message the real API answers (the rule's
source quotes it), and a near-miss body that the rule lets through.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

import pytest
from werkzeug.test import Client

from ezat_compat.sim.app import make_app
from ezat_compat.sim.errors import InvalidRequestError, SimError
from ezat_compat.sim.events import message_events
from ezat_compat.sim.images import image_size
from ezat_compat.sim.markers import parse_markers
from ezat_compat.sim.replies import build_reply
from ezat_compat.sim.request import last_user_text
from ezat_compat.sim.signing import sign_thinking, verify_thinking
from ezat_compat.sim.validate import RULES, ModelCaps, check_body_size, validate_request

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "input_schema": SCHEMA}
STRICT_SCHEMA = {**SCHEMA, "additionalProperties": False}
THINKING = {"type": "enabled", "budget_tokens": 1024}
SIGNED = {"type": "thinking", "thinking": "Let me look.", "signature": sign_thinking("Let me look.")}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "9°C"}
CC_5M = {"type": "ephemeral"}
CC_1H = {"type": "ephemeral", "ttl": "1h"}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, padding: int = 0, *, pixels: bytes | None = None) -> bytes:
    """A black RGB PNG that decodes (``pixels``: the IDAT's bytes instead), then ``padding`` zero bytes."""
    ihdr = struct.pack(">II5B", width, height, 8, 2, 0, 0, 0)
    idat = pixels if pixels is not None else zlib.compress(b"\0" * ((width * 3 + 1) * height), 9)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"") + b"\0" * padding


def image(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": encoded}}


def pdf(data: bytes) -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": encoded}}


JPEG_MAGIC = b"\xff\xd8\xff\xe0" + b"\0" * 16
RANDOM_IDAT = bytes((i * 7919 + 13) % 251 for i in range(3000))


def body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 2048, "messages": list(messages or [user("hi")]), **fields}


def user(*content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content[0] if len(content) == 1 and isinstance(content[0], str) else [*content]}


def assistant(*content: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content[0] if len(content) == 1 and isinstance(content[0], str) else [*content],
    }


def system_message(*content: Any) -> dict[str, Any]:
    """A mid-conversation ``role: "system"`` message."""
    return {
        "role": "system",
        "content": content[0] if len(content) == 1 and isinstance(content[0], str) else [*content],
    }


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def tool_loop(*assistant_blocks: Any, **fields: Any) -> dict[str, Any]:
    return body(user("weather?"), assistant(*assistant_blocks), user(TOOL_RESULT), tools=[WEATHER], **fields)


def output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "schema": schema}}


# 6 MiB of base64 text: a 4.5 MiB file, over the 5 MB limit measured on the base64 string.
BIG_IMAGE = image(png(100, 100, padding=4718592 - len(png(100, 100))))
JUST_UNDER_5MB = image(png(100, 100, padding=3932160 - len(png(100, 100))))

THINKING_FIRST = (
    "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`. When `thinking` "
    "is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of "
    "`tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid "
    "this requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)

# (rule name, body that breaks it, exact message, body the rule lets through, capabilities)
CASES: list[tuple[str, dict[str, Any], str, dict[str, Any], ModelCaps]] = [
    (
        "max_tokens_output_limit",
        body(max_tokens=64001),
        "max_tokens: 64001 > 64000, which is the maximum allowed number of output tokens for claude-test",
        body(max_tokens=64000),
        ModelCaps(max_output_tokens=64000),
    ),
    (
        "tool_use_id_pattern",
        body(user("hi"), assistant({**TOOL_USE, "id": "call.1"}), user({**TOOL_RESULT, "tool_use_id": "call.1"})),
        "messages.1.content.0.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'",
        body(user("hi"), assistant({**TOOL_USE, "id": "call_1-A"}), user({**TOOL_RESULT, "tool_use_id": "call_1-A"})),
        ModelCaps(),
    ),
    (
        "tool_result_id_pattern",
        body(user({**TOOL_RESULT, "tool_use_id": "a b"})),
        "messages.0.content.0.tool_result.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'",
        tool_loop(TOOL_USE),
        ModelCaps(),
    ),
    (
        "tool_name_pattern",
        body(tools=[{**WEATHER, "name": "weather.get"}]),
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
        body(tools=[{**WEATHER, "name": "w" * 128}]),
        ModelCaps(),
    ),
    (
        "tool_names_unique",
        body(tools=[WEATHER, WEATHER]),
        "tools: Tool names must be unique.",
        body(tools=[WEATHER, {**WEATHER, "name": "get_time"}]),
        ModelCaps(),
    ),
    (
        "input_schema_type",
        body(tools=[{**WEATHER, "input_schema": {"properties": {}}}]),
        "tools.0.custom.input_schema.type: Field required",
        body(tools=[{**WEATHER, "input_schema": {"type": "object"}}]),
        ModelCaps(),
    ),
    (
        "input_schema_top_level_union",
        body(tools=[{**WEATHER, "input_schema": {"type": "object", "anyOf": [SCHEMA]}}]),
        "tools.0.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the top level",
        body(tools=[{**WEATHER, "input_schema": {"type": "object", "properties": {"x": {"anyOf": [SCHEMA]}}}}]),
        ModelCaps(),
    ),
    (
        "mid_conversation_system",
        body(user("hi"), assistant("hello"), system_message("Answer in French."), user("ok")),
        "messages.2: a system message must immediately follow a user message (or an assistant message ending in "
        "server tool use) and be the last message or be followed by an assistant message",
        body(user("hi"), system_message("Answer in French."), assistant("bonjour"), user("ok")),
        ModelCaps(),
    ),
    (
        "stop_sequences_non_empty",
        body(stop_sequences=["END", ""]),
        "stop_sequences: each stop sequence must be non-empty",
        body(stop_sequences=["END"]),
        ModelCaps(),
    ),
    (
        "stop_sequences_non_whitespace",
        body(stop_sequences=["\n"]),
        "stop_sequences: each stop sequence must contain non-whitespace",
        body(stop_sequences=["\nHuman:"]),
        ModelCaps(),
    ),
    (
        "text_non_empty",
        body(user(text("hi"), text(""))),
        "messages: text content blocks must be non-empty",
        body(user(text("hi"), text("there"))),
        ModelCaps(),
    ),
    (
        "text_non_whitespace",
        body(user(text("hi"), text(" \n"))),
        "messages: text content blocks must contain non-whitespace text",
        body(user(text("hi"), text(" x "))),
        ModelCaps(),
    ),
    (
        "message_non_empty",
        body(user("hi"), assistant(""), user("again")),
        "messages.1: all messages must have non-empty content except for the optional final assistant message",
        body(user("hi"), assistant("")),
        ModelCaps(),
    ),
    (
        "prefill_supported",
        body(user("hi"), assistant("Sure")),
        "This model does not support assistant message prefill. The conversation must end with a user message.",
        body(user("hi"), assistant("Sure"), user("go on")),
        ModelCaps(prefill=False),
    ),
    (
        "final_assistant_no_trailing_whitespace",
        body(user("hi"), assistant("The answer is ")),
        "messages: final assistant content cannot end with trailing whitespace",
        body(user("hi"), assistant("The answer is"), user("and?")),
        ModelCaps(),
    ),
    (
        "tool_use_answered",
        body(user("weather?"), assistant(TOOL_USE), user("thanks"), tools=[WEATHER]),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1. Each "
        "`tool_use` block must have a corresponding `tool_result` block in the next message.",
        tool_loop(TOOL_USE),
        ModelCaps(),
    ),
    (
        "tool_result_known",
        body(user(TOOL_RESULT)),
        "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1. Each `tool_result` "
        "block must have a corresponding `tool_use` block in the previous message.",
        tool_loop(TOOL_USE),
        ModelCaps(),
    ),
    (
        "thinking_starts_final_assistant",
        tool_loop(TOOL_USE, thinking=THINKING),
        THINKING_FIRST,
        tool_loop(SIGNED, TOOL_USE, thinking=THINKING),
        ModelCaps(),
    ),
    (
        "thinking_signature_valid",
        tool_loop({**SIGNED, "thinking": "Let me look again."}, TOOL_USE, thinking=THINKING),
        "messages.1.content.0: Invalid `signature` in `thinking` block",
        tool_loop(SIGNED, TOOL_USE),
        ModelCaps(),
    ),
    (
        "thinking_forced_tool",
        body(tools=[WEATHER], tool_choice={"type": "any"}, thinking=THINKING),
        "Thinking may not be enabled when tool_choice forces tool use.",
        body(tools=[WEATHER], tool_choice={"type": "auto"}, thinking=THINKING),
        ModelCaps(),
    ),
    (
        "thinking_temperature",
        body(thinking=THINKING, temperature=0.2),
        "`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at "
        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        "#important-considerations-when-using-extended-thinking",
        body(thinking=THINKING, temperature=1),
        ModelCaps(),
    ),
    (
        "temperature_with_top_p",
        body(temperature=0.5, top_p=0.9),
        "`temperature` and `top_p` cannot both be specified for this model. Please use only one.",
        body(temperature=0.5),
        ModelCaps(),
    ),
    (
        "effort_offered",
        body(output_config={"effort": "xhigh"}),
        "output_config.effort: Input should be 'low', 'medium' or 'high'",
        body(output_config={"effort": "high"}),
        ModelCaps(efforts=("low", "medium", "high")),
    ),
    (
        "cache_breakpoints_max",
        body(user(*(text(str(k), cache_control=CC_5M) for k in range(5)))),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        body(user(*(text(str(k), cache_control=CC_5M) for k in range(4)))),
        ModelCaps(),
    ),
    (
        "cache_ttl_order",
        body(user(text("a", cache_control=CC_1H)), system=[text("s", cache_control=CC_5M)]),
        "messages.0.content.0.text.cache_control.ttl: a ttl='1h' cache_control block must not come after a "
        "ttl='5m' cache_control block. Note that blocks are processed in the following order: `tools`, `system`, "
        "`messages`.",
        body(user(text("a", cache_control=CC_5M)), system=[text("s", cache_control=CC_1H)]),
        ModelCaps(),
    ),
    (
        "image_bytes",
        body(user(BIG_IMAGE)),
        "messages.0.content.0.image.source.base64: image exceeds 5 MB maximum: 6291456 bytes > 5242880 bytes",
        body(user(JUST_UNDER_5MB)),
        ModelCaps(),
    ),
    (
        "image_side",
        body(user(text("look"), image(png(9000, 4)))),
        "messages.0.content.1.image.source.base64.data: At least one of the image dimensions exceed max allowed "
        "size: 8000 pixels",
        body(user(text("look"), image(png(8000, 4)))),
        ModelCaps(),
    ),
    (
        "many_images_side",
        body(user(*(image(png(2100, 10)) for _ in range(21)))),
        "messages.0.content.0.image.source.base64.data: At least one of the image dimensions exceed max allowed "
        "size for many-image requests: 2000 pixels",
        body(user(*(image(png(2100, 10)) for _ in range(20)))),
        ModelCaps(),
    ),
    (
        "media_count",
        body(user(*(image(png(4, 4)) for _ in range(101)))),
        "too many images and documents: 101 + 0 > 100",
        body(user(*(image(png(4, 4)) for _ in range(100)))),
        ModelCaps(),
    ),
    (
        "image_media_type",
        body(
            user("weather?"),
            assistant(TOOL_USE),
            user({**TOOL_RESULT, "content": [text("radar"), image(JPEG_MAGIC)]}),
            tools=[WEATHER],
        ),
        "messages.2.content.0.tool_result.content.1.image.source.base64: The image was specified using the "
        "image/png media type, but the image appears to be a image/jpeg image",
        body(user(text("look"), image(png(4, 4)))),
        ModelCaps(),
    ),
    (
        "image_decodes",
        body(user(text("look"), image(png(64, 64, pixels=RANDOM_IDAT)))),
        "Could not process image",
        body(user(text("look"), image(png(64, 64)))),
        ModelCaps(),
    ),
    (
        "pdf_valid",
        body(user(text("read"), pdf(b"<html>not a pdf</html>"))),
        "messages.0.content.1.pdf.source.base64.data: The PDF specified was not valid.",
        body(user(text("read"), pdf(b"%PDF-1.4\n%%EOF\n"))),
        ModelCaps(),
    ),
    (
        "schema_additional_properties",
        body(output_config=output_schema({**STRICT_SCHEMA, "properties": {"a": {"type": "object"}}})),
        "output_config.format.schema: For 'object' type, 'additionalProperties' must be explicitly set to false",
        body(output_config=output_schema(STRICT_SCHEMA)),
        ModelCaps(),
    ),
    (
        "schema_min_items",
        body(
            tools=[
                {
                    **WEATHER,
                    "strict": True,
                    "input_schema": {
                        **STRICT_SCHEMA,
                        "properties": {"days": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
                    },
                }
            ]
        ),
        "tools.0.custom: For 'array' type, 'minItems' values other than 0 or 1 are not supported",
        body(
            tools=[
                {
                    **WEATHER,
                    "input_schema": {
                        **STRICT_SCHEMA,
                        "properties": {"days": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
                    },
                }
            ]
        ),
        ModelCaps(),
    ),
    (
        "schema_unsupported_keywords",
        body(
            output_config=output_schema(
                {**STRICT_SCHEMA, "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}}
            )
        ),
        "output_config.format.schema: For 'integer' type, properties maximum, minimum are not supported",
        body(
            output_config=output_schema({**STRICT_SCHEMA, "properties": {"age": {"type": "integer", "enum": [1, 2]}}})
        ),
        ModelCaps(),
    ),
]


def test_every_rule_has_a_row_and_a_source() -> None:
    assert sorted(name for name, *_ in CASES) == sorted(rule.name for rule in RULES)
    for rule in RULES:
        assert rule.source.startswith("https://"), rule.name


@pytest.mark.parametrize(("broken", "message", "caps"), [pytest.param(b, m, c, id=n) for n, b, m, _, c in CASES])
def test_rule_refuses_with_the_real_text(broken: dict[str, Any], message: str, caps: ModelCaps) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(broken, caps=caps)
    assert (caught.value.status, caught.value.error_type) == (400, "invalid_request_error")
    assert caught.value.message == message


@pytest.mark.parametrize(("fine", "caps"), [pytest.param(f, c, id=n) for n, _, _, f, c in CASES])
def test_near_miss_passes(fine: dict[str, Any], caps: ModelCaps) -> None:
    validate_request(fine, caps=caps)


@pytest.mark.parametrize(
    ("max_tokens", "limit"),
    [
        pytest.param(128_001, 128_000, id="default-limit"),
        pytest.param(2**63 - 1, 128_000, id="int64-max"),
        pytest.param(2**64, 128_000, id="past-int64"),
        pytest.param(10**40, 64_000, id="40-digits"),
    ],
)
def test_max_tokens_above_the_output_limit_is_refused(max_tokens: int, limit: int) -> None:
    caps = ModelCaps(max_output_tokens=limit)
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(body(max_tokens=max_tokens), caps=caps)
    assert caught.value.message == (
        f"max_tokens: {max_tokens} > {limit}, which is the maximum allowed number of output tokens for claude-test"
    )
    validate_request(body(max_tokens=limit), caps=caps)


def test_older_models_take_temperature_with_top_p() -> None:
    validate_request(body(temperature=0.5, top_p=0.9), caps=ModelCaps(temperature_with_top_p=True))


def test_schema_unsupported_single_keyword_wording() -> None:
    schema = {**STRICT_SCHEMA, "properties": {"tags": {"type": "array", "items": {}, "uniqueItems": True}}}
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(body(output_config=output_schema(schema)))
    assert (
        caught.value.message == "output_config.format.schema: For 'array' type, property 'uniqueItems' is not supported"
    )


def test_body_over_32_mb_is_413_request_too_large() -> None:
    check_body_size(32 * 1024 * 1024)
    with pytest.raises(SimError) as caught:
        check_body_size(32 * 1024 * 1024 + 1)
    assert (caught.value.status, caught.value.error_type) == (413, "request_too_large")


CLAUDE_CODE_LIKE = body(
    user(text("list the files", cache_control=CC_5M)),
    system=[text("You are Claude Code.", cache_control=CC_5M), text("Be brief.")],
    tools=[
        {**WEATHER, "name": "Bash", "description": "run", "cache_control": CC_5M},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    metadata={"user_id": "user_abc_account_x_session_y"},
    thinking={"type": "adaptive"},
    context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    output_config={"effort": "high"},
    stream=True,
)


def test_what_claude_code_sends_is_accepted() -> None:
    validate_request(CLAUDE_CODE_LIKE)


@pytest.mark.parametrize(
    ("data", "size"),
    [
        pytest.param(png(640, 480), (640, 480), id="png"),
        pytest.param(b"GIF89a" + struct.pack("<HH", 320, 200) + b"\0" * 4, (320, 200), id="gif"),
        pytest.param(
            b"\xff\xd8\xff\xe0"
            + struct.pack(">H", 16)
            + b"JFIF\0"
            + b"\0" * 9
            + b"\xff\xc0"
            + struct.pack(">HBHH", 17, 8, 600, 800)
            + b"\0" * 12,
            (800, 600),
            id="jpeg",
        ),
        pytest.param(
            b"RIFF" + b"\0" * 4 + b"WEBPVP8X" + b"\0" * 8 + (1023).to_bytes(3, "little") + (767).to_bytes(3, "little"),
            (1024, 768),
            id="webp-vp8x",
        ),
        pytest.param(b"not an image", None, id="unknown"),
        pytest.param(b"\x89PNG\r\n\x1a\n", None, id="cut-png"),
    ],
)
def test_image_size_from_headers(data: bytes, size: tuple[int, int] | None) -> None:
    assert image_size(data) == size


def test_signatures_verify_only_the_signed_text() -> None:
    signature = sign_thinking("a thought")
    assert verify_thinking("a thought", signature)
    assert not verify_thinking("a thought.", signature)
    assert not verify_thinking("a thought", "EqQBCkYIBRgCIkA")


# hmac.compare_digest refuses non-ASCII strings (TypeError): a 500 of the simulator's own.
FOREIGN_SIGNATURES = [
    ("latin-1", SIGNED["thinking"], "simsig1_é"),
    ("cjk", SIGNED["thinking"], "签名"),
    ("emoji", SIGNED["thinking"], sign_thinking(SIGNED["thinking"])[:-1] + "🙂"),
    ("lone-surrogate", SIGNED["thinking"], "EqQB\ud800"),
    ("surrogate-in-the-thought-too", "Let me \udc00look.", "\udc00"),
]


@pytest.mark.parametrize(
    ("thought", "signature"), [r[1:] for r in FOREIGN_SIGNATURES], ids=[r[0] for r in FOREIGN_SIGNATURES]
)
def test_a_signature_of_any_characters_is_invalid_not_an_error(thought: str, signature: str) -> None:
    assert not verify_thinking(thought, signature)
    block = {"type": "thinking", "thinking": thought, "signature": signature}
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(tool_loop(block, TOOL_USE, thinking=THINKING))
    assert (caught.value.status, caught.value.message) == (
        400,
        "messages.1.content.0: Invalid `signature` in `thinking` block",
    )


@pytest.mark.parametrize(
    ("thought", "signature"), [r[1:] for r in FOREIGN_SIGNATURES], ids=[r[0] for r in FOREIGN_SIGNATURES]
)
def test_the_simulator_answers_a_foreign_signature_with_the_apis_400(thought: str, signature: str) -> None:
    block = {"type": "thinking", "thinking": thought, "signature": signature}
    request = {"model": "claude-sim", "max_tokens": 64, **tool_loop(block, TOOL_USE, thinking=THINKING)}
    raw = json.dumps(request).encode()  # ensure_ascii: a lone surrogate travels as its \u escape
    answer = Client(make_app()).post(
        "/v1/messages", data=raw, headers={"x-api-key": "k", "content-type": "application/json"}
    )
    assert answer.status_code == 400, answer.get_data(as_text=True)
    assert answer.get_json()["error"] == {
        "type": "invalid_request_error",
        "message": "messages.1.content.0: Invalid `signature` in `thinking` block",
    }


def test_a_non_ascii_thought_signs_and_verifies() -> None:
    assert verify_thinking("Überlegung 🙂", sign_thinking("Überlegung 🙂"))


def test_emitted_thinking_verifies_when_sent_back() -> None:
    first = body(user("weather? [[sim:tool=get_weather]]"), tools=[WEATHER], thinking=THINKING)
    reply = build_reply(first, "weather?", parse_markers(last_user_text(first))[1])
    assert [b["type"] for b in reply.content] == ["thinking", "tool_use"]
    tool_id = reply.content[1]["id"]
    second = body(
        *first["messages"],
        assistant(*reply.content),
        user({**TOOL_RESULT, "tool_use_id": tool_id}),
        tools=[WEATHER],
        thinking=THINKING,
    )
    validate_request(second)


def test_tool_marker_calls_that_tool_with_those_args() -> None:
    request = body(
        user('go [[sim:tool=get_time,args={"tz": "UTC", "n": [1, 2]}]]'),
        tools=[WEATHER, {"name": "get_time", "input_schema": {"type": "object"}}],
    )
    clean, markers = parse_markers(last_user_text(request))
    reply = build_reply(request, clean, markers)
    assert [(b["name"], b["input"]) for b in reply.content] == [("get_time", {"tz": "UTC", "n": [1, 2]})]


def test_a_call_without_arguments_streams_one_empty_partial_json() -> None:
    request = body(user("go [[sim:args={}]]"), tools=[WEATHER])
    clean, markers = parse_markers(last_user_text(request))
    reply = build_reply(request, clean, markers)
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": reply.content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 1,
            "output_tokens_details": {"thinking_tokens": 0},
        },
    }
    events = [data for _, data in message_events(message) if data["type"].startswith("content_block")]
    assert events[0]["content_block"]["input"] == {}
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert deltas == [{"type": "input_json_delta", "partial_json": ""}]


def test_structured_output_after_a_tool_result_is_json_of_the_schema() -> None:
    request = tool_loop(TOOL_USE, output_config=output_schema(STRICT_SCHEMA))
    validate_request(request)
    reply = build_reply(request, "", parse_markers(last_user_text(request))[1])
    assert json.loads(reply.content[0]["text"]) == {"city": "example"}


SERVER_TOOL_USE = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}}
SYSTEM_PLACEMENT = "a system message must immediately follow a user message"


@pytest.mark.parametrize(
    ("messages", "refusal"),
    [
        # Claude Code's own placement: the reminder right after the user's prompt, last.
        ([user("hi"), system_message("Be brief.")], None),
        ([user("hi"), system_message(text("Be brief.")), assistant("ok"), user("more")], None),
        ([user("hi"), assistant(SERVER_TOOL_USE), system_message("Cite sources.")], None),
        ([system_message("Be brief."), user("hi")], "messages.0: " + SYSTEM_PLACEMENT),
        ([user("hi"), assistant("ok"), system_message("Be brief.")], "messages.2: " + SYSTEM_PLACEMENT),
        ([user("hi"), system_message("Be brief."), user("again")], "messages.1: " + SYSTEM_PLACEMENT),
        ([user("hi"), system_message(image(png(4, 4)))], "messages.1.content.0: system messages may only contain"),
        ([user("hi"), system_message("  ")], "messages: text content blocks must contain non-whitespace text"),
        ([user("hi"), {"role": "developer", "content": "x"}], "messages.1.role: Input should be 'user' or 'assistant'"),
    ],
    ids=[
        "last",
        "before-assistant",
        "after-server-tool",
        "first",
        "after-assistant",
        "before-user",
        "image",
        "blank",
        "unknown-role",
    ],
)
def test_mid_conversation_system_messages(messages: list[dict[str, Any]], refusal: str | None) -> None:
    if refusal is None:
        validate_request(body(*messages))
        return
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(body(*messages))
    assert caught.value.message.startswith(refusal)


def test_a_system_message_between_a_tool_call_and_its_result_breaks_the_loop() -> None:
    """The tool_result must be in the message right after the tool_use (the system message isn't a turn, but it
    may not sit there either)."""
    with pytest.raises(InvalidRequestError):
        validate_request(body(user("hi"), assistant(TOOL_USE), system_message("x"), user(TOOL_RESULT), tools=[WEATHER]))
    validate_request(body(user("hi"), assistant(TOOL_USE), user(TOOL_RESULT), system_message("x"), tools=[WEATHER]))
