"""The Responses dialect on the pipeline with fakes (docs/responses.md): the organisation-bound
step runs before admission, sealed reasoning is bound to the organisation, streams are billed
before their last event, failures after the start end with error then response.failed unbilled,
and a client that leaves pays an estimate."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ezat_compat.api.sse import relay
from ezat_compat.dialects.openai_responses import OpenAIResponses, ResponsesServices
from ezat_compat.domain import ResponsesSettings
from ezat_compat.errors import InvalidRequestError, UpstreamStreamError
from ezat_compat.pipeline import Reply
from ezat_compat.sealing import Sealer
from ezat_compat.session import StreamSession
from tests.support.pipeline import (
    AUTH,
    END,
    GATE,
    LOOKUP,
    START,
    TEXT,
    TOOL_REPLY,
    TOOL_STREAM,
    events,
    gateway,
)
from tests.support.pipeline import RESPONSES as DIALECT
from tests.support.pipeline import responses_request as request


def sse(chunks: list[bytes]) -> list[dict[str, Any]]:
    text = b"".join(chunks).decode()
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_json_reply_is_billed_with_the_responses_endpoint() -> None:
    gw, _, ledger = gateway(
        {"a": json.dumps(json.loads(TOOL_REPLY) | {"content": [{"type": "text", "text": "ok"}]}).encode()}
    )
    reply = gw.handle(DIALECT, request({"input": "hi"}))
    assert isinstance(reply, Reply)
    body = json.loads(reply.body)
    assert body["id"] == "resp_r1" and body["output"][0]["content"][0]["text"] == "ok"
    ((_, row),) = ledger.rows
    assert row.endpoint == "responses" and row.status == 200


def test_a_stream_is_billed_before_its_last_event() -> None:
    gw, _, ledger = gateway({"a": events(START, *TEXT, *END)})
    session = gw.handle(DIALECT, request({"input": "hi", "stream": True}))
    assert isinstance(session, StreamSession)
    out = []
    for chunk in relay(session):
        if b"response.completed" in chunk:
            assert len(ledger.rows) == 1  # the usage is recorded before the final event is sent
        out.append(chunk)
    payloads = sse(out)
    assert payloads[-1]["type"] == "response.completed"
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))


def test_a_lone_surrogate_from_upstream_is_escaped_and_the_stream_completes() -> None:
    odd = (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a\ud800b"}},
    )
    gw, _, ledger = gateway({"a": events(START, TEXT[0], odd, *END)})
    session = gw.handle(DIALECT, request({"input": "hi", "stream": True}))
    assert isinstance(session, StreamSession)
    text = b"".join(relay(session))
    assert b'"delta":"a\\ud800b"' in text  # JSON's escape, as chat writes it
    payloads = sse([text])
    assert payloads[-1]["type"] == "response.completed"
    assert payloads[-1]["response"]["output"][0]["content"][0]["text"] == "a\ud800b"
    ((_, row),) = ledger.rows
    assert row.status == 200


def test_a_small_float_of_the_request_is_echoed_as_json_writes_it() -> None:
    gw, _, _ = gateway({"a": events(START, *TEXT, *END)})
    session = gw.handle(DIALECT, request({"input": "hi", "stream": True, "top_p": 1e-05, "metadata": {"t": "e-5"}}))
    assert isinstance(session, StreamSession)
    text = b"".join(relay(session))
    assert text.count(b'"top_p":1e-05,') == 3  # created, in_progress, completed (orjson would write 0.00001)


@pytest.mark.parametrize(
    "tail",
    [
        [UpstreamStreamError("cut")],
        events(("error", {"type": "error", "error": {"type": "overloaded_error", "message": "x"}})),
    ],
    ids=["cut", "error-event"],
)
def test_a_failure_after_the_start_ends_with_error_then_failed_unbilled(tail: list[Any]) -> None:
    script = [*events(START, *TEXT), *tail]
    gw, _, ledger = gateway({"a": script, "b": script, "c": script})
    session = gw.handle(DIALECT, request({"input": "hi", "stream": True}))
    assert isinstance(session, StreamSession)
    payloads = sse(list(relay(session)))
    assert [p["type"] for p in payloads[-2:]] == ["error", "response.failed"]
    ((_, row),) = ledger.rows
    assert row.cost_micros == 0 and row.status >= 500


def test_a_client_that_leaves_pays_an_estimate() -> None:
    gw, _, ledger = gateway({"a": [*events(START, *TEXT), GATE, *events(*END)]})
    session = gw.handle(DIALECT, request({"input": "hi", "stream": True}))
    assert isinstance(session, StreamSession)
    writer = relay(session)
    next(writer)  # the first event and the text that came with it
    writer.close()  # the client went away
    ((_, row),) = ledger.rows
    assert row.status == 499 and row.estimated and row.cost_micros > 0


def _sealed_round(org: int) -> list[dict[str, Any]]:
    """The items a stateless client sends back after a tool round sealed for ``org``."""
    gw, _, _ = gateway({"a": TOOL_STREAM})
    gw.accounts.authenticate = lambda *_: dataclasses.replace(AUTH, org_id=org)  # type: ignore[method-assign]
    body = {
        "input": "look x up",
        "tools": [LOOKUP],
        "reasoning": {"effort": "high"},
        "include": ["reasoning.encrypted_content"],
        "stream": True,
    }
    session = gw.handle(DIALECT, request(body))
    assert isinstance(session, StreamSession)
    final = sse(list(relay(session)))[-1]["response"]
    call = next(item for item in final["output"] if item["type"] == "function_call")
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "found"}
    return [{"role": "user", "content": "look x up"}, *final["output"], output]


def test_sealed_thinking_comes_back_exactly_for_the_same_organisation() -> None:
    items = _sealed_round(AUTH.org_id)
    gw, upstream, _ = gateway({"a": TOOL_REPLY})
    gw.handle(DIALECT, request({"input": items, "tools": [LOOKUP], "reasoning": {"effort": "high"}}))
    sent = json.loads(upstream.calls[-1][1])
    assistant = next(m for m in sent["messages"] if m["role"] == "assistant")
    assert "thinking" in sent
    assert assistant["content"][0] == {"type": "thinking", "thinking": "Let me look it up.", "signature": "c2lnbmVk"}


def test_sealed_thinking_of_another_organisation_is_refused_before_admission() -> None:
    items = _sealed_round(AUTH.org_id + 1)
    gw, upstream, ledger = gateway({"a": TOOL_REPLY})
    with pytest.raises(InvalidRequestError) as caught:
        gw.handle(DIALECT, request({"input": items, "tools": [LOOKUP], "reasoning": {"effort": "high"}}))
    assert caught.value.param == "input[1].encrypted_content"
    assert upstream.calls == [] and ledger.rows == []


def _dialect(sealer: Sealer) -> OpenAIResponses:
    return OpenAIResponses(ResponsesServices(ResponsesSettings(store=False), None, sealer, lambda: 1000.0))


def test_after_a_key_rotation_the_old_key_still_opens() -> None:
    items = _sealed_round(AUTH.org_id)  # sealed by SEALER (key A)
    rotated = Sealer(bytes(range(1, 33)), old=[bytes(range(32))])  # B seals, A still opens
    gw, upstream, _ = gateway({"a": TOOL_REPLY})
    reply = gw.handle(_dialect(rotated), request({"input": items, "tools": [LOOKUP], "reasoning": {"effort": "high"}}))
    assert isinstance(reply, Reply) and reply.status == 200
    sent = json.loads(upstream.calls[-1][1])
    assert "thinking" in sent
    assistant = next(m for m in sent["messages"] if m["role"] == "assistant")
    assert assistant["content"][0]["type"] == "thinking"


def test_a_key_no_longer_held_drops_the_thinking_and_the_request_goes_on() -> None:
    items = _sealed_round(AUTH.org_id)  # sealed by key A
    gw, upstream, ledger = gateway({"a": TOOL_REPLY})
    reply = gw.handle(
        _dialect(Sealer(bytes(range(2, 34)))),  # key C, without A
        request({"input": items, "tools": [LOOKUP], "reasoning": {"effort": "high"}}),
    )
    assert isinstance(reply, Reply) and reply.status == 200
    sent = json.loads(upstream.calls[-1][1])
    assert "thinking" not in sent  # the last tool turn lost its thinking: the request goes without
    assert all(b["type"] != "thinking" for m in sent["messages"] for b in m["content"] if isinstance(b, dict))
    ((_, row),) = ledger.rows
    assert row.status == 200


def test_previous_response_id_with_storage_off_is_400() -> None:
    gw, upstream, _ = gateway({"a": TOOL_REPLY})
    with pytest.raises(InvalidRequestError) as caught:
        gw.handle(DIALECT, request({"input": "hi", "previous_response_id": "resp_1"}))
    assert caught.value.param == "previous_response_id" and "switched off" in caught.value.message
    assert upstream.calls == []
