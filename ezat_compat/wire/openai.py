"""The Chat Completions request, as marshmallow schemas (Chat Completions reference and
API reference, "Request Body").

Schemas validate and refuse; they don't translate. Fields the spec ignores are excluded
(``unknown = EXCLUDE``) and so never reach the upstream. Refused fields carry the spec's
exact messages; the flattener in ``wire.paths`` turns them into ``path: message``. A body is
loaded through the schema restricted to the fields it holds (``wire.loading.ByKeys``).
"""

from __future__ import annotations

from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate, validates_schema
from marshmallow.fields import Dict, List, Nested, Raw

from ezat_compat.translate.tables import REASONING_EFFORTS
from ezat_compat.wire.fields import (
    JSONObject,
    StrictBool,
    StrictInt,
    StrictNumber,
    StrictStr,
    StrOrList,
    Tagged,
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


class _Loose(Schema):
    """Unknown keys are ignored, as OpenAI's API ignores them."""

    class Meta:
        unknown = EXCLUDE


def _opt(field: fields.Field) -> fields.Field:
    field.allow_none = True
    return field


class CacheControlSchema(_Loose):
    type = StrictStr(required=True, validate=validate.Equal("ephemeral", error='Must be "ephemeral".'))
    ttl = StrictStr(validate=validate.OneOf(["5m", "1h"]))


def _cache_control() -> fields.Field:
    return Nested(CacheControlSchema, allow_none=True)


# ---------------------------------------------------------------- content parts


class TextPartSchema(_Loose):
    type = StrictStr(required=True)
    text = StrictStr(required=True)
    cache_control = _cache_control()


class RefusalPartSchema(_Loose):
    type = StrictStr(required=True)
    refusal = _opt(StrictStr())


class ImageURLSchema(_Loose):
    url = StrictStr(required=True, validate=validate.Length(min=1))
    detail = Raw(allow_none=True)  # ignored, per the spec


class ImagePartSchema(_Loose):
    type = StrictStr(required=True)
    image_url = Nested(ImageURLSchema, required=True)
    cache_control = _cache_control()


class FileSchema(_Loose):
    file_data = _opt(StrictStr())
    file_id = _opt(StrictStr())
    filename = _opt(StrictStr())

    @validates_schema
    def _pdf_data(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("file_id") is not None:
            raise ValidationError(FILE_ID_MESSAGE)
        if not data.get("file_data"):
            raise ValidationError(["Missing data for required field."], field_name="file_data")


class FilePartSchema(_Loose):
    type = StrictStr(required=True)
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


class FunctionCallSchema(_Loose):
    name = StrictStr(required=True)
    arguments = _opt(StrictStr())


class ToolCallSchema(_Loose):
    id = StrictStr(required=True, validate=validate.Length(min=1))
    type = _opt(StrictStr(validate=validate.Equal("function", error="only function tool calls are supported")))
    function = Nested(FunctionCallSchema, required=True)


class SystemMessageSchema(_Loose):
    role = StrictStr(required=True)
    content = StrOrList(TEXT_ONLY_PART, required=True)


class UserMessageSchema(_Loose):
    role = StrictStr(required=True)
    content = StrOrList(USER_PART, required=True)


class AssistantMessageSchema(_Loose):
    role = StrictStr(required=True)
    content = _opt(StrOrList(ASSISTANT_PART))
    tool_calls = _opt(List(Nested(ToolCallSchema)))
    function_call = Raw(allow_none=True)

    @validates_schema
    def _no_legacy_call(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("function_call") is not None:
            raise ValidationError([FUNCTIONS_MESSAGE], field_name="function_call")


class ToolMessageSchema(_Loose):
    role = StrictStr(required=True)
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


class FunctionSchema(_Loose):
    name = StrictStr(required=True)
    description = _opt(StrictStr())
    parameters = _opt(JSONObject())
    strict = _opt(StrictBool())


class ToolSchema(_Loose):
    type = StrictStr(required=True, validate=validate.Equal("function", error=TOOL_TYPE_MESSAGE))
    function = Nested(FunctionSchema, required=True)
    cache_control = _cache_control()


class JSONSchemaFormatSchema(_Loose):
    name = _opt(StrictStr())
    description = _opt(StrictStr())
    schema = JSONObject(required=True)
    strict = _opt(StrictBool())


class TextFormatSchema(_Loose):
    type = StrictStr(required=True)


class JSONSchemaResponseFormatSchema(_Loose):
    type = StrictStr(required=True)
    json_schema = Nested(JSONSchemaFormatSchema, required=True)


RESPONSE_FORMAT = Tagged(
    "type",
    {"text": TextFormatSchema(), "json_schema": JSONSchemaResponseFormatSchema()},
    refused={"json_object": JSON_OBJECT_MESSAGE},
)


class StreamOptionsSchema(_Loose):
    include_usage = _opt(StrictBool())


# ---------------------------------------------------------------- the request


def _refuse_above_one(value: int) -> None:
    if value > 1:
        raise ValidationError(N_MESSAGE)


def _refuse_true(value: bool) -> None:
    if value:
        raise ValidationError(LOGPROBS_MESSAGE)


def _refuse_nonzero(value: int) -> None:
    if value != 0:
        raise ValidationError(LOGPROBS_MESSAGE)


def _refuse_nonempty(value: dict[str, Any]) -> None:
    if value:
        raise ValidationError(LOGIT_BIAS_MESSAGE)


def _text_only(value: list[str]) -> None:
    if any(m != "text" for m in value):
        raise ValidationError(MODALITIES_MESSAGE)


def _at_least_one(value: list[Any]) -> None:
    if not value:
        raise ValidationError(NO_USER_MESSAGE)


class ChatCompletionRequestSchema(_Loose):
    model = StrictStr(required=True, validate=validate.Length(min=1, max=MODEL_NAME_MAX))
    messages = List(MESSAGE, required=True, validate=_at_least_one)
    stream = _opt(StrictBool())
    stream_options = Nested(StreamOptionsSchema, allow_none=True)
    max_completion_tokens = _opt(StrictInt(validate=validate.Range(min=1)))
    max_tokens = _opt(StrictInt(validate=validate.Range(min=1)))
    temperature = _opt(StrictNumber(validate=validate.Range(min=0, max=TEMPERATURE_MAX)))
    top_p = _opt(StrictNumber(validate=validate.Range(min=0, max=TOP_P_MAX)))
    stop = _opt(StrOrList(StrictStr()))
    tools = _opt(List(Nested(ToolSchema)))
    tool_choice = Raw(allow_none=True)  # checked by the translator: ignored without tools
    parallel_tool_calls = _opt(StrictBool())
    response_format = _opt(RESPONSE_FORMAT)
    reasoning_effort = _opt(StrictStr(validate=validate.OneOf(REASONING_EFFORTS, error=REASONING_MESSAGE)))
    prompt_cache_key = _opt(StrictStr(validate=validate.Length(max=256)))
    n = _opt(StrictInt(validate=[validate.Range(min=1), _refuse_above_one]))
    logprobs = _opt(StrictBool(validate=_refuse_true))
    top_logprobs = _opt(StrictInt(validate=_refuse_nonzero))
    logit_bias = _opt(Dict(validate=_refuse_nonempty))
    modalities = _opt(List(StrictStr(), validate=_text_only))
    audio = Raw(allow_none=True)
    web_search_options = Raw(allow_none=True)
    functions = Raw(allow_none=True)
    function_call = Raw(allow_none=True)

    @validates_schema
    def _refused_objects(self, data: dict[str, Any], **_: Any) -> None:
        # Refused whatever their value (null means "not sent").
        if data.get("audio") is not None:
            raise ValidationError([MODALITIES_MESSAGE], field_name="modalities")
        if data.get("web_search_options") is not None:
            raise ValidationError([WEB_SEARCH_MESSAGE], field_name="web_search_options")
        if data.get("functions") is not None or data.get("function_call") is not None:
            raise ValidationError([FUNCTIONS_MESSAGE], field_name="functions")


CHAT_COMPLETION_REQUEST = ByKeys(ChatCompletionRequestSchema)


def load_chat_request(body: Any) -> dict[str, Any]:
    """Validate a parsed JSON body. Raises ``RequestValidationError`` with the first problem."""
    return load_request(CHAT_COMPLETION_REQUEST, body)
