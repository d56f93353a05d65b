"""Strict marshmallow fields shared by the wire schemas of every dialect.

JSON has exact types; OpenAI's and Anthropic's APIs refuse ``"max_tokens": "64"`` and
``"stream": "yes"``, so these fields don't coerce: a bool is a bool, a number is a number (and
never a bool). Each is a custom field as marshmallow documents them (``_deserialize`` and
``default_error_messages``), so a wrong type has one wording everywhere ("Not a valid boolean.").
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validates_schema

from ezat_compat.cooperative import tools

MISSING = "Missing data for required field."  # marshmallow's own wordings, for the checks it can't make
NULL = "Field may not be null."


class Loose(Schema):
    """Unknown keys are left out of the result: OpenAI's APIs ignore them; a native Messages
    body goes upstream as sent, whatever its schema loads."""

    class Meta:
        unknown = EXCLUDE

    error_messages = {"type": "Not a valid object."}  # the wording of every other field that wants one


def refuse(message: str, allowed: Callable[[Any], bool] = lambda value: False) -> Callable[[Any], None]:
    """A validator refusing with ``message`` every value ``allowed`` doesn't take (validators
    never see null: a field that allows it takes it for "not sent")."""

    def check(value: Any) -> None:
        if not allowed(value):
            raise ValidationError(message)

    return check


def refused_when_sent(*rules: tuple[tuple[str, ...], str, str]) -> Callable[..., None]:
    """A schema's whole-body check refusing members whatever their value (null means "not
    sent"): each rule is ``(names, field, message)``; the first rule with one of its ``names``
    in the body refuses it with ``message`` under ``field``. Made here, with the fields, so that
    loading a schema runs no code of the schema's own module."""

    @validates_schema
    def check(self: Schema, data: Mapping[str, Any], **_: Any) -> None:
        for names, field_name, message in rules:
            for name in names:
                if data.get(name) is not None:
                    raise ValidationError([message], field_name=field_name)

    return check


class StrictBool(fields.Field):
    default_error_messages = {"invalid": "Not a valid boolean."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class StrictInt(fields.Field):
    default_error_messages = {"invalid": "Not a valid integer."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise self.make_error("invalid")
        return int(value)


class StrictNumber(fields.Field):
    default_error_messages = {"invalid": "Not a valid number."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise self.make_error("invalid")
        return value


class StrictStr(fields.Field):
    default_error_messages = {"invalid": "Not a valid string."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> str:
        if not isinstance(value, str):
            raise self.make_error("invalid")
        return value


class JSONObject(fields.Field):
    """Any JSON object, passed through unchanged (JSON schemas, cache_control payloads)."""

    default_error_messages = {"invalid": "Not a valid object."}

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.make_error("invalid")
        return value


_ABSENT = object()


class Tagged(fields.Field):
    """A tagged union: the object's ``tag`` key picks the schema (messages by ``role``,
    parts by ``type``); ``default`` is the tag of an object without the key, or a function of
    the object that gives it (a Responses input item without ``type`` is a message, or a
    reference by its ``id`` alone). ``refused`` maps a tag to the spec's refusal message,
    reported on the object itself (``messages[0].content[0]: audio input is not supported``)
    or, when the message is a ``(key, text)`` pair, on that key. Any other tag is refused on
    the tag's key: "Must be one of: …." or, where the reference words it, ``unknown`` with
    ``{tag}`` standing for the tag as JSON (``unsupported tool type "laser"; …``). The result is
    the tag, then what its schema loads."""

    default_error_messages = {"invalid": "Not a valid object."}

    def __init__(
        self,
        tag: str,
        schemas: Mapping[str, Schema],
        *,
        refused: Mapping[str, str | tuple[str, str]] | None = None,
        default: str | Callable[[Mapping[str, Any]], str] | None = None,
        unknown: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tag = tag
        self.schemas = dict(schemas)
        self.refused = dict(refused or {})
        self.default = default
        self.unknown = unknown
        self.choices = ", ".join(self.schemas)

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> dict[str, Any]:
        global _tagged_loads
        _tagged_loads += 1
        if _tagged_loads % TAGGED_PAUSE_EVERY == 0:  # 200,000 messages share the worker's loop
            tools().pause()
        if not isinstance(value, dict):
            raise self.make_error("invalid")
        tag = value.get(self.tag, _ABSENT)
        if tag is _ABSENT:  # the object has no tag: the default, or what it gives for the object
            tag = self.default(value) if callable(self.default) else self.default
        schema = self.schemas.get(tag) if isinstance(tag, str) else None
        if schema is None:
            refusal = self.refused.get(tag) if isinstance(tag, str) else None
            if isinstance(refusal, tuple):
                raise ValidationError({refusal[0]: [refusal[1]]})
            if refusal is not None:
                raise ValidationError(refusal)
            if tag is None:
                missing = self.tag not in value
                raise ValidationError({self.tag: [MISSING if missing else NULL]})
            if self.unknown is not None:
                raise ValidationError({self.tag: [self.unknown.format(tag=json.dumps(tag))]})
            raise ValidationError({self.tag: [f"Must be one of: {self.choices}."]})
        # The tag picked the schema, which loads the rest (it declares no field for the tag).
        return {self.tag: tag, **schema.load(value)}


TAGGED_PAUSE_EVERY = 256  # tagged objects (messages, items, parts) loaded between two cooperative pauses
_tagged_loads = 0


class StrOrList(fields.Field):
    """A string, or a list validated by ``inner`` (message content, ``stop``)."""

    default_error_messages = {"invalid": "Must be a string or a list."}

    def __init__(self, inner: fields.Field, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner = fields.List(inner)

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> str | list[Any]:
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return self.inner.deserialize(value)
        raise self.make_error("invalid")
