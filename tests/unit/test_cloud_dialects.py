"""The clouds' inbound dialects, pure parts: AWS event-stream framing (round-tripped through
botocore's ``EventStreamBuffer``, fed split at every byte boundary), the model-id mapping, the
body's ``anthropic_version``/``anthropic_beta``, CountTokens' body, the stream translator's
framing and each cloud's error envelope — tables, one row per rule."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer

from ezat_compat.api.clouds import error_dialect
from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.dialects.bedrock_invoke import (
    BedrockCountTokens,
    BedrockEvents,
    BedrockInvoke,
    bedrock_status,
    render_bedrock,
)
from ezat_compat.dialects.vertex_predict import VertexCountTokens, VertexRawPredict, render_google
from ezat_compat.domain import Model
from ezat_compat.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    UpstreamAnswer,
)
from ezat_compat.translate.cloud_models import bedrock_model_names, vertex_model_names
from ezat_compat.translate.eventstream import chunk_message, encode_message, exception_message

CATALOG = Catalog(
    parse_config(
        {
            "models": [
                {
                    "id": "anthropic/claude-sonnet-5-5",
                    "aliases": ["claude-sonnet-5-5"],
                    "max_output_tokens": 64000,
                    "price": {"input": 3, "output": 15},
                    "deployments": [{"name": "d", "base_url": "http://h", "upstream_model": "claude-sonnet-5-5"}],
                }
            ]
        }
    ).models
)
MESSAGES = [{"role": "user", "content": "hi"}]


def resolve(name: Any) -> Model:
    model = CATALOG.resolve(name) if isinstance(name, str) else None
    if model is None:
        raise ModelNotFoundError(str(name))
    return model


def _decoded(raw: bytes, step: int | None = None) -> list[Any]:
    buffer = EventStreamBuffer()
    out = []
    for start in range(0, len(raw), step or len(raw)):
        buffer.add_data(raw[start : start + (step or len(raw))])
        out += list(buffer)
    return out


# ---------------------------------------------------------------- framing


FRAMES = [
    pytest.param({":event-type": "chunk"}, b"{}", id="one header"),
    pytest.param({}, b"", id="no headers, no payload"),
    pytest.param({"a": "é" * 40, "b": ""}, "naïve ✓".encode() * 100, id="UTF-8 and an empty value"),
]


@pytest.mark.parametrize(("headers", "payload"), FRAMES)
def test_event_stream_messages_round_trip_through_botocore(headers: dict[str, str], payload: bytes) -> None:
    raw = encode_message(headers, payload) * 2
    for step in range(1, len(raw) + 1):  # every split of the bytes decodes to the same two messages
        messages = _decoded(raw, step)
        assert [(m.headers, m.payload) for m in messages] == [(headers, payload)] * 2, step


def test_a_chunk_carries_the_events_json_as_base64_bytes() -> None:
    event = json.dumps({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "é"}}).encode()
    (message,) = _decoded(chunk_message(event))
    assert message.headers == {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    assert base64.b64decode(json.loads(message.payload)["bytes"]) == event


def test_an_exception_names_its_type_and_carries_its_message() -> None:
    (message,) = _decoded(exception_message("throttlingException", "Too many requests"))
    assert message.headers[":message-type"] == "exception"
    assert message.headers[":exception-type"] == "throttlingException"
    assert json.loads(message.payload) == {"message": "Too many requests"}


# ---------------------------------------------------------------- model ids


@pytest.mark.parametrize(
    ("model_id", "names"),
    [
        pytest.param(
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            [
                "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
                "anthropic.claude-sonnet-4-5-20250929-v1:0",
                "claude-sonnet-4-5-20250929-v1:0",
                "claude-sonnet-4-5-20250929",
                "claude-sonnet-4-5",
            ],
            id="inference profile",
        ),
        pytest.param(
            "anthropic.claude-3-5-haiku-20241022-v1:0",
            [
                "anthropic.claude-3-5-haiku-20241022-v1:0",
                "claude-3-5-haiku-20241022-v1:0",
                "claude-3-5-haiku-20241022",
                "claude-3-5-haiku",
            ],
            id="foundation model",
        ),
        pytest.param(
            "global.anthropic.claude-opus-4-6-v1",
            [
                "global.anthropic.claude-opus-4-6-v1",
                "anthropic.claude-opus-4-6-v1",
                "claude-opus-4-6-v1",
                "claude-opus-4-6",
            ],
            id="global profile, no date",
        ),
        pytest.param(
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.anthropic.claude-sonnet-5-5-v1:0",
            [
                "arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.anthropic.claude-sonnet-5-5-v1:0",
                "eu.anthropic.claude-sonnet-5-5-v1:0",
                "anthropic.claude-sonnet-5-5-v1:0",
                "claude-sonnet-5-5-v1:0",
                "claude-sonnet-5-5",
            ],
            id="ARN",
        ),
        pytest.param("claude-sonnet-5-5", ["claude-sonnet-5-5"], id="our own name"),
    ],
)
def test_bedrock_model_names(model_id: str, names: list[str]) -> None:
    assert bedrock_model_names(model_id) == names


@pytest.mark.parametrize(
    ("model", "names"),
    [
        pytest.param(
            "claude-sonnet-4-5@20250929",
            ["claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929", "claude-sonnet-4-5"],
            id="versioned",
        ),
        pytest.param("claude-sonnet-5-5", ["claude-sonnet-5-5"], id="plain"),
        pytest.param("claude-3-5-haiku-20241022", ["claude-3-5-haiku-20241022", "claude-3-5-haiku"], id="dated"),
    ],
)
def test_vertex_model_names(model: str, names: list[str]) -> None:
    assert vertex_model_names(model) == names


# ---------------------------------------------------------------- parsing


def test_bedrock_body_becomes_the_native_body() -> None:
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["interleaved-thinking-2025-05-14", "claude-code-20250219"],
        "max_tokens": 10,
        "messages": MESSAGES,
    }
    headers = {"anthropic-beta": "claude-code-20250219"}
    parsed = BedrockInvoke("us.anthropic.claude-sonnet-5-5-v1:0", stream=True).parse(body, headers, resolve)
    assert parsed.model.id == "anthropic/claude-sonnet-5-5"
    assert parsed.model_name == "us.anthropic.claude-sonnet-5-5-v1:0" and parsed.stream
    assert parsed.body == {"max_tokens": 10, "messages": MESSAGES}
    assert parsed.headers == {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}


def test_bedrock_count_tokens_counts_the_invoke_body() -> None:
    invoke = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 10, "messages": MESSAGES}
    body = {"input": {"invokeModel": {"body": base64.b64encode(json.dumps(invoke).encode()).decode()}}}
    parsed = BedrockCountTokens("anthropic.claude-sonnet-5-5-v1:0").parse(body, {}, resolve)
    assert parsed.path == "/v1/messages/count_tokens" and not parsed.billed and not parsed.stream
    assert parsed.body == {"messages": MESSAGES}
    reply = BedrockCountTokens("m").reply(parsed, b'{"input_tokens": 12}', None)  # type: ignore[arg-type]
    assert json.loads(reply.body) == {"inputTokens": 12} and reply.usage is None


def _vertex_body(**extra: Any) -> dict[str, Any]:
    return {"anthropic_version": "vertex-2023-10-16", "max_tokens": 10, "messages": MESSAGES, **extra}


def test_vertex_body_becomes_the_native_body() -> None:
    parsed = VertexRawPredict("projects/p/locations/l", "claude-sonnet-5-5@20260101", stream=True).parse(
        _vertex_body(stream=True), {"anthropic-beta": "a-1, b-2"}, resolve
    )
    assert parsed.model_name == "claude-sonnet-5-5@20260101" and parsed.stream
    assert parsed.body == {"max_tokens": 10, "messages": MESSAGES}
    assert parsed.headers == {"anthropic-beta": "a-1,b-2"}


def test_vertex_count_tokens_takes_the_bodys_model() -> None:
    body = {"anthropic_version": "vertex-2023-10-16", "model": "claude-sonnet-5-5@20260101", "messages": MESSAGES}
    parsed = VertexCountTokens("projects/p/locations/l").parse(body, {}, resolve)
    assert parsed.model.id == "anthropic/claude-sonnet-5-5" and not parsed.billed
    assert parsed.body == {"messages": MESSAGES}


def _bedrock(body: Any) -> Any:
    return BedrockInvoke("us.anthropic.claude-sonnet-5-5-v1:0").parse(body, {}, resolve)


def _b64(value: Any) -> str:
    return base64.b64encode(value if isinstance(value, bytes) else json.dumps(value).encode()).decode()


REFUSED = [
    pytest.param(
        lambda: _bedrock({"max_tokens": 10, "messages": MESSAGES}), "anthropic_version", id="bedrock: no version"
    ),
    pytest.param(
        lambda: _bedrock({"anthropic_version": "vertex-2023-10-16", "max_tokens": 1, "messages": MESSAGES}),
        "anthropic_version",
        id="bedrock: another cloud's version",
    ),
    pytest.param(
        lambda: _bedrock({"anthropic_version": 1, "max_tokens": 1, "messages": MESSAGES}),
        "anthropic_version",
        id="bedrock: version not a string",
    ),
    pytest.param(
        lambda: _bedrock({"anthropic_version": "bedrock-2023-05-31", "anthropic_beta": [1], "messages": MESSAGES}),
        "anthropic_beta",
        id="bedrock: betas not strings",
    ),
    pytest.param(lambda: _bedrock([]), "JSON object", id="bedrock: body not an object"),
    pytest.param(
        lambda: BedrockInvoke("us.anthropic.claude-none-v1:0").parse(
            {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 1, "messages": MESSAGES}, {}, resolve
        ),
        "The provided model identifier is invalid.",
        id="bedrock: unknown model",
    ),
    pytest.param(
        lambda: BedrockCountTokens("m").parse({"input": {"converse": {}}}, {}, resolve),
        "input.converse",
        id="count: converse",
    ),
    pytest.param(
        lambda: BedrockCountTokens("m").parse({"input": {"invokeModel": {"body": "%%%"}}}, {}, resolve),
        "input.invokeModel.body",
        id="count: not base64",
    ),
    pytest.param(
        lambda: BedrockCountTokens("m").parse({"input": {"invokeModel": {"body": _b64([1])}}}, {}, resolve),
        "input.invokeModel.body",
        id="count: not an object",
    ),
    pytest.param(lambda: BedrockCountTokens("m").parse({}, {}, resolve), "input.invokeModel.body", id="count: none"),
    pytest.param(
        lambda: VertexRawPredict("r", "claude-sonnet-5-5").parse({"max_tokens": 1, "messages": MESSAGES}, {}, resolve),
        "anthropic_version",
        id="vertex: no version",
    ),
    pytest.param(
        lambda: VertexRawPredict("projects/p/locations/l", "claude-none@1").parse(_vertex_body(), {}, resolve),
        "Publisher Model `projects/p/locations/l/publishers/anthropic/models/claude-none@1` not found.",
        id="vertex: unknown model",
    ),
    pytest.param(
        lambda: VertexCountTokens("r").parse({"messages": MESSAGES}, {}, resolve), "model", id="vertex count: no model"
    ),
]


@pytest.mark.parametrize(("call", "words"), REFUSED)
def test_bad_input_is_a_4xx_naming_it(call: Any, words: str) -> None:
    with pytest.raises(GatewayError) as caught:
        call()
    assert 400 <= caught.value.status < 500 and words in caught.value.message


def test_an_api_version_date_is_taken_as_the_version() -> None:
    """The ``anthropic`` SDK 2.x's ``AnthropicVertex`` puts its API version in the body."""
    parsed = VertexRawPredict("r", "claude-sonnet-5-5").parse(_vertex_body(anthropic_version="2026-10-21"), {}, resolve)
    assert "anthropic_version" not in parsed.body


