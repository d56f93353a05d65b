"""Amazon Bedrock's InvokeModel, served: ``POST /model/{modelId}/invoke``,
``/invoke-with-response-stream`` and ``/count-tokens``, for clients configured for Bedrock
(Claude Code with ``CLAUDE_CODE_USE_BEDROCK=1`` and ``ANTHROPIC_BEDROCK_BASE_URL``).

The same pipeline as native Messages (keys, limits, routing to any deployment, failover,
billing: the ledger's ``messages`` and ``count_tokens`` rows); what differs is Bedrock's wire:

- the model is the URL's model id (a foundation model, an inference profile or an ARN), found in
  the catalog by ``translate/cloud_models.py``; unknown: Bedrock's 400 "The provided model
  identifier is invalid.";
- the body carries ``anthropic_version`` (required, ``bedrock-…``) and ``anthropic_beta``
  (``cloud_bodies.py``);
- a stream is AWS event-stream framing (``translate/eventstream.py``): each Anthropic event a
  ``chunk`` whose ``bytes`` are its JSON; a failure after the start is an ``exception`` message;
  the keep-alive is a ``ping`` event (Anthropic's SDKs skip it);
- errors are ``{"message": …}`` with the type in ``x-amzn-ErrorType`` (Bedrock API reference,
  "InvokeModel", Errors): ``BEDROCK_STATUS`` maps each status of ours onto Bedrock's;
- CountTokens takes ``{"input": {"invokeModel": {"body": "<base64 of an InvokeModel body>"}}}``
  and answers ``{"inputTokens": N}`` (Bedrock API reference, "CountTokens").
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from ezat_compat.dialects import Answer, EventTranslator, Headers, Parsed, ReplyIds, Resolve, upstream_message
from ezat_compat.dialects.anthropic_messages import COUNT_TOKENS_PATH, AnthropicMessages, EventMeter
from ezat_compat.dialects.cloud_bodies import (
    HeaderView,
    checked_version,
    first_known,
    merged_betas,
    native_body,
    object_body,
)
from ezat_compat.errors import GatewayError, InvalidRequestError, anthropic_status, render_anthropic
from ezat_compat.jsonfast import encode_json
from ezat_compat.translate.cloud_models import bedrock_model_names
from ezat_compat.translate.eventstream import chunk_message, exception_message

BEDROCK_VERSION = "bedrock-2023-05-31"
EVENT_STREAM_TYPE = "application/vnd.amazon.eventstream"
_CORAL = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
INVALID_MODEL = "The provided model identifier is invalid."

# our status (Anthropic's, as ``render_anthropic`` gives it) -> (Bedrock's status, its error type).
# Bedrock answers a key it doesn't know with 403 (never 401), an overload with 503 and a model's
# timeout with 408 (InvokeModel's Errors; the common errors of AWS APIs).
BEDROCK_STATUS: Mapping[int, tuple[int, str]] = {
    400: (400, "ValidationException"),
    401: (403, "UnrecognizedClientException"),
    402: (400, "ServiceQuotaExceededException"),
    403: (403, "AccessDeniedException"),
    404: (404, "ResourceNotFoundException"),
    408: (408, "ModelTimeoutException"),
    413: (413, "ValidationException"),
    429: (429, "ThrottlingException"),
    500: (500, "InternalServerException"),
    503: (503, "ServiceUnavailableException"),
    504: (408, "ModelTimeoutException"),
    529: (503, "ServiceUnavailableException"),
}
# an Anthropic stream ``error`` event's type -> the exception a Bedrock stream ends with
STREAM_EXCEPTIONS: Mapping[str, str] = {
    "overloaded_error": "serviceUnavailableException",
    "rate_limit_error": "throttlingException",
    "invalid_request_error": "validationException",
    "timeout_error": "modelTimeoutException",
    "api_error": "internalServerException",
}
STREAM_EXCEPTION = "modelStreamErrorException"  # any other type


def bedrock_status(status: int) -> tuple[int, str]:
    """(Bedrock's status, its error type) for a status of ours."""
    known = BEDROCK_STATUS.get(status)
    if known is not None:
        return known
    return (status, "ValidationException") if status < 500 else (500, "InternalServerException")


def render_bedrock(err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
    """``err`` as Bedrock answers: ``{"message": …}``, ``x-amzn-ErrorType`` and
    ``x-amzn-RequestId``; an upstream's own answer gives its message and status."""
    status, body, headers = render_anthropic(err, request_id)
    code, kind = bedrock_status(status)
    headers = {**headers, "x-amzn-ErrorType": kind + _CORAL}
    if request_id:
        headers["x-amzn-RequestId"] = request_id
    return code, encode_json({"message": str(body["error"].get("message") or kind)}), headers


def stream_exception(error: Mapping[str, Any]) -> bytes:
    """An Anthropic ``error`` object as the ``exception`` message a Bedrock stream ends with."""
    kind = STREAM_EXCEPTIONS.get(str(error.get("type")), STREAM_EXCEPTION)
    return exception_message(kind, str(error.get("message") or kind))


def sse_data(event: bytes) -> bytes:
    """The ``data`` of one SSE event as ``EventMeter`` writes it (``event: …\\ndata: …\\n\\n``)."""
    return event[event.index(b"\ndata: ") + 7 : -2]


class BedrockEvents(EventMeter):
    """``EventMeter`` (usage, model name, endings) with each event framed as Bedrock's."""

    __slots__ = ()

    def feed(self, event: str, data: str) -> bytes:
        out = super().feed(event, data)
        if event == "error" and self.error is not None:
            return stream_exception(self.error)
        return chunk_message(sse_data(out)) if out else b""

    def fail(self, err: GatewayError) -> bytes:
        if self.error is not None:
            return b""
        return stream_exception(render_anthropic(err)[1]["error"])


class BedrockInvoke(AnthropicMessages):
    """``/model/{modelId}/invoke`` (``stream`` False) and ``/invoke-with-response-stream``."""

    ping = chunk_message(b'{"type":"ping"}')

    def __init__(self, model_id: str, *, stream: bool = False) -> None:
        super().__init__(None)  # message threads are the native dialect's only
        self.model_id = model_id
        self.streaming = stream

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed:
        body = object_body(body)
        checked_version(body, "bedrock", BEDROCK_VERSION, required=True)
        view = HeaderView(headers, {"anthropic-beta": merged_betas(body, headers)})
        names = bedrock_model_names(self.model_id)
        native = native_body(body, self.model_id, stream=self.streaming)
        return super().parse(native, view, first_known(resolve, names, _invalid_model))

    def translator(self, parsed: Parsed, ids: ReplyIds) -> EventTranslator:
        return BedrockEvents(parsed.model_name)

    def status_of(self, err: GatewayError) -> int:
        return bedrock_status(anthropic_status(err))[0]

    def render_error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
        return render_bedrock(err, request_id)


def _invalid_model() -> InvalidRequestError:
    return InvalidRequestError(INVALID_MODEL, param="modelId")


class BedrockCountTokens(BedrockInvoke):
    """``/model/{modelId}/count-tokens``: routed with failover, never billed."""

    endpoint = "count_tokens"
    path = COUNT_TOKENS_PATH
    billed = False

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed:
        invoke = _invoke_body(object_body(body))
        invoke.pop("max_tokens", None)  # InvokeModel's body needs it; a count takes none
        if "anthropic_version" not in invoke:
            invoke["anthropic_version"] = BEDROCK_VERSION
        return super().parse(invoke, headers, resolve)

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer:
        counted = upstream_message(data).get("input_tokens")
        return Answer(encode_json({"inputTokens": counted}), None)


def _invoke_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The InvokeModel body a CountTokens request counts (``input.invokeModel.body``, base64)."""
    source = body.get("input")
    if isinstance(source, dict) and "converse" in source and "invokeModel" not in source:
        raise InvalidRequestError(
            "input.converse: this gateway counts InvokeModel bodies only; send input.invokeModel.",
            param="input.converse",
        )
    invoke = source.get("invokeModel") if isinstance(source, dict) else None
    encoded = invoke.get("body") if isinstance(invoke, dict) else None
    if not isinstance(encoded, str):
        raise InvalidRequestError(
            "input.invokeModel.body: Field required (the InvokeModel body, base64-encoded).",
            param="input.invokeModel.body",
        )
    try:
        decoded = json.loads(base64.b64decode(encoded, validate=True))
    except (ValueError, binascii.Error):
        decoded = None
    if not isinstance(decoded, dict):
        raise InvalidRequestError(
            "input.invokeModel.body: not the base64 of a JSON object.", param="input.invokeModel.body"
        )
    return decoded
