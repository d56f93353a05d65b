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
from ezat_compat.config import Model
from ezat_compat.errors import GatewayError, InvalidRequestError
from ezat_compat.pipeline import Call, Gateway, upstream_to_gateway_error
from ezat_compat.store.accounts import AuthContext
from ezat_compat.translate.response import usage_from_anthropic
from ezat_compat.upstream.client import UpstreamError, UpstreamStatusError, encode_body

bp = Blueprint("anthropic", __name__, url_prefix="/v1")
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")


class UpstreamPassthrough(Exception):
    """An upstream error answer returned to a native client as it came (status and body)."""

    def __init__(self, error: UpstreamStatusError) -> None:
        super().__init__(error.message)
        self.error = error

    def response(self, rid: str) -> Response:
        headers = {"retry-after": self.error.headers["retry-after"]} if "retry-after" in self.error.headers else {}
        body = self.error.body
        if not body:
            body = json.dumps({"type": "error", "error": {"type": "api_error", "message": self.error.message},
                               "request_id": rid}).encode()
        return raw_json_response(body, self.error.status, headers)


def _forwarded() -> dict[str, str]:
    return {name: request.headers[name] for name in FORWARDED_HEADERS if request.headers.get(name)}


def _resolve(gw: Gateway, body: Any) -> tuple[AuthContext, Model, str]:
    auth = gw.authenticate(api_key(request))
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    name = body.get("model")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequestError("model: Field required", param="model")
    return auth, gw.resolve(auth, name), name


def _upstream_failure(gw: Gateway, call: Call, exc: UpstreamError) -> Exception:
    if isinstance(exc, UpstreamStatusError):
        gw.settle(call, None, exc.status)
        return UpstreamPassthrough(exc)
    err = upstream_to_gateway_error(exc, timeout_s=gw.timeout_s)
    gw.settle(call, None, err.status)
    return err


@bp.post("/messages")
def messages() -> Response:
    gw = gateway()
    rid = request_id()
    body = read_json(request)
    auth, model, name = _resolve(gw, body)
    stream = body.get("stream") is True
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        max_tokens = model.max_output_tokens
    call = gw.admit(request_id=rid, endpoint="messages", auth=auth, model=model, model_name=name,
                    session=request.headers.get("x-ezat-session"), body=body, max_tokens=max_tokens)
    upstream_body = encode_body({k: v for k, v in body.items() if k not in ("model", "stream")})
    try:
        if stream:
            upstream, events, first = gw.open_stream(call, "/v1/messages", upstream_body, headers=_forwarded())
            generator = gw.anthropic_stream(call, upstream, events, first)
            return Response(StreamBody(generator, lambda: (upstream.close(), gw.settle(call, None, 499))),
                            mimetype="text/event-stream", headers=SSE_HEADERS)
        data, _ = gw.complete(call, "/v1/messages", upstream_body, stream_flag=None, headers=_forwarded())
        try:
            message = json.loads(data)
        except ValueError:
            raise GatewayError("The upstream provider sent a reply that is not JSON.") from None
        gw.settle(call, usage_from_anthropic(message.get("usage") if isinstance(message, dict) else None), 200)
        return raw_json_response(data)
    except UpstreamError as exc:
        raise _upstream_failure(gw, call, exc) from None
    except GatewayError as err:
        gw.settle(call, None, err.status)
        raise
    except BaseException:
        gw.settle(call, None, 500)
        raise


@bp.post("/messages/count_tokens")
def count_tokens() -> Response:
    """Passed to the upstream (routing and failover apply; nothing is billed)."""
    gw = gateway()
    body = read_json(request)
    auth, model, name = _resolve(gw, body)
    gw.limits.admit(auth)
    call = Call(request_id=request_id(), endpoint="count_tokens", auth=auth, model=model, model_name=name,
                session=request.headers.get("x-ezat-session"), reserved_micros=0, started=time.monotonic(),
                settled=True)
    upstream_body = encode_body({k: v for k, v in body.items() if k != "model"})
    try:
        data, _ = gw.complete(call, "/v1/messages/count_tokens", upstream_body, stream_flag=None,
                              headers=_forwarded())
    except UpstreamStatusError as exc:
        raise UpstreamPassthrough(exc) from None
    except UpstreamError as exc:
        raise upstream_to_gateway_error(exc, timeout_s=gw.timeout_s) from None
    return raw_json_response(data)


@bp.get("/models")
def list_models() -> Response:
    """Anthropic's model list, so ``anthropic.Anthropic().models.list()`` works too."""
    gw = gateway()
    auth = gw.authenticate(api_key(request))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(gw.catalog.created))
    data = [{"type": "model", "id": m.id, "display_name": m.id, "created_at": created}
            for m in gw.catalog.models if auth.allows(m.id, m.aliases)]
    return json_response({"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                          "last_id": data[-1]["id"] if data else None})