# ---------------------------------------------------------------- streams


def _chunks(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(base64.b64decode(json.loads(m.payload)["bytes"])) for m in _decoded(raw)]


def test_bedrock_events_are_chunks_with_the_model_as_sent() -> None:
    meter = BedrockEvents("us.anthropic.claude-sonnet-5-5-v1:0")
    start = {"type": "message_start", "message": {"model": "claude-sonnet-5-5", "usage": {"input_tokens": 3}}}
    out = meter.feed("message_start", json.dumps(start))
    out += meter.feed("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"text":"hé"}}')
    out += meter.feed("message_stop", '{"type":"message_stop"}')
    events = _chunks(out)
    assert [e["type"] for e in events] == ["message_start", "content_block_delta", "message_stop"]
    assert events[0]["message"]["model"] == "us.anthropic.claude-sonnet-5-5-v1:0"
    assert events[1]["delta"]["text"] == "hé"
    assert meter.done and meter.usage.input_tokens == 3
    assert _chunks(BedrockInvoke("m").ping) == [{"type": "ping"}]


@pytest.mark.parametrize(
    ("error_type", "exception"),
    [
        ("overloaded_error", "serviceUnavailableException"),
        ("rate_limit_error", "throttlingException"),
        ("api_error", "internalServerException"),
        ("something_new", "modelStreamErrorException"),
    ],
)
def test_an_upstream_error_event_ends_the_stream_as_bedrocks_exception(error_type: str, exception: str) -> None:
    meter = BedrockEvents("m")
    out = meter.feed("error", json.dumps({"type": "error", "error": {"type": error_type, "message": "busy"}}))
    (message,) = _decoded(out)
    assert message.headers[":exception-type"] == exception
    assert json.loads(message.payload) == {"message": "busy"}
    assert meter.fail(GatewayError("late")) == b""  # the upstream's own was already sent


def test_a_failure_after_the_start_is_an_exception() -> None:
    (message,) = _decoded(BedrockEvents("m").fail(OverloadedError("The upstream is overloaded.")))
    assert message.headers[":exception-type"] == "serviceUnavailableException"


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("err", "status", "kind"),
    [
        (InvalidRequestError("bad"), 400, "ValidationException"),
        (AuthenticationError("who"), 403, "UnrecognizedClientException"),
        (PermissionDeniedError("no"), 403, "AccessDeniedException"),
        (ModelNotFoundError("m"), 404, "ResourceNotFoundException"),
        (RateLimitError("slow down"), 429, "ThrottlingException"),
        (OverloadedError("busy"), 503, "ServiceUnavailableException"),
        (GatewayError("oops"), 500, "InternalServerException"),
    ],
)
def test_bedrock_errors(err: GatewayError, status: int, kind: str) -> None:
    code, body, headers = render_bedrock(err, "rid")
    assert code == status and json.loads(body) == {"message": err.message}
    assert headers["x-amzn-ErrorType"].startswith(kind + ":") and headers["x-amzn-RequestId"] == "rid"
    assert BedrockInvoke("m").status_of(err) == status


