"""The OpenAI Responses request, as marshmallow schemas (docs/responses.md, "Request fields",
"Input items", "Tools").

Schemas validate and refuse; they don't translate (``translate/responses_request.py`` does,
from what these load). The same fault is worded as on Chat Completions ("Not a valid
boolean.", ``input[0].content[0]: audio input is not supported``); the refusals the reference
words (background, conversation, prompt, include, unknown item and tool types, built-in
tools) carry its exact messages. Fields the translator doesn't read are
excluded from the result (``unknown = EXCLUDE``); what the response echoes and what is stored
come from the body as the client sent it. What depends on the model (images, PDFs, tools,
efforts, the output limit) or on the whole conversation (tool calls and their outputs, the
user message) is judged by the translator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from marshmallow import ValidationError, validate, validates_schema
from marshmallow.fields import List, Nested, Raw

from ezat_compat.translate.item_references import is_reference
from ezat_compat.translate.responses_request import TEXT_PARTS
from ezat_compat.translate.responses_tools import WEB_SEARCH_TYPES
from ezat_compat.translate.tables import REASONING_EFFORTS
from ezat_compat.wire.fields import (
    MISSING,
    JSONObject,
    Loose,
    StrictBool,
    StrictInt,
    StrictNumber,
    StrictStr,
    StrOrList,
    Tagged,
    refuse,
)
from ezat_compat.wire.loading import ByKeys, load_request
from ezat_compat.wire.openai import (
    AUDIO_PART_MESSAGE,
    JSON_OBJECT_MESSAGE,
    LOGPROBS_MESSAGE,
    MODEL_NAME_MAX,
    REASONING_MESSAGE,
    TEMPERATURE_MAX,
    TOP_P_MAX,
)

# The reference's refusal messages (docs/responses.md), one place.
BACKGROUND_MESSAGE = "background responses are not supported; send the request and wait for it"
CONVERSATION_MESSAGE = "conversations are not supported; use previous_response_id"
PROMPT_MESSAGE = "prompt templates are not supported; send instructions and input"
INCLUDE_ALLOWED = ("reasoning.encrypted_content",)
# Include values that only ask for more detail on items we never produce (built-in tool calls,
# echoed input images): they can't change the answer, so they are accepted and ignored. Clients
# add them beside tools we tolerate (the AI SDK's webSearch() always sends the first).
INCLUDE_IGNORED = (
    "web_search_call.action.sources",
    "web_search_call.results",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
)
INCLUDE_MESSAGE = "{value} is not supported"
UNKNOWN_ITEM_MESSAGE = "unsupported input item type {tag}"
UNKNOWN_TOOL_MESSAGE = "unsupported tool type {tag}; use function or custom tools"
BUILT_IN_TOOL_MESSAGE = 'the built-in tool "{tag}" is not supported'
TOOL_SEARCH_EXECUTION_MESSAGE = 'the built-in tool "tool_search" is supported only with "execution": "client"'
NAMESPACE_MEMBER_MESSAGE = "must be function or custom"
SUMMARY_MESSAGE = "use one of auto, concise, detailed"
FILE_ID_MESSAGE = "file ids are not supported; send the file's data"
IMAGE_FILE_ID_MESSAGE = FILE_ID_MESSAGE + " (image_url: a data URL or an http(s) URL)"
PDF_FILE_ID_MESSAGE = FILE_ID_MESSAGE + " (file_data: data:application/pdf;base64,…)"

ROLES = ("user", "assistant", "system", "developer")
# Built-in tools with no Anthropic equivalent: refused naming tools[N].type.
REFUSED_TOOL_TYPES = (
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "computer_use",
    "computer",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
)
SUMMARIES = ("auto", "concise", "detailed")


# ---------------------------------------------------------------- content parts


class TextPartSchema(Loose):
    text = StrictStr(required=True)


class RefusalPartSchema(Loose):
    """An earlier refusal: left out of the request."""


class ImagePartSchema(Loose):
    image_url = StrictStr(allow_none=True)
    file_id = Raw(allow_none=True)

    @validates_schema
    def _image_data(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("image_url") is None:
            if data.get("file_id") is not None:
                raise ValidationError([IMAGE_FILE_ID_MESSAGE], field_name="file_id")
            raise ValidationError([MISSING], field_name="image_url")


class FilePartSchema(Loose):
    file_data = StrictStr(allow_none=True)
    file_id = Raw(allow_none=True)
    file_url = StrictStr(allow_none=True)
    filename = StrictStr(allow_none=True)

    @validates_schema
    def _pdf_data(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("file_data") is None and data.get("file_url") is None:
            if data.get("file_id") is not None:
                raise ValidationError([PDF_FILE_ID_MESSAGE], field_name="file_id")
            raise ValidationError([MISSING], field_name="file_data")


TEXT_PART = TextPartSchema()
PART = Tagged(
    "type",
    {
        **dict.fromkeys(TEXT_PARTS, TEXT_PART),
        "refusal": RefusalPartSchema(),
        "input_image": ImagePartSchema(),
        "input_file": FilePartSchema(),
    },
    refused={"input_audio": AUDIO_PART_MESSAGE},
)


# ---------------------------------------------------------------- tools


class FunctionToolSchema(Loose):
    name = StrictStr(required=True)
    description = StrictStr(allow_none=True)
    parameters = JSONObject(allow_none=True)
    strict = Raw(allow_none=True)  # only ``true`` asks for a strict schema


class CustomToolSchema(Loose):
    name = StrictStr(required=True)
    description = StrictStr(allow_none=True)
    format = Raw(allow_none=True)  # a grammar is given to the model in the description


FUNCTION_TOOL = FunctionToolSchema()
CUSTOM_TOOL = CustomToolSchema()
NAMESPACE_MEMBER = Tagged("type", {"function": FUNCTION_TOOL, "custom": CUSTOM_TOOL}, unknown=NAMESPACE_MEMBER_MESSAGE)


class NamespaceToolSchema(Loose):
    name = StrictStr(required=True)
    tools = List(NAMESPACE_MEMBER, required=True)


class WebSearchToolSchema(Loose):
    filters = Raw(allow_none=True)  # allowed_domains kept when it is a list of strings
    user_location = Raw(allow_none=True)  # its string fields kept


class ToolSearchToolSchema(Loose):
    """Codex's tool search (openai/codex codex-rs/tools/src/tool_spec.rs, ``ToolSpec::ToolSearch``):
    only the client-run kind, which the model calls like a function."""

    execution = StrictStr(allow_none=True)  # unset: the hosted search, which we can't run
    description = StrictStr(allow_none=True)
    parameters = JSONObject(allow_none=True)

    @validates_schema
    def _client_run(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("execution") != "client":
            raise ValidationError([TOOL_SEARCH_EXECUTION_MESSAGE], field_name="execution")


TOOL = Tagged(
    "type",
    {
        "function": FUNCTION_TOOL,
        "custom": CUSTOM_TOOL,
        "namespace": NamespaceToolSchema(),
        "tool_search": ToolSearchToolSchema(),
        **dict.fromkeys(WEB_SEARCH_TYPES, WebSearchToolSchema()),
    },
    refused={kind: ("type", BUILT_IN_TOOL_MESSAGE.format(tag=kind)) for kind in REFUSED_TOOL_TYPES},
    unknown=UNKNOWN_TOOL_MESSAGE,
)


# ---------------------------------------------------------------- input items


class MessageItemSchema(Loose):
    role = StrictStr(required=True, validate=validate.OneOf(ROLES))
    content = StrOrList(PART, required=True)


class FunctionCallItemSchema(Loose):
    call_id = StrictStr(required=True, validate=validate.Length(min=1))
    name = StrictStr(required=True)
    arguments = StrictStr(allow_none=True)
    namespace = StrictStr(allow_none=True)


class CustomToolCallItemSchema(Loose):
    call_id = StrictStr(required=True, validate=validate.Length(min=1))
    name = StrictStr(required=True)
    input = StrictStr(required=True)
    namespace = StrictStr(allow_none=True)


class CallOutputItemSchema(Loose):
    call_id = StrictStr(required=True)
    output = StrOrList(PART, required=True)


class ReasoningItemSchema(Loose):
    encrypted_content = Raw(allow_none=True)  # opened by the gateway's sealer, which judges it


class ItemReferenceSchema(Loose):
    """An earlier output item by its id: the dialect puts the stored item in its place."""

    id = StrictStr(required=True)


class ToolSearchCallItemSchema(Loose):
    """The model's call of a client-run tool search (openai/codex codex-rs/protocol/src/models.rs,
    ``ResponseItem::ToolSearchCall``)."""

    call_id = StrictStr(required=True, validate=validate.Length(min=1))
    arguments = JSONObject(allow_none=True)


class ToolSearchOutputItemSchema(Loose):
    """The client's answer to it: the tools it found (``ResponseItem::ToolSearchOutput``), which
    join the request's tools."""

    call_id = StrictStr(required=True, validate=validate.Length(min=1))
    tools = List(TOOL, required=True)


