"""OpenAI Responses request -> Anthropic Messages request (docs/responses.md).

``responses_to_anthropic(req, items, model, ...)`` takes the client's body (a JSON object), the
input items to send (the stored conversation of ``previous_response_id`` first, then this
request's ``input``, each with its client path) and the model, and returns the Anthropic body
and what the dialect needs around it. Where a field has a Chat Completions equivalent it follows
the chat rules, with the chat translator's own pieces (images, PDFs, reasoning, sampling, cache
breakpoints: ``translate/request.py``). Semantic problems raise ``InvalidRequestError`` naming
the client's path (``input[2].content[0].image_url``, ``tools[3].name``). The request is one
``wire/responses.py`` loaded (types, shapes and the refused fields checked there); the stored
items of ``previous_response_id`` passed the same schema when they were sent, or are the
gateway's own output.

Pure: the reasoning items' ``encrypted_content`` is opened by the ``unseal`` callback the caller
passes (it needs the gateway's secret).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ezat_compat.domain import Model
from ezat_compat.translate.body_json import no_pause
from ezat_compat.translate.ids import encode_tool_id
from ezat_compat.translate.request import (
    PAUSE_EVERY,
    ImageSlot,
    _auto_breakpoints,
    _bad,
    _blank,
    _reasoning,
    _sampling,
    _text_block,
    _Turn,
    anthropic_body,
    image_url_block,
    pdf_block,
)
from ezat_compat.translate.responses_tools import (
    CUSTOM_INPUT,
    TOOL_SEARCH,
    ClientTool,
    flat_name,
    tool_choice_to_anthropic,
    tools_to_anthropic,
)
from ezat_compat.translate.schema import SchemaBudget, fit_schema
from ezat_compat.translate.tables import (
    DEFAULT_MAX_TOKENS,
)

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")

Unseal = Callable[[Any, str], list[dict[str, Any]]]  # (encrypted_content, its path) -> blocks; 400 raises


@dataclass(slots=True)
class ResponsesTranslation:
    body: dict[str, Any]  # Anthropic body, without "model" and "stream"
    stream: bool = False
    session: str | None = None
    thinking: bool = False
    summary: bool = False  # reasoning.summary set: thinking text comes back as summary_text
    encrypted: bool = False  # include has reasoning.encrypted_content
    image_slots: list[ImageSlot] = field(default_factory=list)
    source_map: dict[tuple[Any, ...], str] = field(default_factory=dict)
    tools: dict[str, ClientTool] = field(default_factory=dict)  # Anthropic tool name -> the client's
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature / top_p as sent


def input_items(req: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """This request's ``input`` as (item, path) pairs: a string is one user message."""
    value = req.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [({"type": "message", "role": "user", "content": value}, "input")]
    return [(item, f"input[{i}]") for i, item in enumerate(value)]


# ---------------------------------------------------------------- content parts


def _part_block(
    part: dict[str, Any], path: str, model: Model, model_name: str, slots: list[ImageSlot]
) -> dict[str, Any] | None:
    """One content part -> an Anthropic block (None: nothing to send: a refusal, blank text)."""
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = str(part.get("text", ""))
        return None if _blank(text) else _text_block(text)
    if kind == "input_image":
        if not model.vision:
            raise _bad(path, f"model {model_name} does not accept images")
        return image_url_block(str(part.get("image_url")), f"{path}.image_url", slots)
    if kind == "input_file":
        if not model.pdf:
            raise _bad(path, f"model {model_name} does not accept PDF files")
        data = part.get("file_data")
        if data is None:
            return _pdf_url_block(part, path, slots)
        return pdf_block(str(data), f"{path}.file_data", part.get("filename"))
    return None  # an earlier refusal: dropped, as chat drops refusal parts


def _pdf_url_block(part: Mapping[str, Any], path: str, slots: list[ImageSlot]) -> dict[str, Any]:
    """``input_file`` with ``file_url`` -> a base64 document block whose PDF the gateway
    downloads (added to ``slots``), under the rules, limits and guards of image URLs: the
    upstream may not reach the host (an intranet URL), Bedrock and Vertex take no URL sources,
    and the public-address guard must apply. ``filename`` becomes its title."""
    url = str(part.get("file_url"))
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise _bad(f"{path}.file_url", "must be an http(s) URL of a PDF file")
    block: dict[str, Any] = {"type": "document", "source": None}
    filename = part.get("filename")
    if filename:
        block["title"] = filename
    slots.append(ImageSlot(path=f"{path}.file_url", block=block, url=url, pdf=True))
    return block


