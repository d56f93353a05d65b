"""Native ``/v1/messages`` replies name the model as the client sent it, JSON and streams.

Claude Code drops the thinking blocks of a reply whose ``model`` is not the one it asked for
(their signatures belong to another model); with an alias (``claude-opus-5.5`` for the
deployment's ``claude-opus-5-5``) its next tool-loop request then lacked them and the upstream
refused it (``Expected `thinking` or `redacted_thinking`, but found `tool_use```).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.dialects import Parsed, ReplyIds
from ezat_compat.dialects.anthropic_messages import AnthropicMessages, EventMeter

CATALOG = Catalog(
    parse_config(
        {
            "models": [
                {
                    "id": "anthropic/claude-opus-5-5",
                    "aliases": ["claude-opus-5-5", "claude-opus-5.5", "claude-opus-*"],
                    "price": {"input": 5, "output": 25},
                    "deployments": [{"name": "d", "base_url": "http://h", "upstream_model": "claude-opus-5-5"}],
                }
            ]
        }
    ).models
)
IDS = ReplyIds("msg_x", 0)
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-opus-5-5",
    "content": [{"type": "text", "text": "héllo"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}


def parsed(name: str, stream: bool = False) -> Parsed:
    body: dict[str, Any] = {"model": name, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    return AnthropicMessages().parse(body, {}, lambda n: CATALOG.resolve(n) or pytest.fail(n))


@pytest.mark.parametrize("name", ["claude-opus-5.5", "Claude-Opus-5-5", "claude-opus-4-8", "anthropic/claude-opus-5-5"])
def test_a_json_reply_names_the_model_as_sent_and_keeps_the_rest(name: str) -> None:
    answer = AnthropicMessages().reply(parsed(name), json.dumps(MESSAGE).encode(), IDS)
    assert json.loads(answer.body) == {**MESSAGE, "model": name}
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (3, 2)


def test_a_reply_already_naming_the_model_as_sent_passes_byte_for_byte() -> None:
    data = json.dumps(MESSAGE, indent=1).encode()  # any formatting: untouched
    assert AnthropicMessages().reply(parsed("claude-opus-5-5"), data, IDS).body == data


def test_message_start_names_the_model_as_sent_and_other_events_pass_as_they_came() -> None:
    meter = AnthropicMessages().translator(parsed("claude-opus-4-8", stream=True), IDS)
    start = {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}}
    out = meter.feed("message_start", json.dumps(start))
    assert out.startswith(b"event: message_start\ndata: ") and out.endswith(b"\n\n")
    sent = json.loads(out.split(b"data: ", 1)[1])
    assert sent == {**start, "message": {**start["message"], "model": "claude-opus-4-8"}}
    assert meter.usage.input_tokens == 3
    delta = json.dumps({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}})
    assert meter.feed("content_block_delta", delta) == b"event: content_block_delta\ndata: " + delta.encode() + b"\n\n"


def test_message_start_already_naming_the_model_passes_as_it_came() -> None:
    start = json.dumps({"type": "message_start", "message": {**MESSAGE, "content": []}}, separators=(", ", ": "))
    assert EventMeter("claude-opus-5-5").feed("message_start", start) == (
        b"event: message_start\ndata: " + start.encode() + b"\n\n"
    )