class AdditionalToolsItemSchema(Loose):
    """Codex's Responses-lite tools (``ResponseItem::AdditionalTools``): tools of the request,
    sent in ``input``."""

    tools = List(TOOL, required=True)


class WebSearchCallItemSchema(Loose):
    """A finished server-side search: left out of the request."""


def untyped_item_kind(item: Mapping[str, Any]) -> str:
    """An input item without ``type``: a reference to an item by its ``id`` alone (the API
    reference's ``ItemReference``: ``type`` "item_reference" or null), else a message."""
    return "item_reference" if is_reference(item) else "message"


CALL_OUTPUT_ITEM = CallOutputItemSchema()
ITEM = Tagged(
    "type",
    {
        "message": MessageItemSchema(),
        "function_call": FunctionCallItemSchema(),
        "custom_tool_call": CustomToolCallItemSchema(),
        "function_call_output": CALL_OUTPUT_ITEM,
        "custom_tool_call_output": CALL_OUTPUT_ITEM,
        "reasoning": ReasoningItemSchema(),
        "web_search_call": WebSearchCallItemSchema(),
        "item_reference": ItemReferenceSchema(),
        "tool_search_call": ToolSearchCallItemSchema(),
        "tool_search_output": ToolSearchOutputItemSchema(),
        "additional_tools": AdditionalToolsItemSchema(),
    },
    default=untyped_item_kind,
    unknown=UNKNOWN_ITEM_MESSAGE,
)


