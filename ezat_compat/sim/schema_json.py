"""Schema-driven JSON: a deterministic value for a JSON schema (tool inputs, structured output)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ezat_compat.sim.request import is_int, is_number

MAX_SCHEMA_DEPTH = 12


def schema_value(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A deterministic value valid for a JSON schema.

    Strings are ``"example"`` (or the first enum value / the const), integers 1, numbers 1.5
    (both moved inside ``minimum``/``maximum``), booleans true, arrays ``[]`` (or
    ``minItems`` items), objects their required properties (all when none are required),
    recursively. ``$ref`` to ``#/$defs/…`` or ``#/definitions/…`` is followed; ``anyOf`` /
    ``oneOf`` / ``allOf`` use their first non-null option.
    """
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return schema_value(_resolve_ref(root, ref), root, depth + 1)
    for combinator in ("anyOf", "oneOf", "allOf"):
        options = schema.get(combinator)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if not (isinstance(o, dict) and o.get("type") == "null")), options[0])
            return schema_value(chosen, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _VALUE_BY_TYPE.get(kind, lambda s, r, d: "example")(schema, root, depth)


def _resolve_ref(root: Any, ref: str) -> Any:
    node = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _bounded(schema: Mapping[str, Any], value: float) -> float:
    low, high = schema.get("minimum"), schema.get("maximum")
    if isinstance(low, int | float) and is_number(low) and value < low:
        value = float(low)
    if isinstance(high, int | float) and is_number(high) and value > high:
        value = float(high)
    return value


def _object_value(schema: Mapping[str, Any], root: Any, depth: int) -> dict[str, Any]:
    found, listed = schema.get("properties"), schema.get("required")
    properties: dict[str, Any] = found if isinstance(found, dict) else {}
    required: list[Any] = listed if isinstance(listed, list) else []
    keys = [k for k in required if isinstance(k, str)] or list(properties)
    return {key: schema_value(properties.get(key, {"type": "string"}), root, depth + 1) for key in keys}


def _array_value(schema: Mapping[str, Any], root: Any, depth: int) -> list[Any]:
    count = schema.get("minItems", 0)
    if not is_int(count) or count <= 0:
        return []
    return [schema_value(schema.get("items", {}), root, depth + 1) for _ in range(min(count, 16))]


def _integer_value(schema: Mapping[str, Any], root: Any, depth: int) -> int:
    return int(_bounded(schema, 1))


def _number_value(schema: Mapping[str, Any], root: Any, depth: int) -> float:
    return _bounded(schema, 1.5)


_VALUE_BY_TYPE = {
    "object": _object_value,
    "array": _array_value,
    "string": lambda s, r, d: "example",
    "integer": _integer_value,
    "number": _number_value,
    "boolean": lambda s, r, d: True,
    "null": lambda s, r, d: None,
}
