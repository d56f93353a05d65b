"""A client's JSON schema -> the subset Anthropic's structured outputs accept (Chat
Completions reference, "Output length and format" and "Tools").

``response_format`` json_schema and ``strict`` tools are decoded under Anthropic's grammar
constraints, which take a subset of JSON Schema ("JSON Schema limitations" in Anthropic's
structured-outputs guide). ``fit_schema`` rewrites a schema the way Anthropic's own SDKs do
(``transform_schema`` in anthropic-sdk-python, ``transformJSONSchema`` in the TypeScript SDK),
so what the clients send as-is (instructor's JSON_SCHEMA mode, LangChain dict schemas, the AI
SDK's ``generateObject``) reaches the model:

- every object gets ``"additionalProperties": false`` when it has none;
- constraints the grammar can't enforce (``minimum``, ``minLength``, ``maxItems``, ``minItems``
  above 1, unknown string formats, patterns with lookarounds or backreferences, ``not``…) move
  into the schema's ``description`` as ``{minLength: 3, maxLength: 20}`` (values as JSON), so
  the model still reads them;
- ``oneOf`` becomes ``anyOf``; a ``$ref`` inside ``allOf`` is inlined; ``$schema``, ``$id`` and
  ``$comment`` are dropped; a ``$ref``'s sibling keywords are dropped (as the SDKs do);
- an ``enum`` or ``const`` next to a ``type`` keeps exactly the values of that type, and a
  list ``type`` beside it is dropped (the values decide; the API refuses the pair).

What can't be expressed is refused with ``InvalidRequestError`` naming the keyword's path in
the client's request (``response_format.json_schema.schema.properties.tags.additionalProperties``):
``additionalProperties`` other than false and ``patternProperties`` (objects take only the
properties they list), recursive or external ``$ref``, a schema without a type, an unknown
type, an ``enum`` of objects or arrays, an ``enum`` with no value of its type.

The work is bounded by the schemas' size, never by what inlining makes of them: each referenced
schema (a definition, an ``allOf`` ``$ref``'s target) is fitted once and copied at each further
use, and what inlining adds (each ``allOf`` use of a target, each further copy) is at most
``MAX_INLINED`` characters of JSON for the whole request, not for each schema: a chain of
definitions each listing the next one twice doubles at every level, and 2,000 strict tools each
just under a per-schema cap once held a worker's 4.7 GB. A ``SchemaBudget`` holds that
count: make one per request and pass it to every ``fit_schema`` / ``fit_tool_schema`` of the
request. A size is checked before its copy is made, so the work stops as soon as the budget is
passed. Beyond the budget, or past ``MAX_DEPTH`` levels, the schema is refused with a 400 naming
its path (``tools[3].function.parameters``). Recursive schemas are refused before any of this.

Pure: plain data in, a new dict out; the input is never changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ezat_compat.errors import InvalidRequestError

TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)
MIN_ITEMS_KEPT = (0, 1)  # Anthropic: "Array minItems (only values 0 and 1 supported)"
DROPPED = ("$schema", "$id", "$comment")  # about the document, not the value
DEFINITIONS = ("$defs", "definitions")
# Regex features Anthropic's grammar refuses: backreferences, lookahead/lookbehind, word boundaries.
UNSUPPORTED_PATTERN = re.compile(r"\\[1-9]|\\k<|\(\?<?[=!]|\\[bB]")
MAX_DEPTH = 64  # nesting levels; deeper schemas are refused rather than recursed into without end
# JSON characters inlining (allOf $refs, and further copies of what they point to) may add to one
# request's schemas, all together: far beyond any grammar the API compiles ("The compiled grammar
# is too large"), far below what would hold a worker (~20 ms of CPU, a few MB).
MAX_INLINED = 256 * 1024

_SCALARS = (str, int, float, bool, type(None))
_TYPES_TEXT = ", ".join(TYPES)


def _bad(path: str, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"{path}: {reason}", param=path)


@dataclass(slots=True)
class SchemaBudget:
    """What inlining may add to one request's schemas, all together: ``limit`` JSON characters,
    ``spent`` so far. Make one per request (``SchemaBudget()``) and pass it to every
    ``fit_schema`` and ``fit_tool_schema`` call of that request (strict tools' parameters,
    ``response_format``, ``text.format``); never share one between requests. A schema that passes
    it is refused with a 400 naming the schema's path."""

    limit: int = MAX_INLINED
    spent: int = 0


