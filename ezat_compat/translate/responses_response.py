"""Anthropic message -> OpenAI Responses ``response`` object (docs/responses.md, "Output").

- ``response_skeleton(...)``: the fields a response echoes from its request.
- ``anthropic_to_response(message, ...)``: a whole Anthropic message -> the response object.
- the output items both it and the stream (``translate/responses_stream.py``) build.

Output items: text -> a ``message`` item with one ``output_text`` part (web-search citations as
``url_citation`` annotations), or one ``refusal`` part when the reply stopped with ``refusal``
(the reply's last message, or a new one: ``refusal_text`` is the upstream's explanation, else
that message's text, else a default; the response is ``completed``, as OpenAI's API answers a
refusal); each thinking block -> a ``reasoning`` item (``summary_text``
only when summaries were asked for; ``encrypted_content`` when a ``seal`` is given: the caller
strips it from what the client sees unless it asked for it); ``tool_use`` -> ``function_call``
or ``custom_tool_call`` under the client's own name and namespace (a ``tool_search_call`` for a
client-run tool search); server-side web searches ->
``web_search_call``. Pure: ids, times and the seal are parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ezat_compat.domain import Usage
from ezat_compat.translate.ids import decode_tool_id
from ezat_compat.translate.response import tool_arguments, usage_from_anthropic
from ezat_compat.translate.responses_tools import CUSTOM_INPUT, TOOL_SEARCH, ClientTool

Seal = Callable[[list[dict[str, Any]]], str]
THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
INCOMPLETE_REASONS = {
    "max_tokens": "max_output_tokens",
    "model_context_window_exceeded": "max_output_tokens",
    "guardrail_intervened": "content_filter",  # a Bedrock deployment's guardrail blocked it
}
REFUSAL = "refusal"  # the stop reason whose reply is a refusal part
DEFAULT_REFUSAL = "The model declined to answer."
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def obj(value: Any) -> Mapping[str, Any]:
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY  # dict: no ABC check


def usage_to_responses(usage: Usage) -> dict[str, Any]:
    """The Responses ``usage``: input_tokens counts all input (uncached, cache reads, cache writes)."""
    prompt = usage.prompt_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": prompt + usage.output_tokens,
    }


def response_skeleton(
    req: Mapping[str, Any], *, response_id: str, created: int, model: str, store: bool
) -> dict[str, Any]:
    """The response object before its output: ids, status and the request's settings echoed."""
    reasoning = obj(req.get("reasoning"))
    text = obj(req.get("text"))
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "max_tool_calls": req.get("max_tool_calls"),
        "model": model,
        "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls") is not False,
        "previous_response_id": req.get("previous_response_id"),
        "prompt_cache_key": req.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": req.get("safety_identifier"),
        "service_tier": "default",
        "store": store,
        "temperature": req.get("temperature", 1.0),
        "text": {"format": {"type": "text"}, **text},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p", 1.0),
        "truncation": req.get("truncation") or "disabled",
        "usage": None,
        "user": req.get("user"),
        "metadata": req.get("metadata") or {},
    }


def client_view(response: Mapping[str, Any], include_encrypted: bool) -> Mapping[str, Any]:
    """The response as the client gets it: ``encrypted_content`` only when it was asked for
    (``response`` itself when it has none to strip; a copy otherwise)."""
    output = response.get("output") or ()
    if include_encrypted or not any("encrypted_content" in item for item in output):
        return response
    out = dict(response)
    out["output"] = [client_item(item, include_encrypted) for item in output]
    return out


def client_item(item: Mapping[str, Any], include_encrypted: bool) -> dict[str, Any]:
    out = dict(item)
    if out.get("type") == "reasoning" and not include_encrypted:
        out.pop("encrypted_content", None)
    return out


@dataclass(slots=True)
class ItemIds:
    """Output item ids: ``<prefix>_<response key>_<n>``, unique within and across responses."""

    key: str
    count: int = 0

    def next(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.key}{self.count:03d}"


