"""Anthropic stream events -> OpenAI ``chat.completion.chunk`` objects, one event at a time.

Chat Completions reference, "Streaming", and API reference, "Response Body":

1. the first chunk (on ``message_start``) has ``delta: {"role": "assistant", "content": ""}``;
2. text arrives as ``delta.content``; a ``tool_use`` block becomes ``delta.tool_calls``: first
   the ``id`` and ``function.name`` (arguments ``""``), then ``function.arguments`` in pieces,
   sent as they arrive. A call with no arguments (Anthropic streams one ``partial_json: ""``)
   gets ``"{}"`` when its block stops, so the arguments are always JSON, as without streaming;
3. thinking is never returned (its tokens show in ``reasoning_tokens``);
4. the last choice chunk has an empty ``delta`` and the ``finish_reason``; it is sent when
   ``message_stop`` arrives, so nothing can follow it;
5. with ``include_usage`` one more chunk, ``"choices": []`` plus ``usage``, follows: the caller
   sends it (``usage_chunk()``) after it has recorded the usage, then ``DONE``.

The translator is a small state object (a few ints and a dict of open tool blocks): it never
keeps the reply, so memory per stream stays constant. It never raises on odd upstream data:
missing or mistyped fields count as empty, unknown events and blocks produce nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ezat_compat.domain import Usage
from ezat_compat.translate.ids import decode_tool_id
from ezat_compat.translate.response import merge_usage, tool_arguments, usage_to_openai
from ezat_compat.translate.tables import finish_reason as to_finish_reason

_EMPTY: Mapping[str, Any] = MappingProxyType({})

DONE: bytes = b"data: [DONE]\n\n"

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False)


def _obj(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one (odd upstream data counts as empty)."""
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _index(data: Mapping[str, Any]) -> int | None:
    """The Anthropic content-block ``index`` of an event (None when missing or not an int)."""
    index = data.get("index")
    return index if isinstance(index, int) else None


