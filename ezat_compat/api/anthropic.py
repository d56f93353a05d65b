"""Anthropic's dialect on HTTP: native ``POST /v1/messages``, ``/v1/messages/count_tokens`` and
the model list."""

from __future__ import annotations

import time

from flask import Blueprint, Flask, Response, current_app, request

from ezat_compat.api.common import api_key, client_request, gateway, json_response, respond
from ezat_compat.dialects.anthropic_messages import AnthropicCountTokens, AnthropicMessages
from ezat_compat.store.threads import ThreadStore

bp = Blueprint("anthropic", __name__, url_prefix="/v1")
COUNT_TOKENS = AnthropicCountTokens()
EXTENSION = "ezat.messages"


def install(app: Flask, threads: ThreadStore | None) -> None:
    """The composition root's native Messages dialect for ``app``, its message threads on
    ``threads`` (the process's store's; None: ``[responses] store`` is off)."""
    app.extensions[EXTENSION] = AnthropicMessages(threads)


def messages_dialect() -> AnthropicMessages:
    """The app's native Messages dialect (``install``)."""
    found: AnthropicMessages = current_app.extensions[EXTENSION]
    return found


@bp.post("/messages")
def messages() -> Response:
    """Anthropic's Messages API, JSON or ``"stream": true`` (events passed through one by one)."""
    gw = gateway()
    return respond(gw.handle(messages_dialect(), client_request(request, gw.config)))


@bp.post("/messages/count_tokens")
def count_tokens() -> Response:
    """Passed to the upstream (routing and failover apply; nothing is billed)."""
    gw = gateway()
    return respond(gw.handle(COUNT_TOKENS, client_request(request, gw.config)))


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