@dataclass(slots=True)
class _Fitted:
    """A referenced schema fitted once: the result, how many levels it goes down, its size as
    JSON (measured when first inlined) and whether the result itself is already in the output."""

    schema: dict[str, Any]
    height: int
    size: int | None = None
    placed: bool = False


@dataclass(slots=True)
class _Document:
    """The client's whole schema, for resolving ``$ref`` pointers, and where it sits; what
    fitting it has done so far (each referenced schema once) and how much inlining added."""

    root: Mapping[str, Any]
    path: str
    budget: SchemaBudget  # the request's, shared by its schemas
    # ref pointer -> done (True) / being walked (False): the recursion check's colours
    walked: dict[str, bool] = field(default_factory=dict)
    resolved: dict[str, tuple[Any, str]] = field(default_factory=dict)  # ref pointer -> target
    fitted: dict[int, _Fitted] = field(default_factory=dict)  # id(client schema) -> its fitting
    sizes: dict[int, int] = field(default_factory=dict)  # id(inlined copy) -> its JSON size
    deepest: int = 0  # the deepest level fitting has reached (for a reused schema's height)
    inlined: int = 0  # JSON characters the inlined copies add to this schema

    def resolve(self, ref: Any, path: str) -> tuple[Any, str]:
        """A local ``$ref`` -> (the schema it points to, that schema's path in the request)."""
        if isinstance(ref, str) and ref in self.resolved:
            return self.resolved[ref]
        if not isinstance(ref, str):
            raise _bad(path, "must be a string")
        if not ref.startswith("#"):
            raise _bad(path, f'external $ref "{ref}" is not supported; put the schema in $defs')
        if ref != "#" and not ref.startswith("#/"):
            raise _bad(path, f'$ref "{ref}" is not supported; refer to a definition as "#/$defs/Name"')
        node: Any = self.root
        where = self.path
        for raw in ref[2:].split("/") if ref != "#" else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
                where = f"{where}.{part}"
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
                where = f"{where}[{part}]"
            else:
                raise _bad(path, f'$ref "{ref}" points to nothing in the schema')
        self.resolved[ref] = (node, where)
        return node, where

    def check_refs(self, node: Any, path: str, depth: int = 0) -> None:
        """Refuse a ``$ref`` that leads back to itself (Anthropic: "Recursive schemas" are not
        supported). Each referenced schema is walked once."""
        if depth > MAX_DEPTH:
            raise _bad(path, f"the schema is nested more than {MAX_DEPTH} levels deep")
        if not isinstance(node, Mapping):
            return
        ref = node.get("$ref")
        if ref is not None:
            state = self.walked.get(ref) if isinstance(ref, str) else None
            if state is False:
                raise _bad(f"{path}.$ref", f'recursive schemas are not supported ("{ref}" refers back to itself)')
            if state is None:
                target, target_path = self.resolve(ref, f"{path}.$ref")
                self.walked[ref] = False
                self.check_refs(target, target_path, depth + 1)
                self.walked[ref] = True
            return
        for key, child, child_path in _children(node, path):
            if key not in DEFINITIONS:
                self.check_refs(child, child_path, depth + 1)


def _children(node: Mapping[str, Any], path: str) -> list[tuple[str, Any, str]]:
    """The sub-schemas that stay schemas after fitting: (keyword, schema, path)."""
    out: list[tuple[str, Any, str]] = []
    for key in ("properties", *DEFINITIONS):
        value = node.get(key)
        if isinstance(value, Mapping):
            out.extend((key, child, f"{path}.{key}.{name}") for name, child in value.items())
    if isinstance(node.get("items"), Mapping):
        out.append(("items", node["items"], f"{path}.items"))
    for key in ("anyOf", "oneOf", "allOf"):
        value = node.get(key)
        if isinstance(value, list):
            out.extend((key, child, f"{path}.{key}[{i}]") for i, child in enumerate(value))
    return out


