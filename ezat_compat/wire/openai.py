"""The Chat Completions request, as marshmallow schemas (Chat Completions reference and
API reference, "Request Body").

Schemas validate and refuse; they don't translate. Fields the spec ignores are excluded
(``unknown = EXCLUDE``) and so never reach the upstream. Refused fields carry the spec's
exact messages; the flattener in ``wire.paths`` turns them into ``path: message``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, types, validate, validates_schema
from marshmallow.decorators import PRE_LOAD
from marshmallow.utils import missing

from ezat_compat.translate.tables import REASONING_EFFORTS
from ezat_compat.wire.fields import (
    Dict,
    JSONObject,
    List,
    Nested,
    Raw,
    StrictBool,
    StrictInt,
    StrictNumber,
    StrictStr,
    StrOrList,
    Tagged,
)
from ezat_compat.wire.paths import first_error

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


class _Sparse(Schema):
    """A schema that visits only the fields a body can affect.

    marshmallow walks every declared field on each load, and an absent optional field still
    costs a closure and a ``Field.deserialize`` call to find out it has nothing to do: it
    yields no value and no error.
    ``load`` here hands the work to a *variant* of the schema whose ``load_fields`` keep just
    the fields present in the body plus every required field and every field with a
    ``load_default``, in declaration order. The variant shares this schema's bound fields
    and hooks, so the result (keys, values, order) and the errors (same fields, same order,
    schema validators skipped or run alike) are those of a full load.

    Only schemas whose loads can't see the difference take the short cut: unknown keys
    excluded, no ``pre_load`` hook (it could add keys), no ``many``/``partial``/``only``/
    ``exclude``/``load_only``/``dump_only`` options, and a plain ``dict`` as input. Variants
    are built once per (schema, set of present keys) and kept in a bounded LRU cache, so
    bodies with arbitrary key sets cost one cheap copy each and can't grow memory. A
    variant is never changed after it is built, so threads and greenlets may share it.
    """

    class Meta:
        unknown = EXCLUDE

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sparse_optional: frozenset[str] | None = None
        eligible = (
            self.unknown == EXCLUDE
            and not self.many
            and not self.partial
            and self.only is None
            and not self.exclude
            and not self.load_only
            and not self.dump_only
            and not self._hooks[PRE_LOAD]
        )
        optional = frozenset(
            _data_key(name, field)
            for name, field in self.load_fields.items()
            if not field.required and field.load_default is missing
        )
        if eligible and optional:
            self._sparse_optional = optional

    def load(
        self,
        data: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        many: bool | None = None,
        partial: bool | types.StrSequenceOrSet | None = None,
        unknown: types.UnknownOption | None = None,
    ) -> Any:
        optional = self._sparse_optional
        if (
            optional is not None
            and type(data) is dict
            and many is None
            and partial is None
            and (unknown is None or unknown == EXCLUDE)
        ):
            present = optional.intersection(data)
            if len(present) != len(optional):
                return Schema.load(_variant(self, present), data)
        return super().load(data, many=many, partial=partial, unknown=unknown)


def _data_key(name: str, field: fields.Field) -> str:
    return field.data_key if field.data_key is not None else name


@functools.lru_cache(maxsize=512)
def _variant(schema: _Sparse, present: frozenset[str]) -> Schema:
    """``schema`` restricted to the fields ``present`` in a body, required fields and fields
    with a ``load_default``: a shallow copy sharing its bound fields, loaded as a plain
    ``Schema`` (no further short cut)."""
    variant = object.__new__(type(schema))
    variant.__dict__.update(schema.__dict__)
    variant._sparse_optional = None
    variant.load_fields = {
        name: field
        for name, field in schema.load_fields.items()
        if field.required or field.load_default is not missing or _data_key(name, field) in present
    }
    return variant


class _Loose(_Sparse):
    """Unknown keys are ignored, as OpenAI's API ignores them."""

    class Meta:
        unknown = EXCLUDE


def _opt(field: fields.Field) -> fields.Field:
    field.allow_none = True
    return field


