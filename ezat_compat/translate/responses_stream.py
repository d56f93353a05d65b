"""Anthropic stream events -> OpenAI Responses events (docs/responses.md, "Streaming").

``ResponseEvents`` turns the upstream's events, one at a time, into Responses events
(``response.created`` … ``response.completed``), each with its ``sequence_number``; the items
it streams are those of ``translate/responses_response.py``, so a stream's final response
equals the JSON translation of the same reply. Pure: ids and the seal are parameters.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ezat_compat.domain import Usage
from ezat_compat.translate.response import merge_usage
from ezat_compat.translate.responses_response import (
    REFUSAL,
    THINKING_TYPES,
    ItemIds,
    Seal,
    call_item,
    client_item,
    client_view,
    obj,
    reasoning_item,
    refusal_item,
    refusal_part,
    refusal_text,
    search_item,
    status_of,
    url_annotation,
    usage_to_responses,
)
from ezat_compat.translate.responses_tools import CUSTOM_INPUT, ClientTool


@dataclass(slots=True)
class _Open:
    """An output item being streamed: its index in ``output``, the item, and its pieces."""

    output_index: int
    item: dict[str, Any]
    kind: str  # message | reasoning | function_call | custom_tool_call | tool_search_call | web_search_call
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
        self.stop_details: Any = None  # with a refusal: its category and explanation
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
        data = obj(data)
        if event == "content_block_delta":
            return self._delta(data)
        if event == "content_block_start":
            return self._block_start(data)
        if event == "content_block_stop":
            return self._block_stop(data)
        if event == "message_start":
            self.usage = merge_usage(self.usage, obj(obj(data.get("message")).get("usage")))
            return self._start()
        if event == "message_delta":
            stop_reason = obj(data.get("delta")).get("stop_reason")
            if isinstance(stop_reason, str):
                self.stop_reason = stop_reason
                self.stop_details = obj(data.get("delta")).get("stop_details")
            self.usage = merge_usage(self.usage, obj(data.get("usage")))
            return []
        if event == "message_stop":
            events = self._start()
            for index in list(self._blocks):
                events.extend(self._block_stop({"index": index}))
            if self.stop_reason == REFUSAL:
                events.extend(self._refuse())
            else:
                events.extend(self._close_message())
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

    def _refuse(self) -> list[Event]:
        """The reply stopped with a refusal (known only now): the open message's part becomes a
        ``refusal`` part (its text already streamed as ``output_text`` deltas, restated), or a
        new message carries it. Events as OpenAI's API sends a refusal: content_part.added,
        refusal.delta, refusal.done, content_part.done (``ResponseRefusalDeltaEvent`` …)."""
        events: list[Event] = []
        opened = self._message
        self._message = None
        text = "".join(opened.parts) if opened is not None else ""
        refusal = refusal_text(self.stop_details, text)
        if opened is None:
            item = refusal_item(self.ids.next("msg"), refusal)
            item.update(status="in_progress", content=[])
            opened, added = self._add(item, "message")
            events.append(added)
        opened.item["content"] = [refusal_part(refusal)]
        where = {"item_id": opened.item["id"], "output_index": opened.output_index, "content_index": 0}
        return [
            *events,
            self._event({"type": "response.content_part.added", **where, "part": refusal_part("")}),
            self._event({"type": "response.refusal.delta", **where, "delta": refusal}),
            self._event({"type": "response.refusal.done", **where, "refusal": refusal}),
            self._event({"type": "response.content_part.done", **where, "part": refusal_part(refusal)}),
            self._done_item(opened),
        ]

    def _block_start(self, data: Mapping[str, Any]) -> list[Event]:
        index = data.get("index")
        block = obj(data.get("content_block"))
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
            full = call_item(self.ids, {**block, "input": {}}, self.tools)
            full["status"] = "in_progress"
            if full["type"] == "custom_tool_call":
                full["input"] = ""
            elif full["type"] == "function_call":
                full["arguments"] = ""
            opened, added = self._add(full, full["type"])
            self._blocks[index] = opened
            events.append(added)
        elif kind == "server_tool_use" and block.get("name") == "web_search":
            item = search_item(self.ids.next("ws"), {})
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
        delta = obj(data.get("delta"))
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            return self._text(text) if isinstance(text, str) and text else []
        if kind == "citations_delta":
            return self._citation(obj(delta.get("citation")))
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
        annotation = url_annotation(citation, length, length)
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
        elif opened.kind == "tool_search_call":  # its arguments, an object, whole when its block ends
            try:
                item["arguments"] = dict(obj(json.loads("".join(opened.parts) or "{}")))
            except ValueError:
                item["arguments"] = {}
        elif opened.kind == "reasoning":
            full = reasoning_item(item["id"], opened.block, self.summary, self.seal)
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
                query = obj(json.loads(pieces or "{}")).get("query")
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
        status, incomplete = status_of(self.stop_reason)
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