class StreamTranslator:
    """Anthropic stream events -> OpenAI chunks, one event at a time; state in this small object.

    Call ``feed(event, data)`` for every upstream event (``data`` is the parsed JSON) and send
    the chunks it returns, in order. Then read the outcome:

    - ``done``: ``message_stop`` arrived; the last choice chunk has been returned. Record
      ``usage``, send ``usage_chunk()`` if the client asked for ``include_usage``, then ``DONE``.
    - ``error``: the upstream sent an ``error`` event (its ``error`` object). Send an error line
      (``encode_error``) and ``DONE``, no usage chunk; every later event is ignored.
    - neither: the upstream stream was cut; treat it as an error.

    ``finish_reason`` is set from ``message_delta``'s ``stop_reason`` (and is ``"stop"`` at
    ``message_stop`` if none came); ``usage`` merges ``message_start`` and ``message_delta``.

    ``produced_chars`` (text plus tool-call arguments, thinking excluded) and ``thinking_chars``
    let the caller estimate output tokens when the client leaves early.
    """

    __slots__ = (
        "_base",
        "_open_tools",
        "_tool_count",
        "_tools_without_arguments",
        "completion_id",
        "created",
        "done",
        "error",
        "finish_reason",
        "include_usage",
        "model",
        "produced_chars",
        "started",
        "thinking_chars",
        "usage",
    )

    def __init__(self, *, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self.include_usage = include_usage
        self.usage: Usage = Usage()
        self.finish_reason: str | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.started = False
        self.produced_chars = 0
        self.thinking_chars = 0  # thinking is billed as output too: counted for early-close estimates
        # Anthropic block index -> OpenAI tool_calls index, for tool_use blocks still open.
        self._open_tools: dict[int | None, int] = {}
        # Block indexes of open tool_use blocks that have sent no arguments yet.
        self._tools_without_arguments: set[int | None] = set()
        self._tool_count = 0
        self._base: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }

    # -- chunk builders -------------------------------------------------------------------

    def _chunk(self, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        chunk = self._base.copy()
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        if self.include_usage:  # as OpenAI: "usage": null on every chunk but the usage chunk
            chunk["usage"] = None
        return chunk

    def _opening(self) -> list[dict[str, Any]]:
        """The role chunk if it hasn't been sent yet (normally on ``message_start``), else nothing."""
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def usage_chunk(self) -> dict[str, Any]:
        """The ``"choices": []`` chunk with ``usage`` (same fields as the non-streaming block).

        Send it only when the client set ``stream_options.include_usage``, after ``done``
        and after the usage has been recorded, just before ``DONE``.
        """
        return {**self._base, "choices": [], "usage": usage_to_openai(self.usage)}

    # -- events ---------------------------------------------------------------------------

    def feed(self, event: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Translate one upstream event; returns the chunks to send now (often none).

        ``event`` is the SSE event type; ``data`` its parsed JSON (its ``type`` is not read,
        so ``event`` decides). After ``message_stop`` or an ``error`` event, returns nothing.
        """
        if self.done or self.error is not None:
            return []
        if type(data) is not dict and not isinstance(data, Mapping):
            data = _EMPTY
        if event == "content_block_delta":
            return self._block_delta(data)
        if event == "content_block_start":
            return self._block_start(data)
        if event == "content_block_stop":
            return self._block_stop(_index(data))
        if event == "message_start":
            message = _obj(data.get("message"))
            self.usage = merge_usage(self.usage, _obj(message.get("usage")))
            return self._opening()
        if event == "message_delta":
            stop_reason = _obj(data.get("delta")).get("stop_reason")
            if isinstance(stop_reason, str):
                self.finish_reason = to_finish_reason(stop_reason)
            self.usage = merge_usage(self.usage, _obj(data.get("usage")))
            return []
        if event == "message_stop":
            self.done = True
            if self.finish_reason is None:  # no stop_reason came: Anthropic's default, end_turn
                self.finish_reason = to_finish_reason(None)
            chunks = self._opening()
            for index in list(self._open_tools):  # blocks the upstream never stopped
                chunks.extend(self._block_stop(index))
            chunks.append(self._chunk({}, self.finish_reason))
            return chunks
        if event == "error":
            error = data.get("error")
            if isinstance(error, Mapping):
                self.error = dict(error)
            else:
                self.error = {"type": "api_error", "message": "The upstream stream failed."}
            return []
        return []  # ping, and event types added after this was written

    def _text(self, text: Any) -> list[dict[str, Any]]:
        """``delta.content`` chunks for a piece of text (none for empty text)."""
        if not text or (type(text) is not str and not isinstance(text, str)):
            return []
        self.produced_chars += len(text)
        chunks = self._opening()
        chunks.append(self._chunk({"content": text}))
        return chunks

    def _block_delta(self, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        delta = _obj(data.get("delta"))
        kind = delta.get("type")
        if kind == "text_delta":
            return self._text(delta.get("text"))
        if kind == "input_json_delta":
            tool_index = self._open_tools.get(_index(data))
            part = delta.get("partial_json")
            if tool_index is None or not part or not isinstance(part, str):
                return []
            self._tools_without_arguments.discard(_index(data))
            return self._arguments(tool_index, part)
        if kind == "thinking_delta":
            thinking = delta.get("thinking")
            if isinstance(thinking, str):
                self.thinking_chars += len(thinking)
        return []  # thinking_delta, signature_delta, citations_delta, unknown: nothing is sent

    def _arguments(self, tool_index: int, part: str) -> list[dict[str, Any]]:
        """A ``function.arguments`` piece for the OpenAI tool call ``tool_index``."""
        self.produced_chars += len(part)
        chunks = self._opening()
        chunks.append(self._chunk({"tool_calls": [{"index": tool_index, "function": {"arguments": part}}]}))
        return chunks

    def _block_stop(self, index: int | None) -> list[dict[str, Any]]:
        """A tool block that ends having sent no arguments sends ``"{}"``: arguments are JSON."""
        tool_index = self._open_tools.pop(index, None)
        if tool_index is None or index not in self._tools_without_arguments:
            return []
        self._tools_without_arguments.discard(index)
        return self._arguments(tool_index, "{}")

    def _block_start(self, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        block = _obj(data.get("content_block"))
        kind = block.get("type")
        if kind == "text":
            # Anthropic starts text blocks empty; a server that doesn't still gets its text sent.
            return self._text(block.get("text"))
        if kind == "tool_use":
            tool_index = self._tool_count
            self._tool_count += 1
            self._open_tools[_index(data)] = tool_index
            # Anthropic starts with input {} and streams it; a full input given up front is sent whole.
            tool_input = block.get("input")
            arguments = tool_arguments(tool_input) if tool_input and isinstance(tool_input, Mapping) else ""
            if not arguments:
                self._tools_without_arguments.add(_index(data))
            self.produced_chars += len(arguments)
            call = {
                "index": tool_index,
                "id": decode_tool_id(_str(block.get("id"))),
                "type": "function",
                "function": {"name": _str(block.get("name")), "arguments": arguments},
            }
            chunks = self._opening()
            chunks.append(self._chunk({"tool_calls": [call]}))
            return chunks
        return []  # thinking, redacted_thinking, server tools and their results, unknown


def encode_chunk(chunk: Mapping[str, Any]) -> bytes:
    """One SSE line, ``data: {json}\\n\\n``: compact JSON, UTF-8, non-ASCII kept as is."""
    try:
        return f"data: {_ENCODER.encode(chunk)}\n\n".encode()
    except UnicodeEncodeError:  # a lone surrogate from upstream JSON: escape it instead
        return f"data: {_ASCII_ENCODER.encode(chunk)}\n\n".encode()


def encode_error(payload: Mapping[str, Any]) -> bytes:
    """The ``data: {"error": …}`` line of a stream that failed after it started.

    ``payload`` is the envelope ``errors.openai_error_event()`` returns, or the bare error
    object (``{"message", "type", "param", "code"}``), which is wrapped. Send ``DONE`` after it.
    """
    if len(payload) == 1 and "error" in payload:
        return encode_chunk(payload)
    return encode_chunk({"error": payload})
