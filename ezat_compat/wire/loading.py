"""Loading request bodies through the wire schemas: every dialect the same way.

``load_request(schema, body)`` validates a parsed JSON body and returns what the schema loads;
any fault raises ``RequestValidationError`` with the first problem as ``path`` and ``message``
(the flattener of ``wire.paths`` names the part: ``messages[0].content[2].image_url.url``).
The dialect turns it into its 400 ``invalid_request_error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marshmallow import Schema, ValidationError

from ezat_compat.wire.paths import first_error

NOT_AN_OBJECT = "The request body must be a JSON object."


class ByKeys:
    """Load bodies through ``schema_class`` restricted to the fields a body holds.

    marshmallow visits every declared field on each load, and an absent optional field still
    costs a ``Field.deserialize`` call to find it has nothing to do. A request schema declares
    dozens of fields of which a body sends a handful, so ``load`` uses an instance built with
    marshmallow's ``only`` option: the fields present in the body plus the required ones, in
    declaration order. That is the schema's own result and errors (an absent optional field
    yields neither), for a fraction of the walk.

    Instances are built on first use of a key set and kept, at most ``limit`` of them; past
    that, bodies with other key sets load through the full schema, so arbitrary key sets can
    neither grow memory nor make every request build a schema. An instance is never changed
    once built: threads and greenlets share them.
    """

    def __init__(self, schema_class: type[Schema], limit: int = 64) -> None:
        self.full = schema_class()
        self.schema_class = schema_class
        self.limit = limit
        self.order = tuple(self.full.fields)
        self.keys = frozenset(self.order)
        self.required = frozenset(name for name, field in self.full.fields.items() if field.required)
        self.variants: dict[frozenset[str], Schema] = {}
        for name, field in self.full.fields.items():
            if field.data_key is not None and field.data_key != name:
                raise ValueError(f"{schema_class.__name__}.{name}: ByKeys needs fields without a data_key")

    def schema_for(self, body: Mapping[str, Any]) -> Schema:
        present = self.keys.intersection(body) | self.required
        schema = self.variants.get(present)
        if schema is None:
            if len(present) == len(self.keys) or len(self.variants) >= self.limit:
                return self.full
            only = [name for name in self.order if name in present]
            schema = self.variants[present] = self.schema_class(only=only)
        return schema

    def load(self, body: Mapping[str, Any]) -> Any:
        """``schema_class().load(body)``: the same result, the same errors."""
        return self.schema_for(body).load(body)


class RequestValidationError(Exception):
    """A request that fails its schema: ``path`` names the field ("" for the whole body),
    ``message`` says why."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def load_request(schema: ByKeys | Schema, body: Any) -> dict[str, Any]:
    """``body`` loaded by ``schema``; ``RequestValidationError`` with the first problem."""
    if not isinstance(body, dict):
        raise RequestValidationError("", NOT_AN_OBJECT)
    try:
        result: dict[str, Any] = schema.load(body)
    except ValidationError as exc:
        raise RequestValidationError(*first_error(exc.messages)) from None
    return result