class CacheControlSchema(_Sparse):
    type = StrictStr(required=True, validate=validate.Equal("ephemeral", error='Must be "ephemeral".'))
    ttl = StrictStr(validate=validate.OneOf(["5m", "1h"]))

    class Meta:
        unknown = EXCLUDE


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


CHAT_COMPLETION_REQUEST = ChatCompletionRequestSchema()


def load_chat_request(body: Any) -> dict[str, Any]:
    """Validate a parsed JSON body. Raises ``RequestValidationError`` with the first problem."""
    if not isinstance(body, dict):
        raise RequestValidationError("", "the request body must be a JSON object")
    simple = load_simple_request(body)
    if simple is not None:
        return simple
    try:
        return CHAT_COMPLETION_REQUEST.load(body)
    except ValidationError as exc:
        raise RequestValidationError(*first_error(exc.messages)) from None


# ---------------------------------------------------------------- the simple request, directly
#
# Most requests are a model, a few messages of text and a handful of scalar options. For those
# the result of ``CHAT_COMPLETION_REQUEST.load`` is known without walking marshmallow's fields:
# the same keys in the same order, fresh dicts and lists, the same values. Everything else — a
# field of the schema not handled here, a value of another type, out of range or null where
# the schema doesn't allow it, content parts, tool calls — returns None and goes through the
# schema, which gives the result or the error. A property test holds the two equal.


def _limit(low: float, high: float) -> Any:
    def check(value: Any) -> bool:  # StrictNumber and Range(min=low, max=high); null allowed
        return value is None or ((type(value) is int or type(value) is float) and low <= value <= high)

    return check


def _positive_int(value: Any) -> bool:  # StrictInt and Range(min=1); null allowed
    return value is None or (type(value) is int and value >= 1)


_SIMPLE_SCALARS: dict[str, Any] = {
    "model": lambda value: type(value) is str and 1 <= len(value) <= MODEL_NAME_MAX,
    "stream": lambda value: value is None or type(value) is bool,
    "max_completion_tokens": _positive_int,
    "max_tokens": _positive_int,
    "temperature": _limit(0, TEMPERATURE_MAX),
    "top_p": _limit(0, TOP_P_MAX),
}
# The schema's fields in declaration order: the order of the result's keys.
_FIELD_ORDER = tuple(_data_key(name, f) for name, f in CHAT_COMPLETION_REQUEST.load_fields.items())
_SIMPLE_ORDER = tuple(key for key in _FIELD_ORDER if key in _SIMPLE_SCALARS or key == "messages")
_SCHEMA_KEYS = frozenset(_FIELD_ORDER)
# Roles whose schema has only ``role`` and ``content`` (content: a string here); the
# assistant's also has tool calls (and optional content), left to the schema.
_TEXT_ROLES = frozenset({"system", "developer", "user"})


def load_simple_request(body: dict[str, Any]) -> dict[str, Any] | None:
    """``CHAT_COMPLETION_REQUEST.load(body)`` for a simple valid body; None for any other."""
    for key in body:
        check = _SIMPLE_SCALARS.get(key)
        if check is not None:
            if not check(body[key]):
                return None
        elif key != "messages" and key in _SCHEMA_KEYS:
            return None  # a field the schema must see (unknown keys are left out, as it leaves them)
    if "model" not in body:
        return None
    messages = body.get("messages")
    if type(messages) is not list or not messages:
        return None
    loaded_messages = []
    for message in messages:
        if type(message) is not dict:
            return None
        role, content = message.get("role"), message.get("content")
        if type(content) is not str or type(role) is not str:
            return None
        if role not in _TEXT_ROLES and (role != "assistant" or "tool_calls" in message or "function_call" in message):
            return None
        loaded_messages.append({"role": role, "content": content})
    out: dict[str, Any] = {}
    for key in _SIMPLE_ORDER:
        if key in body:
            out[key] = loaded_messages if key == "messages" else body[key]
    return out


class RequestValidationError(Exception):
    """A request that fails the schema: ``path`` names the field, ``message`` says why."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message