def fit_schema(schema: Mapping[str, Any], path: str, budget: SchemaBudget | None = None) -> dict[str, Any]:
    """The schema the client sent at ``path`` (``response_format.json_schema.schema``,
    ``tools[0].function.parameters``), fitted to Anthropic's structured outputs: a new dict.
    ``budget``: the request's ``SchemaBudget``, shared by all its schemas (None: one of its own,
    for a schema alone).

    Raises ``InvalidRequestError`` (400) naming the sub-path when the schema can't be expressed,
    or naming ``path`` when inlining would pass the budget.
    """
    if not isinstance(schema, Mapping):
        raise _bad(path, "must be a JSON schema object")
    doc = _Document(schema, path, SchemaBudget() if budget is None else budget)
    doc.check_refs(schema, path)
    for key in DEFINITIONS:  # definitions nothing refers to are sent too: check them as well
        defs = schema.get(key)
        if isinstance(defs, Mapping):
            for name in defs:
                doc.check_refs({"$ref": f"#/{key}/{name.replace('~', '~0').replace('/', '~1')}"}, path)
    return _fit(schema, path, doc, 0)


# ---------------------------------------------------------------- one schema node


def fit_tool_schema(
    schema: Mapping[str, Any], path: str, tool: str, budget: SchemaBudget | None = None
) -> dict[str, Any]:
    """``fit_schema`` for the parameters of the strict tool named ``tool``: a refusal names the
    tool too, as the client knows it (``… (tool "get_weather")``)."""
    try:
        return fit_schema(schema, path, budget)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{exc.message} (tool {_json(tool)})", param=exc.param) from None


