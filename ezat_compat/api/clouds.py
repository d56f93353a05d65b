"""The clouds' dialects on HTTP, for clients configured for a cloud (Claude Code with
``CLAUDE_CODE_USE_BEDROCK`` or ``CLAUDE_CODE_USE_VERTEX``) pointed at the gateway:

- Bedrock's InvokeModel: ``POST /model/{modelId}/invoke``, ``/invoke-with-response-stream``
  (AWS event stream) and ``/count-tokens`` (``dialects/bedrock_invoke.py``);
- Vertex AI's ``POST /v1/projects/{p}/locations/{l}/publishers/anthropic/models/{model}:rawPredict``,
  ``:streamRawPredict`` (SSE) and ``count-tokens:rawPredict`` (``dialects/vertex_predict.py``).

Credentials: the gateway's key, as for every route: ``Authorization: Bearer`` (a Bedrock API
key, ``AWS_BEARER_TOKEN_BEDROCK``; Vertex's ``ANTHROPIC_AUTH_TOKEN`` with
``CLAUDE_CODE_SKIP_VERTEX_AUTH``) or ``x-api-key``. A request signed with AWS SigV4 carries no
key of ours (a signature proves an AWS secret the gateway doesn't hold), so without an
``x-api-key`` it is refused with Bedrock's 403 saying to send the key as a bearer.
Errors on these paths, routing 404/405 included, are in the cloud's envelope (``error_dialect``,
used by the app's error handler).
"""

from __future__ import annotations

from flask import Blueprint, Request, Response, request

from ezat_compat.api.common import client_request, gateway, raw_json_response, request_id
from ezat_compat.api.sse import SSE_HEADERS, StreamBody, stream_response
from ezat_compat.dialects import Dialect
from ezat_compat.dialects.bedrock_invoke import EVENT_STREAM_TYPE, BedrockCountTokens, BedrockInvoke
from ezat_compat.dialects.vertex_predict import VertexCountTokens, VertexRawPredict
from ezat_compat.errors import AuthenticationError
from ezat_compat.pipeline import Reply
from ezat_compat.session import StreamSession

bedrock_bp = Blueprint("bedrock", __name__)
vertex_bp = Blueprint(
    "vertex", __name__, url_prefix="/v1/projects/<project>/locations/<location>/publishers/anthropic/models"
)
BEDROCK_PREFIXES = ("/model/", "/inference-profiles")
VERTEX_PREFIX = "/v1/projects/"
COUNT_TOKENS_MODEL = "count-tokens"
SIGV4 = "AWS4-HMAC-SHA256"
SIGV4_REFUSED = (
    "This gateway does not take AWS SigV4 signatures: send your gateway key as a Bedrock API key "
    "(AWS_BEARER_TOKEN_BEDROCK=ezat_sk_…, sent as 'Authorization: Bearer'), or in 'x-api-key'."
)
BEDROCK_ERRORS = BedrockInvoke("")  # renders the errors of Bedrock's paths
VERTEX_ERRORS = VertexRawPredict("", "")  # and of Vertex's


def error_dialect(path: str) -> Dialect | None:
    """The dialect whose envelope the errors of ``path`` take, if it is a cloud's path."""
    if path.startswith(BEDROCK_PREFIXES):
        return BEDROCK_ERRORS
    if path.startswith(VERTEX_PREFIX):
        return VERTEX_ERRORS
    return None


def _refuse_sigv4(req: Request) -> None:
    """A SigV4-signed request without ``x-api-key``: Bedrock's 403, saying what to send."""
    if not req.headers.get("x-api-key") and (req.headers.get("authorization") or "").startswith(SIGV4):
        raise AuthenticationError(SIGV4_REFUSED)


def _bedrock(dialect: BedrockInvoke) -> Response:
    _refuse_sigv4(request)
    gw = gateway()
    result = gw.handle(dialect, client_request(request, gw.config))
    if isinstance(result, Reply):
        return raw_json_response(result.body, result.status, {"x-amzn-RequestId": request_id()})
    return _event_stream(result)


def _event_stream(session: StreamSession) -> Response:
    """The stream writer's bytes as Bedrock's ``InvokeModelWithResponseStream`` answer."""
    headers = {
        **SSE_HEADERS,
        "x-amzn-RequestId": request_id(),
        "x-amzn-bedrock-content-type": "application/json",
    }
    return Response(StreamBody(session), content_type=EVENT_STREAM_TYPE, headers=headers, direct_passthrough=True)


@bedrock_bp.post("/model/<path:model_id>/invoke")
def invoke(model_id: str) -> Response:
    """InvokeModel: the reply as JSON."""
    return _bedrock(BedrockInvoke(model_id))


@bedrock_bp.post("/model/<path:model_id>/invoke-with-response-stream")
def invoke_with_response_stream(model_id: str) -> Response:
    """InvokeModelWithResponseStream: the events in AWS event-stream framing."""
    return _bedrock(BedrockInvoke(model_id, stream=True))


@bedrock_bp.post("/model/<path:model_id>/count-tokens")
def count_tokens(model_id: str) -> Response:
    """CountTokens: routed with failover; nothing billed."""
    return _bedrock(BedrockCountTokens(model_id))


def _vertex(dialect: VertexRawPredict) -> Response:
    gw = gateway()
    result = gw.handle(dialect, client_request(request, gw.config))
    if isinstance(result, Reply):
        return raw_json_response(result.body, result.status)
    return stream_response(result)


@vertex_bp.post("/<model>:rawPredict")
def raw_predict(project: str, location: str, model: str) -> Response:
    """rawPredict (JSON, or SSE when the body says ``"stream": true``); ``count-tokens``
    counts the body's model."""
    resource = f"projects/{project}/locations/{location}"
    if model == COUNT_TOKENS_MODEL:
        return _vertex(VertexCountTokens(resource))
    return _vertex(VertexRawPredict(resource, model))


@vertex_bp.post("/<model>:streamRawPredict")
def stream_raw_predict(project: str, location: str, model: str) -> Response:
    """streamRawPredict: Anthropic's SSE, as Vertex passes it on."""
    return _vertex(VertexRawPredict(f"projects/{project}/locations/{location}", model, stream=True))
