"""OpenAI's dialect on HTTP: ``/openai/v1/chat/completions``, the legacy ``/openai/v1/completions``
and the model list (Chat Completions reference)."""

from __future__ import annotations

from flask import Blueprint, Response, request

from ezat_compat.api.common import api_key, client_request, gateway, json_response, respond
from ezat_compat.dialects.openai_chat import OpenAIChat
from ezat_compat.dialects.openai_completions import OpenAICompletions
from ezat_compat.errors import ModelNotFoundError

bp = Blueprint("openai", __name__, url_prefix="/openai/v1")
CHAT = OpenAIChat()
COMPLETIONS = OpenAICompletions()


@bp.post("/chat/completions")
def chat_completions() -> Response:
    """Chat Completions, JSON or ``"stream": true``."""
    gw = gateway()
    return respond(gw.handle(CHAT, client_request(request, gw.config)))


@bp.post("/completions")
def completions() -> Response:
    """The legacy Completions API, JSON or ``"stream": true``."""
    gw = gateway()
    return respond(gw.handle(COMPLETIONS, client_request(request, gw.config)))


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