def status_of(stop_reason: Any) -> tuple[str, dict[str, Any] | None]:
    reason = INCOMPLETE_REASONS.get(stop_reason) if isinstance(stop_reason, str) else None
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def reasoning_item(item_id: str, block: Mapping[str, Any], summary: bool, seal: Seal | None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    text = block.get("thinking")
    if summary and block.get("type") == "thinking" and isinstance(text, str) and text:
        item["summary"] = [{"type": "summary_text", "text": text}]
    if seal is not None:
        item["encrypted_content"] = seal([copy.deepcopy(dict(block))])
    return item


def call_item(item_id_of: ItemIds, block: Mapping[str, Any], tools: Mapping[str, ClientTool]) -> dict[str, Any]:
    name = str(block.get("name", ""))
    client = tools.get(name)
    call_id = decode_tool_id(str(block.get("id", "")))
    tool_input = block.get("input")
    if client is not None and client.kind == TOOL_SEARCH:
        return search_call_item(item_id_of.next("tsc"), call_id, tool_input)
    if client is not None and client.kind == "custom":
        text = tool_input.get(CUSTOM_INPUT) if isinstance(tool_input, Mapping) else None
        item = {
            "id": item_id_of.next("ctc"),
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": call_id,
            "name": client.name,
            "input": text if isinstance(text, str) else "",
        }
    else:
        item = {
            "id": item_id_of.next("fc"),
            "type": "function_call",
            "status": "completed",
            "arguments": tool_arguments(tool_input),
            "call_id": call_id,
            "name": client.name if client is not None else name,
        }
    if client is not None and client.namespace is not None:
        item["namespace"] = client.namespace
    return item


def search_call_item(item_id: str, call_id: str, arguments: Any) -> dict[str, Any]:
    """A call of the client-run tool search, as Codex reads it (openai/codex
    codex-rs/protocol/src/models.rs, ``ResponseItem::ToolSearchCall``)."""
    return {
        "id": item_id,
        "type": "tool_search_call",
        "status": "completed",
        "call_id": call_id,
        "execution": "client",
        "arguments": dict(arguments) if isinstance(arguments, Mapping) else {},
    }


def url_annotation(citation: Mapping[str, Any], start: int, end: int) -> dict[str, Any] | None:
    if citation.get("type") != "web_search_result_location" or not isinstance(citation.get("url"), str):
        return None
    return {
        "type": "url_citation",
        "start_index": start,
        "end_index": end,
        "url": citation["url"],
        "title": citation.get("title") or "",
    }


def search_item(item_id: str, block: Mapping[str, Any]) -> dict[str, Any]:
    query = obj(block.get("input")).get("query")
    return {
        "id": item_id,
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": query if isinstance(query, str) else ""},
    }


def _message_item(item_id: str, text: str, annotations: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": annotations, "logprobs": []}],
    }


def refusal_text(stop_details: Any, text: str) -> str:
    """A refusal part's text: the upstream's ``stop_details.explanation`` when it gave one, else
    the text the model wrote before it stopped, else a default."""
    explanation = obj(stop_details).get("explanation")
    if isinstance(explanation, str) and explanation:
        return explanation
    return text or DEFAULT_REFUSAL


def refusal_part(refusal: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": refusal}


def refusal_item(item_id: str, refusal: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [refusal_part(refusal)],
    }


def anthropic_to_response(
    message: Mapping[str, Any],
    skeleton: Mapping[str, Any],
    *,
    ids: ItemIds,
    tools: Mapping[str, ClientTool],
    summary: bool,
    seal: Seal | None,
) -> tuple[dict[str, Any], Usage]:
    """A whole Anthropic message -> (the response object, its usage)."""
    status, incomplete = status_of(message.get("stop_reason"))
    output: list[dict[str, Any]] = []
    text_parts: list[str] = []
    annotations: list[dict[str, Any]] = []
    message_id: str | None = None
    length = 0

    def close_message() -> None:
        nonlocal message_id, length
        if message_id is not None:
            output.append(_message_item(message_id, "".join(text_parts), list(annotations), "completed"))
        message_id, length = None, 0
        text_parts.clear()
        annotations.clear()

    for block in message.get("content") or ():
        block = obj(block)
        kind = block.get("type")
        if kind == "text":
            raw = block.get("text")
            text = raw if isinstance(raw, str) else ""
            if message_id is None:
                message_id = ids.next("msg")
            for citation in block.get("citations") or ():
                annotation = url_annotation(obj(citation), length, length + len(text))
                if annotation is not None:
                    annotations.append(annotation)
            text_parts.append(text)
            length += len(text)
            continue
        close_message()
        if kind in THINKING_TYPES:
            output.append(reasoning_item(ids.next("rs"), block, summary, seal))
        elif kind == "tool_use":
            output.append(call_item(ids, block, tools))
        elif kind == "server_tool_use" and block.get("name") == "web_search":
            output.append(search_item(ids.next("ws"), block))
    if message.get("stop_reason") == REFUSAL:  # the last message (or a new one) is the refusal
        refusal = refusal_text(message.get("stop_details"), "".join(text_parts))
        output.append(refusal_item(message_id or ids.next("msg"), refusal))
    else:
        close_message()
    usage = usage_from_anthropic(obj(message.get("usage")))
    response = dict(skeleton, status=status, incomplete_details=incomplete, output=output)
    response["usage"] = usage_to_responses(usage)
    return response, usage
