"""Anthropic's dialect on HTTP: native ``POST /v1/messages``, ``/v1/messages/count_tokens`` and
the model list."""

from __future__ import annotations

import time

from flask import Blueprint, Response, current_app, request

from ezat_compat.api.common import api_key, client_request, gateway, json_response, respond
from ezat_compat.dialects.anthropic_messages import AnthropicCountTokens, AnthropicMessages
from ezat_compat.store.quota import quota_of
from ezat_compat.store.responses import DAY_S
from ezat_compat.store.threads import ThreadStore

bp = Blueprint("anthropic", __name__, url_prefix="/v1")
COUNT_TOKENS = AnthropicCountTokens()
EXTENSION = "ezat.messages"


def messages_dialect() -> AnthropicMessages:
    """The app's native Messages dialect, built on first use in each process (after gunicorn
    forks): its message threads kept on the gateway's database, through its engine and hot path,
    for ``[responses] ttl_days``; none when ``[responses] store`` is off."""
    found: AnthropicMessages | None = current_app.extensions.get(EXTENSION)
    if found is None:
        gw = gateway()
        settings = gw.config.responses
        ttl_s = settings.ttl_days * DAY_S
        threads = (
            ThreadStore(
                gw.ledger.engine,
                ttl_s,
                hot=gw.ledger.hot,
                quota=quota_of(settings),
                max_chain_bytes=2 * gw.config.max_body_bytes,
            )
            if settings.store
            else None
        )
        found = current_app.extensions.setdefault(EXTENSION, AnthropicMessages(threads))
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
