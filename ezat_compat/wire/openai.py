"""The Chat Completions request, as marshmallow schemas (Chat Completions reference and
API reference, "Request Body").

Schemas validate and refuse; they don't translate. Fields the spec ignores are excluded
(``unknown = EXCLUDE``) and so never reach the upstream. Refused fields carry the spec's
exact messages; the flattener in ``wire.paths`` turns them into ``path: message``. A body is
loaded through the schema restricted to the fields it holds (``wire.loading.ByKeys``).
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate, validates_schema
from marshmallow.fields import Dict, List, Nested, Raw

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
    refused_when_sent,
)
from ezat_compat.wire.loading import ByKeys, load_request

# The spec's refusal messages ("Ignored and refused fields"), one place.
N_MESSAGE = "only 1 choice per request is supported"
LOGPROBS_MESSAGE = "log probabilities are not available"
LOGIT_BIAS_MESSAGE = "is not supported"
MODALITIES_MESSAGE = "only text output is supported"
WEB_SEARCH_MESSAGE = "is not supported"
FUNCTIONS_MESSAGE = "the legacy functions API is not supported; use tools"
JSON_OBJECT_MESSAGE = (
    'type "json_object" is not supported; use "json_schema" with a schema (objects need "additionalProperties": false)'
)
TOOL_TYPE_MESSAGE = "only function tools are supported"
REASONING_MESSAGE = "use one of " + ", ".join(REASONING_EFFORTS)
AUDIO_PART_MESSAGE = "audio input is not supported"
FILE_ID_MESSAGE = "send the PDF as file_data (a base64 data URL); file_id is not supported"
FUNCTION_ROLE_MESSAGE = 'the legacy "function" role is not supported; use tools'
NO_USER_MESSAGE = "must contain at least one user message"
MODEL_NAME_MAX = 128  # characters of ``model``
TEMPERATURE_MAX = 2
TOP_P_MAX = 1


class CacheControlSchema(Loose):
    type = StrictStr(required=True, validate=validate.Equal("ephemeral", error='Must be "ephemeral".'))
    ttl = StrictStr(validate=validate.OneOf(["5m", "1h"]))


def _cache_control() -> fields.Field:
    return Nested(CacheControlSchema, allow_none=True)


# ---------------------------------------------------------------- content parts


class TextPartSchema(Loose):
    text = StrictStr(required=True)
    cache_control = _cache_control()


class RefusalPartSchema(Loose):
    refusal = StrictStr(allow_none=True)


class ImageURLSchema(Loose):
    url = StrictStr(required=True, validate=validate.Length(min=1))
    detail = Raw(allow_none=True)  # ignored, per the spec


class ImagePartSchema(Loose):
    image_url = Nested(ImageURLSchema, required=True)
    cache_control = _cache_control()


class FileSchema(Loose):
    file_data = StrictStr(allow_none=True)
    file_id = StrictStr(allow_none=True)
    filename = StrictStr(allow_none=True)

    @validates_schema
    def _pdf_data(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("file_id") is not None:
            raise ValidationError(FILE_ID_MESSAGE)
        if not data.get("file_data"):
            raise ValidationError([MISSING], field_name="file_data")


class FilePartSchema(Loose):
    file = Nested(FileSchema, required=True)
    cache_control = _cache_control()


TEXT_PART = TextPartSchema()
_AUDIO_REFUSED = {"input_audio": AUDIO_PART_MESSAGE}
USER_PART = Tagged(
    "type", {"text": TEXT_PART, "image_url": ImagePartSchema(), "file": FilePartSchema()}, refused=_AUDIO_REFUSED
)
ASSISTANT_PART = Tagged("type", {"text": TEXT_PART, "refusal": RefusalPartSchema()}, refused=_AUDIO_REFUSED)
TEXT_ONLY_PART = Tagged("type", {"text": TEXT_PART}, refused=_AUDIO_REFUSED)


# ---------------------------------------------------------------- messages


class FunctionCallSchema(Loose):
    name = StrictStr(required=True)
    arguments = StrictStr(allow_none=True)


class ToolCallSchema(Loose):
    id = StrictStr(required=True, validate=validate.Length(min=1))
    type = StrictStr(
        validate=validate.Equal("function", error="only function tool calls are supported"), allow_none=True
    )
    function = Nested(FunctionCallSchema, required=True)


class SystemMessageSchema(Loose):
    content = StrOrList(TEXT_ONLY_PART, required=True)


class UserMessageSchema(Loose):
    content = StrOrList(USER_PART, required=True)


class AssistantMessageSchema(Loose):
    content = StrOrList(ASSISTANT_PART, allow_none=True)
    tool_calls = List(Nested(ToolCallSchema), allow_none=True)
    function_call = Raw(allow_none=True)

    @validates_schema
    def _no_legacy_call(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("function_call") is not None:
            raise ValidationError([FUNCTIONS_MESSAGE], field_name="function_call")


class ToolMessageSchema(Loose):
    tool_call_id = StrictStr(required=True)
    content = StrOrList(TEXT_ONLY_PART, required=True)


MESSAGE = Tagged(
    "role",
    {
        "system": SystemMessageSchema(),
        "developer": SystemMessageSchema(),
        "user": UserMessageSchema(),
        "assistant": AssistantMessageSchema(),
        "tool": ToolMessageSchema(),
    },
    refused={"function": ("role", FUNCTION_ROLE_MESSAGE)},
)


# ---------------------------------------------------------------- tools and formats


class FunctionSchema(Loose):
    name = StrictStr(required=True)
    description = StrictStr(allow_none=True)
    parameters = JSONObject(allow_none=True)
    strict = StrictBool(allow_none=True)


class ToolSchema(Loose):
    type = StrictStr(required=True, validate=validate.Equal("function", error=TOOL_TYPE_MESSAGE))
    function = Nested(FunctionSchema, required=True)
    cache_control = _cache_control()


class JSONSchemaFormatSchema(Loose):
    name = StrictStr(allow_none=True)
    description = StrictStr(allow_none=True)
    schema = JSONObject(required=True)
    strict = StrictBool(allow_none=True)


class TextFormatSchema(Loose):
    """``{"type": "text"}``: nothing more to load."""


class JSONSchemaResponseFormatSchema(Loose):
    json_schema = Nested(JSONSchemaFormatSchema, required=True)


RESPONSE_FORMAT = Tagged(
    "type",
    {"text": TextFormatSchema(), "json_schema": JSONSchemaResponseFormatSchema()},
    refused={"json_object": JSON_OBJECT_MESSAGE},
    allow_none=True,
)


class StreamOptionsSchema(Loose):
    include_usage = StrictBool(allow_none=True)


# ---------------------------------------------------------------- the request


class ChatCompletionRequestSchema(Loose):
    model = StrictStr(required=True, validate=validate.Length(min=1, max=MODEL_NAME_MAX))
    messages = List(MESSAGE, required=True, validate=refuse(NO_USER_MESSAGE, bool))
    stream = StrictBool(allow_none=True)
    stream_options = Nested(StreamOptionsSchema, allow_none=True)
    max_completion_tokens = StrictInt(validate=validate.Range(min=1), allow_none=True)
    max_tokens = StrictInt(validate=validate.Range(min=1), allow_none=True)
    temperature = StrictNumber(validate=validate.Range(min=0, max=TEMPERATURE_MAX), allow_none=True)
    top_p = StrictNumber(validate=validate.Range(min=0, max=TOP_P_MAX), allow_none=True)
    stop = StrOrList(StrictStr(), allow_none=True)
    tools = List(Nested(ToolSchema), allow_none=True)
    tool_choice = Raw(allow_none=True)  # checked by the translator: ignored without tools
    parallel_tool_calls = StrictBool(allow_none=True)
    response_format = RESPONSE_FORMAT
    reasoning_effort = StrictStr(validate=validate.OneOf(REASONING_EFFORTS, error=REASONING_MESSAGE), allow_none=True)
    prompt_cache_key = StrictStr(validate=validate.Length(max=256), allow_none=True)
    n = StrictInt(validate=[validate.Range(min=1), refuse(N_MESSAGE, lambda value: value <= 1)], allow_none=True)
    logprobs = StrictBool(validate=refuse(LOGPROBS_MESSAGE, lambda value: not value), allow_none=True)
    top_logprobs = StrictInt(validate=refuse(LOGPROBS_MESSAGE, lambda value: value == 0), allow_none=True)
    logit_bias = Dict(validate=refuse(LOGIT_BIAS_MESSAGE, lambda value: not value), allow_none=True)
    modalities = List(
        StrictStr(), validate=refuse(MODALITIES_MESSAGE, lambda value: set(value) <= {"text"}), allow_none=True
    )
    audio = Raw(allow_none=True)
    web_search_options = Raw(allow_none=True)
    functions = Raw(allow_none=True)
    function_call = Raw(allow_none=True)

    _refused_objects = refused_when_sent(
        (("audio",), "modalities", MODALITIES_MESSAGE),
        (("web_search_options",), "web_search_options", WEB_SEARCH_MESSAGE),
        (("functions", "function_call"), "functions", FUNCTIONS_MESSAGE),
    )


CHAT_COMPLETION_REQUEST = ByKeys(ChatCompletionRequestSchema)


def load_chat_request(body: Any) -> dict[str, Any]:
    """Validate a parsed JSON body. Raises ``RequestValidationError`` with the first problem."""
    return load_request(CHAT_COMPLETION_REQUEST, body)
