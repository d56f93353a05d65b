"""Anthropic message or stream -> OpenAI Responses ``response`` object and events
(docs/responses.md, "Output" and "Streaming").

- ``response_skeleton(...)``: the fields a response echoes from its request.
- ``anthropic_to_response(message, ...)``: a whole Anthropic message -> the response object.
- ``ResponseEvents``: Anthropic stream events -> Responses events (``response.created`` …
  ``response.completed``), each with its ``sequence_number``, one upstream event at a time.

Output items: text -> a ``message`` item with one ``output_text`` part (web-search citations as
``url_citation`` annotations); each thinking block -> a ``reasoning`` item (``summary_text``
only when summaries were asked for; ``encrypted_content`` when a ``seal`` is given: the caller
strips it from what the client sees unless it asked for it); ``tool_use`` -> ``function_call``
or ``custom_tool_call`` under the client's own name and namespace; server-side web searches ->
``web_search_call``. Pure: ids, times and the seal are parameters.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ezat_compat.domain import Usage
from ezat_compat.translate.ids import decode_tool_id
from ezat_compat.translate.response import merge_usage, tool_arguments, usage_from_anthropic
from ezat_compat.translate.responses_request import CUSTOM_INPUT, ClientTool

Seal = Callable[[list[dict[str, Any]]], str]
THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
INCOMPLETE_REASONS = {
    "max_tokens": "max_output_tokens",
    "model_context_window_exceeded": "max_output_tokens",
    "refusal": "content_filter",
}
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _obj(value: Any) -> Mapping[str, Any]:
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
    reasoning = _obj(req.get("reasoning"))
    text = _obj(req.get("text"))
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


def _status_of(stop_reason: Any) -> tuple[str, dict[str, Any] | None]:
    reason = INCOMPLETE_REASONS.get(stop_reason) if isinstance(stop_reason, str) else None
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def _reasoning_item(item_id: str, block: Mapping[str, Any], summary: bool, seal: Seal | None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    text = block.get("thinking")
    if summary and block.get("type") == "thinking" and isinstance(text, str) and text:
        item["summary"] = [{"type": "summary_text", "text": text}]
    if seal is not None:
        item["encrypted_content"] = seal([copy.deepcopy(dict(block))])
    return item


def _call_item(item_id_of: ItemIds, block: Mapping[str, Any], tools: Mapping[str, ClientTool]) -> dict[str, Any]:
    name = str(block.get("name", ""))
    client = tools.get(name)
    call_id = decode_tool_id(str(block.get("id", "")))
    tool_input = block.get("input")
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


def _annotation(citation: Mapping[str, Any], start: int, end: int) -> dict[str, Any] | None:
    if citation.get("type") != "web_search_result_location" or not isinstance(citation.get("url"), str):
        return None
    return {
        "type": "url_citation",
        "start_index": start,
        "end_index": end,
        "url": citation["url"],
        "title": citation.get("title") or "",
    }


def _search_item(item_id: str, block: Mapping[str, Any]) -> dict[str, Any]:
    query = _obj(block.get("input")).get("query")
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


def _refusal_item(item_id: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": "incomplete",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "The model declined to answer."}],
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
    status, incomplete = _status_of(message.get("stop_reason"))
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
        block = _obj(block)
        kind = block.get("type")
        if kind == "text":
            raw = block.get("text")
            text = raw if isinstance(raw, str) else ""
            if message_id is None:
                message_id = ids.next("msg")
            for citation in block.get("citations") or ():
                annotation = _annotation(_obj(citation), length, length + len(text))
                if annotation is not None:
                    annotations.append(annotation)
            text_parts.append(text)
            length += len(text)
            continue
        close_message()
        if kind in THINKING_TYPES:
            output.append(_reasoning_item(ids.next("rs"), block, summary, seal))
        elif kind == "tool_use":
            output.append(_call_item(ids, block, tools))
        elif kind == "server_tool_use" and block.get("name") == "web_search":
            output.append(_search_item(ids.next("ws"), block))
    close_message()
    if message.get("stop_reason") == "refusal" and not any(item["type"] == "message" for item in output):
        output.append(_refusal_item(ids.next("msg")))
    usage = usage_from_anthropic(_obj(message.get("usage")))
    response = dict(skeleton, status=status, incomplete_details=incomplete, output=output)
    response["usage"] = usage_to_responses(usage)
    return response, usage


# ---------------------------------------------------------------- streams


@dataclass(slots=True)
class _Open:
    """An output item being streamed: its index in ``output``, the item, and its pieces."""

    output_index: int
    item: dict[str, Any]
    kind: str  # message | reasoning | function_call | custom_tool_call | web_search_call
    parts: list[str] = field(default_factory=list)
    block: dict[str, Any] = field(default_factory=dict)  # a thinking block as received


Event = tuple[str, dict[str, Any]]


class ResponseEvents:
    """Anthropic stream events -> Responses events, one upstream event at a time.

    ``feed(event, data)`` returns the events to send now (each with its ``sequence_number``).
    When ``done`` (``message_stop`` arrived), every item is closed; the caller records the
    usage, then sends ``final_event()`` (``response.completed`` or ``response.incomplete``).
    ``error`` is the upstream's error object when it sent an ``error`` event; then send
    ``failed_events(...)``.
    """

    def __init__(
        self,
        skeleton: Mapping[str, Any],
        *,
        ids: ItemIds,
        tools: Mapping[str, ClientTool],
        summary: bool,
        seal: Seal | None,
        include_encrypted: bool,
    ) -> None:
        self.skeleton = skeleton  # never changed: each response object is a new dict made from it
        self.ids = ids
        self.tools = tools
        self.summary = summary
        self.seal = seal
        self.include_encrypted = include_encrypted
        self.output: list[dict[str, Any]] = []
        self.usage = Usage()
        self.stop_reason: str | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.started = False
        self.produced_chars = 0
        self.sequence = 0
        self._blocks: dict[int, _Open] = {}
        self._message: _Open | None = None

    # -- helpers -------------------------------------------------------------------------

    def _event(self, payload: dict[str, Any]) -> Event:
        """``payload`` (a new dict, ``type`` its first key) as the next event: its
        ``sequence_number`` is set, as its last key."""
        payload["sequence_number"] = self.sequence
        self.sequence += 1
        return payload["type"], payload

    def _view(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """The item as an event shows it now: a copy of its top level, enough because an item
        being streamed only ever changes by a key of its top level being set."""
        return client_item(item, self.include_encrypted)

    def _start(self) -> list[Event]:
        if self.started:
            return []
        self.started = True
        response = self.skeleton  # the response as it starts: in progress, no output
        return [
            self._event({"type": "response.created", "response": response}),
            self._event({"type": "response.in_progress", "response": response}),
        ]

    def _add(self, item: dict[str, Any], kind: str) -> tuple[_Open, Event]:
        opened = _Open(len(self.output), item, kind)
        self.output.append(item)
        return opened, self._event(
            {"type": "response.output_item.added", "output_index": opened.output_index, "item": self._view(item)}
        )

    def _done_item(self, opened: _Open) -> Event:
        opened.item["status"] = "completed" if opened.kind != "reasoning" else opened.item.get("status", "completed")
        if opened.kind == "reasoning":
            opened.item.pop("status", None)
        return self._event(
            {"type": "response.output_item.done", "output_index": opened.output_index, "item": self._view(opened.item)}
        )

    # -- events --------------------------------------------------------------------------

    def feed(self, event: str, data: Mapping[str, Any]) -> list[Event]:
        if self.done or self.error is not None:
            return []
        data = _obj(data)
        if event == "content_block_delta":
            return self._delta(data)
        if event == "content_block_start":
            return self._block_start(data)
        if event == "content_block_stop":
            return self._block_stop(data)
        if event == "message_start":
            self.usage = merge_usage(self.usage, _obj(_obj(data.get("message")).get("usage")))
            return self._start()
        if event == "message_delta":
            stop_reason = _obj(data.get("delta")).get("stop_reason")
            if isinstance(stop_reason, str):
                self.stop_reason = stop_reason
            self.usage = merge_usage(self.usage, _obj(data.get("usage")))
            return []
        if event == "message_stop":
            events = self._start()
            for index in list(self._blocks):
                events.extend(self._block_stop({"index": index}))
            events.extend(self._close_message())
            if self.stop_reason == "refusal" and not any(i["type"] == "message" for i in self.output):
                opened, added = self._add(_refusal_item(self.ids.next("msg")), "message")
                events += [added, self._done_item(opened)]
                opened.item["status"] = "incomplete"
            self.done = True
            return events
        if event == "error":
            error = data.get("error")
            self.error = dict(error) if isinstance(error, Mapping) else {"type": "api_error", "message": "failed"}
        return []

    def _open_message(self) -> list[Event]:
        if self._message is not None:
            return []
        item = {
            "id": self.ids.next("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        opened, added = self._add(item, "message")
        opened.block = {"annotations": []}
        self._message = opened
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            added,
            self._event(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": opened.output_index,
                    "content_index": 0,
                    "part": part,
                }
            ),
        ]

    def _close_message(self) -> list[Event]:
        opened = self._message
        if opened is None:
            return []
        self._message = None
        text = "".join(opened.parts)
        annotations = opened.block["annotations"]
        part = {"type": "output_text", "text": text, "annotations": annotations, "logprobs": []}
        opened.item["content"] = [part]
        item_id, output_index = opened.item["id"], opened.output_index
        return [
            self._event(
                {
                    "type": "response.output_text.done",
                    "item_id": item_id,
                    "output_index": output_index,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }
            ),
            self._event(
                {
                    "type": "response.content_part.done",
                    "item_id": item_id,
                    "output_index": output_index,
                    "content_index": 0,
                    "part": part,
                }
            ),
            self._done_item(opened),
        ]

    def _block_start(self, data: Mapping[str, Any]) -> list[Event]:
        index = data.get("index")
        block = _obj(data.get("content_block"))
        kind = block.get("type")
        events = self._start()
        if not isinstance(index, int):
            return events
        if kind == "text":
            events += self._open_message()
            text = block.get("text")
            if isinstance(text, str) and text:
                events += self._text(text)
            return events
        events += self._close_message()
        if kind in THINKING_TYPES:
            item = {"id": self.ids.next("rs"), "type": "reasoning", "summary": []}
            opened, added = self._add(item, "reasoning")
            opened.block = copy.deepcopy(dict(block))
            self._blocks[index] = opened
            events.append(added)
            if self.summary and kind == "thinking":
                part = {"type": "summary_text", "text": ""}
                events.append(
                    self._event(
                        {
                            "type": "response.reasoning_summary_part.added",
                            "item_id": item["id"],
                            "output_index": opened.output_index,
                            "summary_index": 0,
                            "part": part,
                        }
                    )
                )
        elif kind == "tool_use":
            full = _call_item(self.ids, {**block, "input": {}}, self.tools)
            full["status"] = "in_progress"
            if full["type"] == "custom_tool_call":
                full["input"] = ""
            else:
                full["arguments"] = ""
            opened, added = self._add(full, full["type"])
            self._blocks[index] = opened
            events.append(added)
        elif kind == "server_tool_use" and block.get("name") == "web_search":
            item = _search_item(self.ids.next("ws"), {})
            item["status"] = "in_progress"
            opened, added = self._add(item, "web_search_call")
            self._blocks[index] = opened
            where = {"item_id": item["id"], "output_index": opened.output_index}
            events += [
                added,
                self._event({"type": "response.web_search_call.in_progress", **where}),
                self._event({"type": "response.web_search_call.searching", **where}),
            ]
        return events

    def _text(self, text: str) -> list[Event]:
        opened = self._message
        if opened is None:
            return []
        opened.parts.append(text)
        self.produced_chars += len(text)
        return [
            self._event(
                {
                    "type": "response.output_text.delta",
                    "item_id": opened.item["id"],
                    "output_index": opened.output_index,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                }
            )
        ]

    def _delta(self, data: Mapping[str, Any]) -> list[Event]:
        delta = _obj(data.get("delta"))
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            return self._text(text) if isinstance(text, str) and text else []
        if kind == "citations_delta":
            return self._citation(_obj(delta.get("citation")))
        index = data.get("index")
        opened = self._blocks.get(index) if isinstance(index, int) else None
        if opened is None:
            return []
        if kind == "input_json_delta":
            part = delta.get("partial_json")
            if not isinstance(part, str) or not part:
                return []
            opened.parts.append(part)
            self.produced_chars += len(part)
            if opened.kind != "function_call":
                return []  # a custom tool's input is sent whole when its block ends (it arrives as JSON)
            return [
                self._event(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": opened.item["id"],
                        "output_index": opened.output_index,
                        "delta": part,
                    }
                )
            ]
        if kind in ("thinking_delta", "signature_delta") and opened.kind == "reasoning":
            key = "thinking" if kind == "thinking_delta" else "signature"
            piece = delta.get(key)
            if not isinstance(piece, str):
                return []
            opened.block[key] = str(opened.block.get(key) or "") + piece
            if key == "thinking":
                self.produced_chars += len(piece)
                if self.summary:
                    return [
                        self._event(
                            {
                                "type": "response.reasoning_summary_text.delta",
                                "item_id": opened.item["id"],
                                "output_index": opened.output_index,
                                "summary_index": 0,
                                "delta": piece,
                            }
                        )
                    ]
        return []

    def _citation(self, citation: Mapping[str, Any]) -> list[Event]:
        opened = self._message
        if opened is None:
            return []
        length = sum(len(p) for p in opened.parts)
        annotation = _annotation(citation, length, length)
        if annotation is None:
            return []
        annotations = opened.block["annotations"]
        annotations.append(annotation)
        return [
            self._event(
                {
                    "type": "response.output_text.annotation.added",
                    "item_id": opened.item["id"],
                    "output_index": opened.output_index,
                    "content_index": 0,
                    "annotation_index": len(annotations) - 1,
                    "annotation": annotation,
                }
            )
        ]

    def _block_stop(self, data: Mapping[str, Any]) -> list[Event]:
        index = data.get("index")
        opened = self._blocks.pop(index, None) if isinstance(index, int) else None
        if opened is None:
            return []
        item = opened.item
        where = {"item_id": item["id"], "output_index": opened.output_index}
        events: list[Event] = []
        if opened.kind == "function_call":
            arguments = "".join(opened.parts) or "{}"
            item["arguments"] = arguments
            if not opened.parts:
                events.append(
                    self._event({"type": "response.function_call_arguments.delta", **where, "delta": arguments})
                )
            done = {
                "type": "response.function_call_arguments.done",
                **where,
                "name": item.get("name"),
                "arguments": arguments,
            }
            events.append(self._event(done))  # with the name, as OpenAI's API sends it
        elif opened.kind == "custom_tool_call":
            try:
                parsed = json.loads("".join(opened.parts) or "{}")
            except ValueError:
                parsed = {}
            raw = parsed.get(CUSTOM_INPUT) if isinstance(parsed, dict) else None
            text = item["input"] = raw if isinstance(raw, str) else ""
            events.append(self._event({"type": "response.custom_tool_call_input.delta", **where, "delta": text}))
            events.append(self._event({"type": "response.custom_tool_call_input.done", **where, "input": text}))
        elif opened.kind == "reasoning":
            full = _reasoning_item(item["id"], opened.block, self.summary, self.seal)
            item.update(full)
            if self.summary and opened.block.get("type") == "thinking":
                text = str(opened.block.get("thinking") or "")
                part = {"type": "summary_text", "text": text}
                events.append(
                    self._event(
                        {"type": "response.reasoning_summary_text.done", **where, "summary_index": 0, "text": text}
                    )
                )
                events.append(
                    self._event(
                        {"type": "response.reasoning_summary_part.done", **where, "summary_index": 0, "part": part}
                    )
                )
                item["summary"] = [part] if text else []
        elif opened.kind == "web_search_call":
            pieces = "".join(opened.parts)
            try:
                query = _obj(json.loads(pieces or "{}")).get("query")
            except ValueError:
                query = None
            item["action"] = {"type": "search", "query": query if isinstance(query, str) else ""}
            events.append(self._event({"type": "response.web_search_call.completed", **where}))
        events.append(self._done_item(opened))
        return events

    # -- the end -------------------------------------------------------------------------

    def final_response(self) -> dict[str, Any]:
        """The whole response (encrypted content included when sealed: strip it for the client).
        Its items are copies of their top level: the items are done, none changes again."""
        status, incomplete = _status_of(self.stop_reason)
        output = [dict(item) for item in self.output]
        response = dict(self.skeleton, status=status, incomplete_details=incomplete, output=output)
        response["usage"] = usage_to_responses(self.usage)
        return response

    def final_event(self, response: Mapping[str, Any] | None = None) -> Event:
        """``response.completed`` or ``response.incomplete`` with ``response`` (by default
        ``final_response()``) as the client sees it."""
        if response is None:
            response = self.final_response()
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return self._event({"type": kind, "response": client_view(response, self.include_encrypted)})

    def failed_events(self, error: Mapping[str, Any]) -> list[Event]:
        """``error`` then ``response.failed``: the stream failed after it started (not billed)."""
        response = dict(
            self.skeleton, status="failed", output=[client_item(i, self.include_encrypted) for i in self.output]
        )
        response["error"] = {"code": error.get("code") or "server_error", "message": error.get("message", "")}
        return [
            self._event(
                {
                    "type": "error",
                    "code": error.get("code"),
                    "message": error.get("message", ""),
                    "param": error.get("param"),
                }
            ),
            self._event({"type": "response.failed", "response": response}),
        ]
