"""Anthropic's dialect: native ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Same keys, permissions, limits, routing, failover, affinity and billing as the OpenAI
endpoint; bodies pass through unchanged except the model name (the deployment's
``upstream_model``); Anthropic's error envelope and statuses (529 kept). Issue 6.
"""

from __future__ import annotations

import json
import time
from typing import Any

from flask import Blueprint, Response, request

from ezat_compat.api.common import api_key, gateway, json_response, raw_json_response, read_json, request_id
from ezat_compat.api.sse import SSE_HEADERS, StreamBody
from ezat_compat.domain import Model
from ezat_compat.errors import GatewayError, InvalidRequestError, anthropic_error_type
from ezat_compat.pipeline import Call, Gateway, upstream_to_gateway_error
from ezat_compat.store.accounts import AuthContext
from ezat_compat.streaming import anthropic_stream
from ezat_compat.translate.response import usage_from_anthropic
from ezat_compat.upstream.client import DEPLOYMENT_FAULT_STATUSES, UpstreamError, UpstreamStatusError, encode_body

bp = Blueprint("anthropic", __name__, url_prefix="/v1")
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")


# Anthropic's error.type by status (their errors page); other 4xx: invalid_request_error, 5xx: api_error.
class UpstreamPassthrough(Exception):
    """An upstream error answer returned to a native client as it came (status and body).

    Only for answers that are the client's business: its own request refused (400, 413, other
    4xx) or no capacity (429, 5xx, 529). The deployment's own 401-404 are the gateway's
    configuration problem and go through ``upstream_to_gateway_error`` instead (see
    ``_client_error``). A body that isn't Anthropic's error envelope (a proxy's HTML page)
    is replaced by one, so the client always gets ``{"type": "error", "error": {…}}``.
    """

    def __init__(self, error: UpstreamStatusError) -> None:
        super().__init__(error.message)
        self.error = error

    def response(self, rid: str) -> Response:
        """The upstream's status, ``retry-after`` and error object; ``request_id`` is ours (the
        one in the ``request-id`` header, which the client quotes to support)."""
        retry_after = self.error.headers.get("retry-after")
        headers = {"retry-after": retry_after} if retry_after else {}
        if self.error.error_type is None:  # not Anthropic's envelope (a proxy's page): make one
            error = {"type": anthropic_error_type(self.error.status), "message": self.error.message}
        else:
            error = json.loads(self.error.body)["error"]
        return json_response({"type": "error", "error": error, "request_id": rid}, self.error.status, headers)


def _forwarded() -> dict[str, str]:
    return {name: request.headers[name] for name in FORWARDED_HEADERS if request.headers.get(name)}


def _authenticated(gw: Gateway) -> tuple[AuthContext, Any]:
    """The key first (401 before anything about the body), then the JSON body."""
    auth = gw.authenticate(api_key(request))
    return auth, read_json(request)


def _resolve(gw: Gateway, auth: AuthContext, body: Any) -> tuple[Model, str]:
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    name = body.get("model")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequestError("model: Field required", param="model")
    return gw.resolve(auth, name), name


def _client_error(exc: UpstreamError, timeout_s: float) -> Exception:
    """What the native client gets for an upstream failure: the upstream's answer as it came,
    except the deployment's own 401-404 (the gateway's key or model is wrong: a 500 that says
    so, never the client's 401) and failures without an answer (timeouts, refused connections)."""
    if isinstance(exc, UpstreamStatusError) and exc.status not in DEPLOYMENT_FAULT_STATUSES:
        return UpstreamPassthrough(exc)
    return upstream_to_gateway_error(exc, timeout_s=timeout_s)


def _status_of(err: BaseException) -> int:
    """The status the native client gets for ``err`` (for the ledger and the metrics)."""
    if isinstance(err, UpstreamPassthrough):
        return err.error.status
    if isinstance(err, GatewayError):
        return err.anthropic_status or err.status
    return 500


@bp.post("/messages")
def messages() -> Response:
    """Anthropic's Messages API, JSON or ``"stream": true`` (events passed through one by one)."""
    gw = gateway()
    rid = request_id()
    auth, body = _authenticated(gw)
    model, name = _resolve(gw, auth, body)
    stream = body.get("stream") is True
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        max_tokens = model.max_output_tokens
    call = gw.admit(
        request_id=rid,
        endpoint="messages",
        auth=auth,
        model=model,
        model_name=name,
        session=request.headers.get("x-ezat-session"),
        body=body,
        max_tokens=max_tokens,
    )
    # with_model puts "model" (and, for streams, "stream") back in front; every other field,
    # an explicit "stream": false included, goes upstream as the client sent it.
    upstream_body = encode_body({k: v for k, v in body.items() if k != "model" and not (stream and k == "stream")})
    with gw.settling_failures(call, lambda exc: _client_error(exc, gw.timeout_s), _status_of):
        if stream:
            upstream, events, first = gw.open_stream(call, "/v1/messages", upstream_body, headers=_forwarded())
            generator = anthropic_stream(gw, call, upstream, events, first)
            return Response(
                StreamBody(generator, lambda: gw.abandoned(call, upstream, first)),
                mimetype="text/event-stream",
                headers=SSE_HEADERS,
            )
        data, _ = gw.complete(call, "/v1/messages", upstream_body, stream_flag=None, headers=_forwarded())
        try:
            message = json.loads(data)
        except ValueError:
            raise GatewayError("The upstream provider sent a reply that is not JSON.") from None
        gw.settle(call, usage_from_anthropic(message.get("usage") if isinstance(message, dict) else None), 200)
        return raw_json_response(data)


@bp.post("/messages/count_tokens")
def count_tokens() -> Response:
    """Passed to the upstream (routing and failover apply; nothing is billed)."""
    gw = gateway()
    auth, body = _authenticated(gw)
    model, name = _resolve(gw, auth, body)
    gw.limits.admit(auth)
    call = Call(
        request_id=request_id(),
        endpoint="count_tokens",
        auth=auth,
        model=model,
        model_name=name,
        session=request.headers.get("x-ezat-session"),
        reserved_micros=0,
        started=time.monotonic(),
        settled=True,
    )
    upstream_body = encode_body({k: v for k, v in body.items() if k != "model"})
    status = 500
    try:
        data, _ = gw.complete(call, "/v1/messages/count_tokens", upstream_body, stream_flag=None, headers=_forwarded())
        status = 200
    except UpstreamError as exc:
        err = _client_error(exc, gw.timeout_s)
        status = _status_of(err)
        raise err from None
    finally:  # not billed, so settle() never counts it: count the request here
        gw.metrics.requests.labels(call.endpoint, model.id, call.deployment or "-", str(status)).inc()
    return raw_json_response(data)


@bp.get("/models")
def list_models() -> Response:
    """Anthropic's model list, so ``anthropic.Anthropic().models.list()`` works too."""
    gw = gateway()
    auth = gw.authenticate(api_key(request))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(gw.catalog.created))
    data = [
        {"type": "model", "id": m.id, "display_name": m.id, "created_at": created}
        for m in gw.catalog.models
        if auth.allows(m.id, m.aliases)
    ]
    return json_response(
        {
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )
