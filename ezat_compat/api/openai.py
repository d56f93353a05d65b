"""OpenAI's dialect: ``/openai/v1/chat/completions`` and the model list (spec: chat-completions.md)."""

from __future__ import annotations

import json
import time
from typing import Any

from flask import Blueprint, Response, request

from ezat_compat.api.common import api_key, gateway, json_response, read_json, request_id
from ezat_compat.api.sse import SSE_HEADERS, StreamBody
from ezat_compat.errors import GatewayError, InvalidRequestError, ModelNotFoundError
from ezat_compat.pipeline import upstream_to_gateway_error
from ezat_compat.streaming import openai_stream
from ezat_compat.translate.request import openai_to_anthropic
from ezat_compat.translate.response import anthropic_to_openai, usage_from_anthropic
from ezat_compat.translate.stream import StreamTranslator
from ezat_compat.upstream.client import encode_body
from ezat_compat.wire.openai import RequestValidationError, load_chat_request

bp = Blueprint("openai", __name__, url_prefix="/openai/v1")
MESSAGES_PATH = "/v1/messages"


@bp.get("/models")
def list_models() -> Response:
    gw = gateway()
    auth = gw.authenticate(api_key(request))
    allowed = [m for m in gw.catalog.models if auth.allows(m.id, m.aliases)]
    return json_response(gw.catalog.openai_list(allowed))


@bp.get("/models/<path:model_id>")
def retrieve_model(model_id: str) -> Response:
    gw = gateway()
    auth = gw.authenticate(api_key(request))
    model = gw.catalog.resolve(model_id)
    if model is None or not auth.allows(model.id, model.aliases):
        raise ModelNotFoundError(model_id)
    return json_response(gw.catalog.openai_object(model))


def _validated(body: Any) -> dict[str, Any]:
    try:
        return load_chat_request(body)
    except RequestValidationError as exc:
        message = f"{exc.path}: {exc.message}" if exc.path else exc.message
        raise InvalidRequestError(message, param=exc.path or None) from None


@bp.post("/chat/completions")
def chat_completions() -> Response:
    gw = gateway()
    rid = request_id()
    auth = gw.authenticate(api_key(request))
    body = read_json(request)
    name = body.get("model") if isinstance(body, dict) else None
    # An unknown or forbidden model answers 404 / 403 before the rest of the body is judged.
    model = gw.resolve(auth, name) if isinstance(name, str) and 0 < len(name) <= 128 else None
    req = _validated(body)
    if model is None:
        model = gw.resolve(auth, req["model"])
    auto_cache = request.headers.get("x-ezat-cache", "").strip().lower() != "off"
    translation = openai_to_anthropic(req, model, auto_cache=auto_cache)
    session = request.headers.get("x-ezat-session") or translation.session
    call = gw.admit(
        request_id=rid,
        endpoint="chat.completions",
        auth=auth,
        model=model,
        model_name=req["model"],
        session=session,
        body=translation.body,
        max_tokens=translation.body["max_tokens"],
    )
    with gw.settling_failures(
        call, lambda exc: upstream_to_gateway_error(exc, source_map=translation.source_map, timeout_s=gw.timeout_s)
    ):
        gw.fetch_images(translation.image_slots)
        upstream_body = encode_body(translation.body)
        completion_id = "chatcmpl-" + rid
        created = int(time.time())
        if translation.stream:
            stream, events, first = gw.open_stream(call, MESSAGES_PATH, upstream_body)
            translator = StreamTranslator(
                completion_id=completion_id,
                created=created,
                model=req["model"],
                include_usage=translation.include_usage,
            )
            generator = openai_stream(gw, call, stream, events, first, translator, translation.include_usage)
            return Response(
                StreamBody(generator, lambda: gw.abandoned(call, stream, first)),
                mimetype="text/event-stream",
                headers=SSE_HEADERS,
            )
        data, _ = gw.complete(call, MESSAGES_PATH, upstream_body)
        try:
            message = json.loads(data)
        except ValueError:
            raise GatewayError("The upstream provider sent a reply that is not JSON.") from None
        completion = anthropic_to_openai(message, completion_id=completion_id, created=created, model=req["model"])
        gw.settle(call, usage_from_anthropic(message.get("usage")), 200)
        return json_response(completion)