def test_an_upstream_answer_keeps_its_message_in_bedrocks_shape() -> None:
    answer = UpstreamAnswer(400, {"type": "invalid_request_error", "message": "prompt is too long"}, "", None)
    code, body, _ = render_bedrock(GatewayError("x", upstream=answer), None)
    assert (code, json.loads(body)) == (400, {"message": "prompt is too long"})


@pytest.mark.parametrize(("status", "mapped"), [(402, 400), (504, 408), (529, 503), (418, 418), (502, 500)])
def test_bedrock_statuses(status: int, mapped: int) -> None:
    assert bedrock_status(status)[0] == mapped


@pytest.mark.parametrize(
    ("err", "status", "name"),
    [
        (InvalidRequestError("bad"), 400, "INVALID_ARGUMENT"),
        (AuthenticationError("who"), 401, "UNAUTHENTICATED"),
        (PermissionDeniedError("no"), 403, "PERMISSION_DENIED"),
        (RateLimitError("slow down"), 429, "RESOURCE_EXHAUSTED"),
        (OverloadedError("busy"), 529, "UNAVAILABLE"),
        (GatewayError("oops"), 500, "INTERNAL"),
    ],
)
def test_vertex_errors(err: GatewayError, status: int, name: str) -> None:
    code, body, _ = render_google(err, "rid")
    assert code == status
    assert json.loads(body) == {"error": {"code": status, "message": err.message, "status": name}}


@pytest.mark.parametrize(
    ("path", "renders"),
    [
        ("/model/us.anthropic.claude-sonnet-5-5-v1:0/invoke", "bedrock"),
        ("/model/x/converse", "bedrock"),
        ("/inference-profiles", "bedrock"),
        ("/v1/projects/p/locations/l/publishers/anthropic/models/m:rawPredict", "vertex"),
        ("/v1/messages", None),
        ("/openai/v1/chat/completions", None),
        ("/models", None),
    ],
)
def test_the_errors_of_a_clouds_paths_take_its_envelope(path: str, renders: str | None) -> None:
    found = error_dialect(path)
    kinds = {BedrockInvoke: "bedrock", VertexRawPredict: "vertex"}
    assert (kinds[type(found)] if found is not None else None) == renders
