"""Google Vertex AI's ``rawPredict``, served: ``POST /v1/projects/{project}/locations/{location}/
publishers/anthropic/models/{model}:rawPredict``, ``:streamRawPredict`` and
``…/models/count-tokens:rawPredict``, for clients configured for Vertex (Claude Code with
``CLAUDE_CODE_USE_VERTEX=1`` and ``ANTHROPIC_VERTEX_BASE_URL``; ``AnthropicVertex``).

The same pipeline as native Messages (keys, limits, routing to any deployment, failover,
billing); what differs is Vertex's wire (Google Cloud, "Use Anthropic's Claude models"):

- the model is the URL's (``claude-sonnet-4-5@20250929``), found in the catalog by
  ``translate/cloud_models.py``; for counting it is the body's ``model``; unknown: Google's 404
  "Publisher Model `…` not found.";
- the body carries ``anthropic_version`` (``vertex-…``; required but for counting); the betas
  come in the ``anthropic-beta`` header, as for native clients;
- a stream is Anthropic's SSE, as Vertex passes it on (``EventMeter``);
- errors are Google's JSON, ``{"error": {"code": 429, "message": …, "status":
  "RESOURCE_EXHAUSTED"}}`` (Google Cloud APIs, "Errors": the canonical codes by status).

The project and location of the URL are not checked: the gateway routes by model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ezat_compat.dialects import Answer, Headers, Parsed, ReplyIds, Resolve
from ezat_compat.dialects.anthropic_messages import COUNT_TOKENS_PATH, AnthropicMessages
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
from ezat_compat.translate.cloud_models import vertex_model_names

VERTEX_VERSION = "vertex-2023-10-16"

# status -> Google's canonical error name (google.rpc.Code, as Google's APIs map HTTP statuses)
GOOGLE_STATUS: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    402: "FAILED_PRECONDITION",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    529: "UNAVAILABLE",
}


class PublisherModelNotFoundError(GatewayError):
    """The URL's model is none of the catalog's (nor of the key's): name one it offers."""

    status = 404
    openai_type = "invalid_request_error"
    code = "model_not_found"
    anthropic_type = "not_found_error"


def render_google(err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
    """``err`` in Google's error JSON; the status is ours (529 kept: Anthropic's SDKs retry it)."""
    status, body, headers = render_anthropic(err, request_id)
    name = GOOGLE_STATUS.get(status) or ("INVALID_ARGUMENT" if status < 500 else "INTERNAL")
    message = str(body["error"].get("message") or name)
    return status, encode_json({"error": {"code": status, "message": message, "status": name}}), headers


class VertexRawPredict(AnthropicMessages):
    """``{model}:rawPredict`` (``stream`` False) and ``{model}:streamRawPredict``."""

    def __init__(self, resource: str, model: str, *, stream: bool = False) -> None:
        """``resource``: ``projects/{project}/locations/{location}``, for the 404's words."""
        super().__init__(None)  # message threads are the native dialect's only
        self.resource = resource
        self.model = model
        self.streaming = stream

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed:
        body = object_body(body)
        checked_version(body, "vertex", VERTEX_VERSION, required=self.billed)
        model = self._model(body)
        view = HeaderView(headers, {"anthropic-beta": merged_betas(body, headers)})
        stream = self.streaming or body.get("stream") is True
        native = native_body(body, model, stream=stream and self.billed)
        return super().parse(native, view, first_known(resolve, vertex_model_names(model), self._not_found(model)))

    def _model(self, body: Mapping[str, Any]) -> str:
        return self.model

    def _not_found(self, model: str) -> Callable[[], GatewayError]:
        def not_found() -> GatewayError:
            return PublisherModelNotFoundError(
                f"Publisher Model `{self.resource}/publishers/anthropic/models/{model}` not found.", param="model"
            )

        return not_found

    def status_of(self, err: GatewayError) -> int:
        return anthropic_status(err)

    def render_error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
        return render_google(err, request_id)


class VertexCountTokens(VertexRawPredict):
    """``count-tokens:rawPredict``: the model in the body; routed with failover, never billed."""

    endpoint = "count_tokens"
    path = COUNT_TOKENS_PATH
    billed = False

    def __init__(self, resource: str) -> None:
        super().__init__(resource, "")

    def _model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        if not isinstance(model, str) or not model.strip():
            raise InvalidRequestError("model: Field required (the model to count for).", param="model")
        return model

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer:
        return Answer(data, None)
