"""OpenAI Responses tools -> Anthropic tools (docs/responses.md, "Tools").

``tools_to_anthropic`` turns the client's tools into Anthropic's, with the client's own name of
each (``ClientTool``: its kind and namespace) so that calls come back as the client declared
them; ``tool_choice_to_anthropic`` the tool choice. Function tools keep their schema (a
``strict`` one fitted to structured outputs), custom tools take one string, namespaces are
flattened to ``<namespace>__<name>`` (Codex's default ``functions`` namespace not), a client-run
``tool_search`` is a tool like a function, web search is Anthropic's server-side search for
models with it. The tools are as ``wire/responses.py`` loaded them; what needs the model or the
whole list (names, duplicates, the tool choice) is judged here. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ezat_compat.domain import Model
from ezat_compat.translate.body_json import no_pause
from ezat_compat.translate.request import TOOL_NAME, TOOLS_PAUSE_EVERY, _bad
from ezat_compat.translate.schema import SchemaBudget, fit_tool_schema
from ezat_compat.translate.tables import TOOL_CHOICE_TO_ANTHROPIC

WEB_SEARCH_TYPES = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")
ANTHROPIC_WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search"}
NAMESPACE_SEPARATOR = "__"
# Codex's Responses-lite folds its top-level function and custom tools into this namespace, and
# takes a call in it with or without the namespace (openai/codex codex-rs/tools/src/tool_spec.rs
# create_tools_json_for_responses_lite; codex-rs/core/src/tools/router_tests.rs): its members are
# top-level tools here, their calls named without it.
DEFAULT_NAMESPACE = "functions"
TOOL_SEARCH = "tool_search"  # a client-run tool search (openai/codex codex-rs/tools/src/tool_spec.rs)
CUSTOM_INPUT = "input"  # the one string property of the Anthropic tool standing for a custom tool


@dataclass(frozen=True, slots=True)
class ClientTool:
    """What the client calls an Anthropic tool: ``kind`` "function", "custom", "tool_search"
    or "web_search", the namespace it was declared in (None at the top level and in the default
    one) and its own name."""

    kind: str
    name: str
    namespace: str | None = None


def flat_name(namespace: str | None, name: str) -> str:
    """The Anthropic name of a tool declared in a namespace: ``<namespace>__<name>``, stray
    underscores around the separator trimmed (as the Codex CLI flattens names)."""
    if namespace is None or namespace in ("", DEFAULT_NAMESPACE):
        return name
    return namespace.rstrip("_") + NAMESPACE_SEPARATOR + name.lstrip("_")


def client_namespace(namespace: str | None) -> str | None:
    """The namespace a call comes back in: none for the default one (Codex's ``functions``)."""
    return None if namespace in (None, "", DEFAULT_NAMESPACE) else namespace


def _tag(value: Any) -> str | None:
    """A ``type`` as a string (anything else counts as unknown, never as a key)."""
    return value if isinstance(value, str) else None


def _schema(params: Any, strict: bool, path: str, name: str = "", budget: SchemaBudget | None = None) -> dict[str, Any]:
    """A function tool's parameters -> ``input_schema`` (the chat rules: an object schema; a
    ``strict`` one fitted to structured outputs under the request's ``budget``, a refusal naming
    the tool ``name``)."""
    if params is None:
        return {"type": "object", "properties": {}}
    schema = dict(params)
    if "type" not in schema:
        schema = {"type": "object", **schema}
    elif schema["type"] != "object":
        raise _bad(f"{path}.parameters.type", 'must be "object"')
    return fit_tool_schema(schema, f"{path}.parameters", name, budget) if strict else schema


def _custom_tool(tool: dict[str, Any], path: str) -> dict[str, Any]:
    """A custom (freeform) tool -> an Anthropic tool taking one string, ``input``; a grammar
    format is given to the model in the description."""
    description = tool.get("description") or ""
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax = fmt.get("syntax") or "lark"
        definition = fmt.get("definition") or ""
        description += f"\n\nThe input must follow this {syntax} grammar:\n{definition}"
    schema = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's input, as free text."}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    block: dict[str, Any] = {"input_schema": schema}
    if description.strip():
        block["description"] = description.strip()
    return block


def _one_tool(
    tool: dict[str, Any], path: str, namespace: str | None, budget: SchemaBudget
) -> tuple[dict[str, Any], ClientTool]:
    kind = tool.get("type")
    name = str(tool.get("name"))
    if kind == "function":
        strict = tool.get("strict") is True
        block: dict[str, Any] = {}
        description = tool.get("description")
        if description:
            block["description"] = description
        block["input_schema"] = _schema(tool.get("parameters"), strict, path, name, budget)
        if tool.get("strict") is not None:
            block["strict"] = strict
    else:
        block = _custom_tool(tool, path)
    anthropic_name = flat_name(namespace, name)
    if not TOOL_NAME.fullmatch(anthropic_name):
        raise _bad(
            f"{path}.name",
            "must be 1 to 128 characters from a-z, A-Z, 0-9, _ and - (^[a-zA-Z0-9_-]{1,128}$)"
            + (f' once joined to its namespace as "{anthropic_name}"' if namespace else ""),
        )
    return {"name": anthropic_name, **block}, ClientTool(str(kind), name, client_namespace(namespace))


def _tool_search(tool: Mapping[str, Any], path: str) -> tuple[dict[str, Any], ClientTool]:
    """A client-run tool search (``"execution": "client"``, the only kind the schema lets
    through) -> an ordinary tool of its parameters: the client runs the search and answers
    with a ``tool_search_output`` item whose tools join the request."""
    block: dict[str, Any] = {"name": TOOL_SEARCH}
    description = tool.get("description")
    if isinstance(description, str) and description.strip():
        block["description"] = description.strip()
    block["input_schema"] = _schema(tool.get("parameters"), False, path)
    return block, ClientTool(TOOL_SEARCH, TOOL_SEARCH)


def _web_search(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A web search tool -> Anthropic's, its allowed domains and approximate location kept."""
    block: dict[str, Any] = dict(ANTHROPIC_WEB_SEARCH)
    filters = tool.get("filters")
    if isinstance(filters, dict) and isinstance(filters.get("allowed_domains"), list):
        block["allowed_domains"] = [d for d in filters["allowed_domains"] if isinstance(d, str)]
    location = tool.get("user_location")
    if isinstance(location, dict):
        keys = ("city", "region", "country", "timezone")
        fields = {k: location[k] for k in keys if isinstance(location.get(k), str) and location[k]}
        if fields:
            block["user_location"] = {"type": "approximate", **fields}
    return block


def tools_to_anthropic(
    tools: Sequence[tuple[dict[str, Any], str, bool]],
    model: Model,
    model_name: str,
    pause: Callable[[], None] = no_pause,
    budget: SchemaBudget | None = None,
) -> tuple[list[tuple[dict[str, Any], str]], dict[str, ClientTool], bool]:
    """Tools as (tool, client path, found) -> (Anthropic tools with their paths, Anthropic
    name -> client tool, web search translated). ``tools``: the request's, then those of its
    ``additional_tools`` items, then those a client-run tool search found (``found``: a name
    already there is left out, as a tool found twice; elsewhere a duplicate is refused).
    Namespaces are flattened; web_search only for models with it (the schema refused the other
    built-ins). ``pause`` every ``TOOLS_PAUSE_EVERY`` tools (a worker's cooperative yield).
    ``budget``: the request's ``SchemaBudget``, for its strict tools and its ``text.format``
    together (None: one for these tools alone)."""
    budget = SchemaBudget() if budget is None else budget
    out: list[tuple[dict[str, Any], str]] = []
    names: dict[str, ClientTool] = {}
    web_search = False

    def add(block: dict[str, Any], client: ClientTool, path: str, found: bool) -> None:
        if block["name"] in names:
            if found:
                return
            raise _bad(f"{path}.name", f'duplicate tool name "{block["name"]}"')
        names[block["name"]] = client
        out.append((block, path))

    for position, (tool, path, found) in enumerate(tools):
        if position % TOOLS_PAUSE_EVERY == TOOLS_PAUSE_EVERY - 1:
            pause()
        kind = tool.get("type")
        if kind in ("function", "custom"):
            add(*_one_tool(tool, path, None, budget), path, found)
        elif kind == TOOL_SEARCH:
            add(*_tool_search(tool, path), path, found)
        elif kind == "namespace":
            namespace = str(tool.get("name"))
            for k, member in enumerate(tool.get("tools") or ()):
                member_path = f"{path}.tools[{k}]"
                add(*_one_tool(member, member_path, namespace, budget), member_path, found)
        elif kind in WEB_SEARCH_TYPES and model.web_search and not web_search:
            # (a model without web search: the tool is left out, never forwarded)
            web_search = True
            names["web_search"] = ClientTool("web_search", "web_search")
            out.append((_web_search(tool), path))
    if out and not model.tools:
        raise _bad("tools", f"model {model_name} does not support tools")
    return out, names, web_search


def tool_choice_to_anthropic(
    value: Any, names: Mapping[str, ClientTool], parallel: bool | None, model: Model, model_name: str
) -> dict[str, Any] | None:
    """auto/none/required, a named function or custom tool, or the web search tool ->
    Anthropic's auto/none/any/tool; ``parallel_tool_calls: false`` -> ``disable_parallel_tool_use``."""
    choice: dict[str, Any] | None
    if value is None:
        choice = None
    elif isinstance(value, str) and value in TOOL_CHOICE_TO_ANTHROPIC:
        choice = {"type": TOOL_CHOICE_TO_ANTHROPIC[value]}
    elif isinstance(value, dict) and value.get("type") in ("function", "custom") and isinstance(value.get("name"), str):
        wanted = flat_name(value.get("namespace") if isinstance(value.get("namespace"), str) else None, value["name"])
        client = names.get(wanted)
        if client is None or client.kind != value["type"]:
            raise _bad("tool_choice.name", f'no {value["type"]} tool named "{value["name"]}" in tools')
        choice = {"type": "tool", "name": wanted}
    elif isinstance(value, dict) and _tag(value.get("type")) in WEB_SEARCH_TYPES:
        if "web_search" not in names:
            raise _bad("tool_choice.type", f"model {model_name} has no web search tool")
        choice = {"type": "tool", "name": "web_search"}
    else:
        raise _bad(
            "tool_choice",
            'must be "auto", "none", "required", {"type": "function", "name": …} or {"type": "custom", "name": …}',
        )
    if choice is not None and choice["type"] in ("any", "tool") and not model.forced_tool_choice:
        raise _bad(
            "tool_choice",
            f'model {model_name} does not support a forced tool choice ("required" or a named tool); use "auto"',
        )
    if parallel is False and (choice is None or choice["type"] != "none"):
        choice = dict(choice or {"type": "auto"}, disable_parallel_tool_use=True)
    return choice