def _content_pairs(
    content: Any, path: str, model: Model, model_name: str, slots: list[ImageSlot]
) -> list[tuple[dict[str, Any], str]]:
    if isinstance(content, str):
        return [] if _blank(content) else [(_text_block(content), path)]
    out = []
    for j, part in enumerate(content or ()):
        part_path = f"{path}[{j}]"
        block = _part_block(part, part_path, model, model_name, slots)
        if block is not None:
            out.append((block, part_path))
    return out


# ---------------------------------------------------------------- the conversation


@dataclass(slots=True)
class _Conversation:
    system: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    turns: list[_Turn] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)  # call id -> its item's path
    answered: set[str] = field(default_factory=set)
    tools: list[tuple[dict[str, Any], str, bool]] = field(default_factory=list)  # from items: (tool, path, found)


def _unanswered(conv: _Conversation) -> None:
    for call_id, path in conv.pending.items():
        raise _bad(
            path,
            f'tool call "{call_id}" has no output; send a function_call_output (or custom_tool_call_output) '
            "with this call_id after it",
        )


def _turn(conv: _Conversation, role: str, index: int) -> _Turn:
    if conv.turns and conv.turns[-1].role == role:
        turn = conv.turns[-1]
    else:
        if role == "assistant":
            _unanswered(conv)
        turn = _Turn(role, first_message=index)
        conv.turns.append(turn)
    turn.last_message = index
    return turn


def _call_block(item: dict[str, Any], path: str, custom: bool) -> tuple[str, dict[str, Any]]:
    """A ``function_call`` / ``custom_tool_call`` item -> (call id, ``tool_use`` block)."""
    call_id, name = str(item.get("call_id")), str(item.get("name"))
    if custom:
        tool_input: Any = {CUSTOM_INPUT: item.get("input")}
    else:
        arguments = item.get("arguments")
        if not isinstance(arguments, str) or not arguments.strip():
            tool_input = {}
        else:
            try:
                tool_input = json.loads(arguments)
            except ValueError:
                raise _bad(f"{path}.arguments", "is not valid JSON") from None
            if not isinstance(tool_input, dict):
                raise _bad(f"{path}.arguments", "must be a JSON object")
    namespace = item.get("namespace")
    block = {"type": "tool_use", "id": encode_tool_id(call_id), "name": flat_name(namespace, name), "input": tool_input}
    return call_id, block