def _fit(node: Any, path: str, doc: _Document, depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise _bad(path, f"the schema is nested more than {MAX_DEPTH} levels deep")
    if depth > doc.deepest:
        doc.deepest = depth
    if not isinstance(node, Mapping):
        raise _bad(path, "must be a JSON schema object")
    rest = dict(node)
    for key in DROPPED:
        rest.pop(key, None)
    out: dict[str, Any] = {}
    for key in DEFINITIONS:
        if key in rest:
            defs = rest.pop(key)
            if not isinstance(defs, Mapping):
                raise _bad(f"{path}.{key}", "must be an object of schemas")
            out[key] = {
                name: _fit_once(child, f"{path}.{key}.{name}", doc, depth + 1, inlined=False)
                for name, child in defs.items()
            }
    if "$ref" in rest:
        doc.resolve(rest["$ref"], f"{path}.$ref")  # refuses external and dangling refs
        out["$ref"] = rest["$ref"]
        return out  # as the SDKs do: a reference stands alone
    _combinators(rest, out, path, doc, depth)
    types = _types(rest, out, path)
    _values(rest, out, types, path)
    for key in ("description", "title", "default"):
        if key in rest:
            out[key] = rest.pop(key)
    if "object" in types:
        _object(rest, out, path, doc, depth)
    if "string" in types:
        _string(rest, out)
    if "array" in types:
        _array(rest, out, path, doc, depth)
    if rest:  # what the grammar can't enforce: told to the model in the description
        note = "{" + ", ".join(f"{key}: {_json(value)}" for key, value in rest.items()) + "}"
        description = out.get("description")
        out["description"] = f"{description}\n\n{note}" if isinstance(description, str) and description else note
    return out


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _combinators(rest: dict[str, Any], out: dict[str, Any], path: str, doc: _Document, depth: int) -> None:
    """``anyOf`` kept, ``oneOf`` -> ``anyOf``; ``allOf`` kept with its ``$ref`` branches inlined
    (Anthropic: "allOf with $ref not supported")."""
    if "anyOf" in rest and "oneOf" in rest:
        raise _bad(f"{path}.oneOf", "use anyOf or oneOf, not both")
    for key in ("anyOf", "oneOf"):
        if key in rest:
            options = rest.pop(key)
            if not isinstance(options, list) or not options:
                raise _bad(f"{path}.{key}", "must be a non-empty list of schemas")
            out["anyOf"] = [_fit(option, f"{path}.{key}[{i}]", doc, depth + 1) for i, option in enumerate(options)]
    if "allOf" in rest:
        parts = rest.pop("allOf")
        if not isinstance(parts, list) or not parts:
            raise _bad(f"{path}.allOf", "must be a non-empty list of schemas")
        fitted = []
        for i, part in enumerate(parts):
            part_path = f"{path}.allOf[{i}]"
            hops = 0
            while isinstance(part, Mapping) and "$ref" in part and hops <= MAX_DEPTH:
                part, part_path = doc.resolve(part["$ref"], f"{part_path}.$ref")
                hops += 1
            if hops:
                fitted.append(_fit_once(part, part_path, doc, depth + 1, inlined=True))
            else:
                fitted.append(_fit(part, part_path, doc, depth + 1))
        out["allOf"] = fitted


def _fit_once(node: Any, path: str, doc: _Document, depth: int, *, inlined: bool) -> dict[str, Any]:
    """A schema that can be reached more than once (a definition, an ``allOf`` ``$ref``'s
    target) fitted the first time only; later uses get a copy, checked for depth. An ``inlined``
    use and every copy are charged to the request's budget before the copy is made."""
    entry = doc.fitted.get(id(node))
    if entry is None:
        outer = doc.deepest
        doc.deepest = depth
        schema = _fit(node, path, doc, depth)
        entry = doc.fitted[id(node)] = _Fitted(schema, doc.deepest - depth)
        doc.deepest = max(outer, doc.deepest)
    elif depth + entry.height > MAX_DEPTH:
        raise _bad(path, f"the schema is nested more than {MAX_DEPTH} levels deep")
    else:
        doc.deepest = max(doc.deepest, depth + entry.height)
    if inlined or entry.placed:
        if entry.size is None:
            entry.size = _measure(entry.schema, doc.sizes)
        _charge(doc, entry.size)
    schema = _copy(entry.schema) if entry.placed else entry.schema
    entry.placed = True
    if entry.size is not None:
        doc.sizes[id(schema)] = entry.size
    return schema


def _charge(doc: _Document, size: int) -> None:
    """Count ``size`` JSON characters of inlining against the schema and the request's budget;
    refuse the schema (its path) past the budget: alone, or with the request's other schemas."""
    doc.inlined += size
    budget = doc.budget
    budget.spent += size
    if budget.spent <= budget.limit:
        return
    advice = "refer to shared definitions with $ref outside allOf, which is sent as is"
    if doc.inlined > budget.limit:
        reason = f"the schema is too large once its allOf $refs are inlined (more than {budget.limit} characters)"
    else:
        reason = (
            "the request's schemas are too large once their allOf $refs are inlined "
            f"(more than {budget.limit} characters in all, this schema included)"
        )
    raise _bad(doc.path, f"{reason}; {advice}")


def _measure(value: Any, known: Mapping[int, int]) -> int:
    """``value``'s size as compact JSON (near enough), taking the size of a copy already
    measured from ``known``: each fitted node is measured once."""
    if isinstance(value, dict):
        size = known.get(id(value))
        if size is not None:
            return size
        return 1 + sum(len(_json(key)) + 2 + _measure(child, known) for key, child in value.items()) + (not value)
    if isinstance(value, list):
        return 1 + sum(1 + _measure(child, known) for child in value) + (not value)
    return len(_json(value))


def _copy(value: Any) -> Any:
    """A fitted schema copied, so no two places in the output share a dict or a list."""
    if isinstance(value, dict):
        return {key: _copy(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_copy(child) for child in value]
    return value


def _types(rest: dict[str, Any], out: dict[str, Any], path: str) -> tuple[str, ...]:
    """The node's types, checked; ``type`` goes to ``out`` (as the SDKs do, not beside anyOf/allOf).
    Without a type, ``properties`` means an object; enum, const, anyOf and allOf need none."""
    kind = rest.pop("type", None)
    if kind is None:
        if "properties" in rest:
            kind = "object"
        elif not ({"enum", "const"} & rest.keys() or "anyOf" in out or "allOf" in out):
            raise _bad(path, "the schema has no type; set type (or enum, const, anyOf, allOf or $ref)")
        else:
            return ()
    kinds = kind if isinstance(kind, list) else [kind]
    if not kinds:
        raise _bad(f"{path}.type", "must not be an empty list")
    for i, one in enumerate(kinds):
        if one not in TYPES:
            where = f"{path}.type" if isinstance(kind, str) else f"{path}.type[{i}]"
            raise _bad(where, f"{_json(one)} is not a supported type; use one of {_TYPES_TEXT}")
    if "anyOf" not in out and "allOf" not in out:
        out["type"] = kind
    return tuple(kinds)


def _matches(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float))
    if kind == "string":
        return isinstance(value, str)
    return False  # object and array values are refused before this


def _values(rest: dict[str, Any], out: dict[str, Any], types: tuple[str, ...], path: str) -> None:
    """``enum`` (non-empty, scalars only) and ``const`` (a scalar), reconciled with ``type``:
    only the values of the declared type(s) are kept, and a list ``type`` is dropped, since
    the API refuses an enum beside a list type ("Enum value … does not match declared type")."""
    if "enum" in rest:
        values = rest.pop("enum")
        if not isinstance(values, list) or not values:
            raise _bad(f"{path}.enum", "must be a non-empty list")
        for i, value in enumerate(values):
            if not isinstance(value, _SCALARS):
                raise _bad(f"{path}.enum[{i}]", "enum values must be strings, numbers, booleans or null")
        if types:
            values = [v for v in values if any(_matches(v, kind) for kind in types)]
            if not values:
                raise _bad(f"{path}.enum", f"no value is of type {_json(out.get('type', list(types)))}")
        out["enum"] = values
    if "const" in rest:
        value = rest.pop("const")
        if not isinstance(value, _SCALARS):
            raise _bad(f"{path}.const", "must be a string, a number, a boolean or null")
        if types and not any(_matches(value, kind) for kind in types):
            raise _bad(f"{path}.const", f"is not of type {_json(out.get('type', list(types)))}")
        out["const"] = value
    if ("enum" in out or "const" in out) and isinstance(out.get("type"), list):
        del out["type"]


def _object(rest: dict[str, Any], out: dict[str, Any], path: str, doc: _Document, depth: int) -> None:
    """``properties`` fitted, ``required`` kept, ``additionalProperties`` false (added when
    missing). Anthropic: "additionalProperties set to anything other than false" is not supported."""
    properties = rest.pop("properties", {})
    if not isinstance(properties, Mapping):
        raise _bad(f"{path}.properties", "must be an object of schemas")
    out["properties"] = {
        name: _fit(child, f"{path}.properties.{name}", doc, depth + 1) for name, child in properties.items()
    }
    if "required" in rest:
        out["required"] = rest.pop("required")
    extra = rest.pop("additionalProperties", False)
    if extra is not False:
        raise _bad(
            f"{path}.additionalProperties",
            "must be false: structured outputs allow only the properties listed; "
            "list every property, or use an array of key/value objects for a map",
        )
    if "patternProperties" in rest:
        raise _bad(f"{path}.patternProperties", "is not supported: structured outputs allow only the properties listed")
    out["additionalProperties"] = False


def _string(rest: dict[str, Any], out: dict[str, Any]) -> None:
    """The supported ``format`` values and simple ``pattern``s are kept; others are described."""
    if rest.get("format") in STRING_FORMATS:
        out["format"] = rest.pop("format")
    pattern = rest.get("pattern")
    if isinstance(pattern, str) and not UNSUPPORTED_PATTERN.search(pattern):
        out["pattern"] = rest.pop("pattern")


def _array(rest: dict[str, Any], out: dict[str, Any], path: str, doc: _Document, depth: int) -> None:
    """``items`` fitted; ``minItems`` kept when 0 or 1, otherwise described."""
    if isinstance(rest.get("items"), Mapping):
        out["items"] = _fit(rest.pop("items"), f"{path}.items", doc, depth + 1)
    min_items = rest.get("minItems")
    if not isinstance(min_items, bool) and min_items in MIN_ITEMS_KEPT:
        out["minItems"] = rest.pop("minItems")