# ---------------------------------------------------------------- reasoning and output format


class ReasoningSchema(Loose):
    effort = StrictStr(validate=validate.OneOf(REASONING_EFFORTS, error=REASONING_MESSAGE), allow_none=True)
    summary = StrictStr(validate=validate.OneOf(SUMMARIES, error=SUMMARY_MESSAGE), allow_none=True)
    generate_summary = Raw(allow_none=True)  # the older name: judged only without ``summary``

    @validates_schema
    def _generate_summary(self, data: dict[str, Any], **_: Any) -> None:
        if "summary" not in data and data.get("generate_summary") not in (None, *SUMMARIES):
            raise ValidationError([SUMMARY_MESSAGE], field_name="generate_summary")


class TextFormatSchema(Loose):
    """``{"type": "text"}``: nothing more to load."""


class JSONSchemaFormatSchema(Loose):
    schema = JSONObject(required=True)


FORMAT = Tagged(
    "type",
    {"text": TextFormatSchema(), "json_schema": JSONSchemaFormatSchema()},
    refused={"json_object": ("type", JSON_OBJECT_MESSAGE)},
    allow_none=True,
)


class TextSchema(Loose):
    format = FORMAT


# ---------------------------------------------------------------- the request


def _include_value(value: Any) -> None:
    if value not in INCLUDE_ALLOWED and value not in INCLUDE_IGNORED:
        raise ValidationError(INCLUDE_MESSAGE.format(value=json.dumps(value)))


class ResponsesRequestSchema(Loose):
    model = StrictStr(required=True, validate=validate.Length(min=1, max=MODEL_NAME_MAX))
    input = StrOrList(ITEM, allow_none=True)
    instructions = StrictStr(allow_none=True)
    tools = List(TOOL, allow_none=True)
    tool_choice = Raw(allow_none=True)  # checked against the tools by the translator
    parallel_tool_calls = StrictBool(allow_none=True)
    reasoning = Nested(ReasoningSchema, allow_none=True)
    text = Nested(TextSchema, allow_none=True)
    max_output_tokens = StrictInt(validate=validate.Range(min=1), allow_none=True)
    temperature = StrictNumber(validate=validate.Range(min=0, max=TEMPERATURE_MAX), allow_none=True)
    top_p = StrictNumber(validate=validate.Range(min=0, max=TOP_P_MAX), allow_none=True)
    stream = StrictBool(allow_none=True)
    store = StrictBool(allow_none=True)
    previous_response_id = StrictStr(validate=validate.Length(min=1), allow_none=True)
    include = List(Raw(validate=_include_value), allow_none=True)
    prompt_cache_key = Raw(allow_none=True)  # routing affinity when a non-empty string
    background = Raw(allow_none=True, validate=refuse(BACKGROUND_MESSAGE, lambda value: value in (False,)))
    conversation = Raw(allow_none=True, validate=refuse(CONVERSATION_MESSAGE))
    prompt = Raw(allow_none=True, validate=refuse(PROMPT_MESSAGE))
    top_logprobs = Raw(allow_none=True, validate=refuse(LOGPROBS_MESSAGE, lambda value: value == 0))


RESPONSES_REQUEST = ByKeys(ResponsesRequestSchema)


def load_responses_request(body: Any) -> dict[str, Any]:
    """Validate a parsed JSON body: the fields the translator reads, checked. Raises
    ``RequestValidationError`` with the first problem."""
    return load_request(RESPONSES_REQUEST, body)