def _search_call_block(item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A ``tool_search_call`` item -> (call id, ``tool_use`` block of the tool search)."""
    call_id = str(item.get("call_id"))
    arguments = item.get("arguments")
    tool_input = arguments if isinstance(arguments, dict) else {}
    return call_id, {"type": "tool_use", "id": encode_tool_id(call_id), "name": TOOL_SEARCH, "input": tool_input}


def _found_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for tool in tools:
        if tool.get("type") == "namespace":
            names.extend(flat_name(str(tool.get("name")), str(m.get("name"))) for m in tool.get("tools") or ())
        else:
            names.append(str(tool.get("name")))
    return names


def _search_output_block(item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A ``tool_search_output`` item -> (call id, ``tool_result`` naming the tools found, which
    the request declares from then on)."""
    call_id = str(item.get("call_id"))
    names = _found_names(item.get("tools") or ())
    text = f"Tools found, now available to call: {', '.join(names)}." if names else "No tools found."
    return call_id, {"type": "tool_result", "tool_use_id": encode_tool_id(call_id), "content": text}


def _output_block(
    item: dict[str, Any], path: str, model: Model, model_name: str, slots: list[ImageSlot]
) -> tuple[str, dict[str, Any]]:
    """A ``function_call_output`` / ``custom_tool_call_output`` item -> (call id, ``tool_result``)."""
    call_id = str(item.get("call_id"))
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": encode_tool_id(call_id)}
    output = item.get("output")
    if isinstance(output, str):
        if output:
            block["content"] = output
        return call_id, block
    pairs = _content_pairs(output, f"{path}.output", model, model_name, slots)
    if pairs:
        block["content"] = [b for b, _ in pairs]
    return call_id, block


def _conversation(
    items: Sequence[tuple[dict[str, Any], str]],
    model: Model,
    model_name: str,
    slots: list[ImageSlot],
    unseal: Unseal,
    pause: Callable[[], None] = no_pause,
) -> _Conversation:
    conv = _Conversation()
    for i, (item, path) in enumerate(items):
        if i % PAUSE_EVERY == PAUSE_EVERY - 1:
            pause()
        kind = item.get("type", "message")
        if kind == "message":
            role = str(item.get("role"))
            content_path = f"{path}.content"
            pairs = _content_pairs(item.get("content"), content_path, model, model_name, slots)
            if role in ("system", "developer"):
                conv.system.extend(pairs)  # joined into the system prompt wherever they appear
            elif pairs:
                _turn(conv, role, i).blocks.extend(pairs)
        elif kind in ("function_call", "custom_tool_call", "tool_search_call"):
            if kind == "tool_search_call":
                call_id, block = _search_call_block(item)
            else:
                call_id, block = _call_block(item, path, kind == "custom_tool_call")
            if call_id in conv.pending or call_id in conv.answered:
                raise _bad(f"{path}.call_id", f'tool call id "{call_id}" is used twice')
            _turn(conv, "assistant", i).blocks.append((block, path))
            conv.pending[call_id] = path
        elif kind in ("function_call_output", "custom_tool_call_output", "tool_search_output"):
            if kind == "tool_search_output":
                call_id, block = _search_output_block(item)
                tools = item.get("tools") or ()
                conv.tools.extend((tool, f"{path}.tools[{k}]", True) for k, tool in enumerate(tools))
            else:
                call_id, block = _output_block(item, path, model, model_name, slots)
            if call_id not in conv.pending:
                if call_id in conv.answered:
                    raise _bad(f"{path}.call_id", f'tool call "{call_id}" already has an output')
                raise _bad(f"{path}.call_id", f'no function_call with call_id "{call_id}" before this item')
            del conv.pending[call_id]
            conv.answered.add(call_id)
            _turn(conv, "user", i).results.append((block, path))
        elif kind == "reasoning":
            sealed = item.get("encrypted_content")
            if sealed is not None:  # the thinking blocks as received, put back where they were
                blocks = unseal(sealed, f"{path}.encrypted_content")
                _turn(conv, "assistant", i).blocks.extend((b, path) for b in blocks)
            # without encrypted_content: the kept thinking is looked up by its tool calls' ids
        elif kind == "additional_tools":  # Codex's Responses-lite: tools of the request, in input
            conv.tools.extend((tool, f"{path}.tools[{k}]", False) for k, tool in enumerate(item.get("tools") or ()))
        # web_search_call: a finished server-side search, its results already part of the answer
    return conv


def _finish(conv: _Conversation, model: Model, model_name: str) -> None:
    if not any(turn.role == "user" for turn in conv.turns):
        raise _bad("input", "must contain at least one user message")
    last = conv.turns[-1]
    _unanswered(conv)
    if last.role == "assistant":
        if not model.prefill:
            raise _bad(
                last.blocks[-1][1],
                f"model {model_name} does not support assistant message prefill; "
                "the input must end with a user message or a tool output",
            )
        block = last.blocks[-1][0]
        if block["type"] == "text":
            block["text"] = block["text"].rstrip()


# ---------------------------------------------------------------- output, reasoning, sampling


def _max_tokens(req: Mapping[str, Any], model: Model, model_name: str) -> int:
    value = req.get("max_output_tokens")
    if value is None:
        return min(DEFAULT_MAX_TOKENS, model.max_output_tokens)
    if value > model.max_output_tokens:
        raise _bad("max_output_tokens", f"must be at most {model.max_output_tokens} for model {model_name}")
    return int(value)


def _reasoning_options(req: Mapping[str, Any]) -> tuple[str | None, bool]:
    """``reasoning`` -> (effort as chat's reasoning_effort, summaries asked for)."""
    reasoning = req.get("reasoning")
    if reasoning is None:
        return None, False
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    return reasoning.get("effort"), summary is not None


def _output_format(
    req: Mapping[str, Any], model: Model, model_name: str, budget: SchemaBudget
) -> dict[str, Any] | None:
    """``text.format``: json_schema -> structured output (the schema fitted as chat's
    ``response_format``, under the request's ``budget``), text -> nothing."""
    fmt = (req.get("text") or {}).get("format")
    if fmt is None or fmt.get("type") != "json_schema":
        return None
    if not model.structured_output:
        raise _bad("text.format", f"model {model_name} does not support structured output (json_schema)")
    return {"type": "json_schema", "schema": fit_schema(fmt["schema"], "text.format.schema", budget)}


# ---------------------------------------------------------------- the request


def responses_to_anthropic(
    req: Mapping[str, Any],
    items: Sequence[tuple[dict[str, Any], str]],
    model: Model,
    *,
    unseal: Unseal,
    auto_cache: bool = True,
    pause: Callable[[], None] = no_pause,
) -> ResponsesTranslation:
    """Translate a Responses request for ``model``. ``items``: the conversation to send as
    (item, client path) pairs; ``auto_cache`` is False with ``x-ezat-cache: off``; ``pause``
    is called every ``PAUSE_EVERY`` items (a worker's cooperative yield)."""
    name = str(req["model"])
    slots: list[ImageSlot] = []
    instructions = req.get("instructions")
    conv = _conversation(items, model, name, slots, unseal, pause)
    if instructions and not _blank(instructions):
        conv.system.insert(0, (_text_block(instructions), "instructions"))
    _finish(conv, model, name)

    declared = [(tool, f"tools[{t}]", False) for t, tool in enumerate(req.get("tools") or ())]
    declared += [t for t in conv.tools if not t[2]] + [t for t in conv.tools if t[2]]
    budget = SchemaBudget()  # one for every schema of the request
    tool_pairs, tool_names, _ = (
        tools_to_anthropic(declared, model, name, pause, budget) if declared else ([], {}, False)
    )
    parallel = req.get("parallel_tool_calls")
    choice = tool_choice_to_anthropic(req.get("tool_choice"), tool_names, parallel, model, name) if tool_pairs else None
    forced = choice is not None and choice["type"] in ("any", "tool")
    max_tokens = _max_tokens(req, model, name)
    effort_name, summary = _reasoning_options(req)
    effort, thinking = _reasoning(effort_name, forced, max_tokens, model, name, "reasoning.effort")
    output_format = _output_format(req, model, name, budget)
    sampling = {key: req[key] for key in ("temperature", "top_p") if req.get(key) is not None}

    source_map: dict[tuple[Any, ...], str] = {}
    system = []
    for k, (block, path) in enumerate(conv.system):
        system.append(block)
        source_map[("system", k)] = path
    messages = []
    for k, turn in enumerate(conv.turns):
        content = []
        for m, (block, path) in enumerate(turn.ordered()):
            content.append(block)
            source_map[("messages", k, m)] = path
        source_map[("messages", k)] = items[turn.first_message][1]
        messages.append({"role": turn.role, "content": content})
    tools = []
    for t, (block, path) in enumerate(tool_pairs):
        tools.append(block)
        source_map[("tools", t)] = path
    if auto_cache and model.caching:
        _auto_breakpoints(system, tools, messages)

    body = anthropic_body(
        max_tokens=max_tokens,
        system=system,
        messages=messages,
        tools=tools,
        choice=choice,
        thinking=thinking,
        effort=effort,
        output_format=output_format,
        sampling=_sampling(sampling, model, thinking is not None),
    )
    include = req.get("include") or ()
    cache_key = req.get("prompt_cache_key")
    return ResponsesTranslation(
        body=body,
        stream=req.get("stream") is True,
        session=cache_key if isinstance(cache_key, str) and cache_key else None,
        thinking=thinking is not None,
        summary=summary,
        encrypted="reasoning.encrypted_content" in include,
        image_slots=slots,
        source_map=source_map,
        tools=tool_names,
        sampling=sampling,
    )
