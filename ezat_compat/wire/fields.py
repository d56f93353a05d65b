"""Strict marshmallow fields shared by the wire schemas.

JSON has exact types; OpenAI's API refuses ``"max_tokens": "64"`` and ``"stream": "yes"``, so
these fields don't coerce: a bool is a bool, a number is a number (and never a bool).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from marshmallow import Schema, ValidationError, fields
from marshmallow.utils import missing


class Direct(fields.Field):
    """A field whose common case skips marshmallow's generic bookkeeping.

    ``Field.deserialize`` checks for a missing or null value, runs field-level ``pre_load``
    and ``post_load`` processors and composes the validators into a fresh ``validate.And``
    on every call. A present, non-null value on a field without processors needs only
    ``_deserialize`` and, when there are validators, the same ``_validate``; everything else
    still goes through ``Field.deserialize``, so values and errors are unchanged.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Field-level processors arrived in marshmallow 4; with any, take the generic path.
        self._direct = not getattr(self, "pre_load", None) and not getattr(self, "post_load", None)

    def deserialize(
        self, value: Any, attr: str | None = None, data: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        if value is missing or value is None or not self._direct:
            return super().deserialize(value, attr, data, **kwargs)
        output = self._deserialize(value, attr, data, **kwargs)
        if self.validators:
            self._validate(output)
        return output


class Raw(Direct, fields.Raw):
    """``fields.Raw`` with the direct common case."""


class Dict(Direct, fields.Dict):
    """``fields.Dict`` with the direct common case."""


class List(Direct, fields.List):
    """``fields.List`` with the direct common case."""


class Nested(Direct, fields.Nested):
    """``fields.Nested`` with the direct common case."""


class StrictBool(Direct):
    default_error_messages = {"invalid": "Not a valid boolean."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class StrictInt(Direct):
    default_error_messages = {"invalid": "Not a valid integer."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise self.make_error("invalid")
        return int(value)


class StrictNumber(Direct):
    default_error_messages = {"invalid": "Not a valid number."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise self.make_error("invalid")
        return value


class StrictStr(Direct):
    default_error_messages = {"invalid": "Not a valid string."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> str:
        if not isinstance(value, str):
            raise self.make_error("invalid")
        return value


class JSONObject(Direct):
    """Any JSON object, passed through unchanged (JSON schemas, cache_control payloads)."""

    default_error_messages = {"invalid": "Not a valid object."}

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.make_error("invalid")
        return value


class Tagged(Direct):
    """A tagged union: the object's ``tag`` key picks the schema (messages by ``role``,
    parts by ``type``). ``refused`` maps a tag to the spec's refusal message, reported on the
    object itself (``messages[0].content[0]: audio input is not supported``) or, when the
    message is a ``(key, text)`` pair, on that key."""

    default_error_messages = {"invalid": "Not a valid object."}

    def __init__(
        self,
        tag: str,
        schemas: Mapping[str, Schema],
        *,
        refused: Mapping[str, str | tuple[str, str]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tag = tag
        self.schemas = dict(schemas)
        self.refused = dict(refused or {})
        self.choices = ", ".join(self.schemas)

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.make_error("invalid")
        tag = value.get(self.tag)
        schema = self.schemas.get(tag) if isinstance(tag, str) else None
        if schema is None:
            refusal = self.refused.get(tag) if isinstance(tag, str) else None
            if isinstance(refusal, tuple):
                raise ValidationError({refusal[0]: [refusal[1]]})
            if refusal is not None:
                raise ValidationError(refusal)
            if tag is None:
                raise ValidationError({self.tag: ["Missing data for required field."]})
            raise ValidationError({self.tag: [f"Must be one of: {self.choices}."]})
        return schema.load(value)


class StrOrList(Direct):
    """A string, or a list validated by ``inner`` (message content, ``stop``)."""

    default_error_messages = {"invalid": "Must be a string or a list."}

    def __init__(self, inner: fields.Field, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner = List(inner)

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> str | list[Any]:
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return self.inner.deserialize(value)
        raise self.make_error("invalid")
