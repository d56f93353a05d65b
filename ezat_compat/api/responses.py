"""OpenAI's Responses API on HTTP (docs/responses.md): ``POST /openai/v1/responses`` through the
pipeline, and the stored responses: ``GET``/``DELETE /openai/v1/responses/<id>`` and
``GET /openai/v1/responses/<id>/input_items``."""

from __future__ import annotations

import logging
import time

from flask import Blueprint, Flask, Response, current_app, request

from ezat_compat.api.common import api_key, client_request, gateway, json_response, respond
from ezat_compat.datafiles import data_folder
from ezat_compat.dialects.openai_responses import OpenAIResponses, ResponsesServices, not_found
from ezat_compat.domain import Config
from ezat_compat.errors import GatewayError
from ezat_compat.sealing import KEY_ENV, load_sealer
from ezat_compat.store.accounts import AuthContext
from ezat_compat.store.responses import ResponseStore, StoredResponse
from ezat_compat.translate.responses_response import client_view

bp = Blueprint("openai_responses", __name__, url_prefix="/openai/v1")
_EXTENSION = "ezat_responses"
log = logging.getLogger("ezat_compat")
NOT_INSTALLED = "The gateway's Responses API is not set up in this process."
NO_SEALING_KEY = (
    "The gateway has no key to seal reasoning with: its operator must fix the sealing key (the gateway's log says how)."
)


def dialect() -> OpenAIResponses:
    """The app's Responses dialect (``dialect_of`` the current app)."""
    return dialect_of(current_app)


def install(app: Flask, config: Config, store: ResponseStore | None) -> None:
    """The composition root's Responses dialect for ``app``: its stored responses on ``store``
    (the process's store's; None: ``[responses] store`` is off) and its sealer (the key from
    the environment or the data folder). A sealer that can't be loaded is logged once, with its
    path and cause; every Responses request then answers 500 ``NO_SEALING_KEY``."""
    app.extensions[_EXTENSION] = _built(config, store)


def dialect_of(app: Flask) -> OpenAIResponses:
    """``app``'s Responses dialect (``install``); a ``GatewayError`` (500) when its sealer could
    not be loaded, or when the app was made without one."""
    found: OpenAIResponses | GatewayError | None = app.extensions.get(_EXTENSION)
    if found is None:
        raise GatewayError(NOT_INSTALLED)
    if isinstance(found, GatewayError):
        raise GatewayError(found.message)
    return found


def _built(config: Config, store: ResponseStore | None) -> OpenAIResponses | GatewayError:
    settings = config.responses
    folder = data_folder(config)
    try:
        sealer = load_sealer(folder)
    except (OSError, ValueError) as exc:
        # The path and the cause are the operator's, logged once per process; the client learns
        # only that the gateway is at fault (a server path is not its business).
        log.error(
            "no key to seal reasoning with (%s): set %s or make %s writable by the server's user; "
            "every Responses request answers 500 until then",
            exc,
            KEY_ENV,
            folder,
        )
        return GatewayError(NO_SEALING_KEY)
    store = store if settings.store else None
    quota = store.over_quota if store is not None else None
    return OpenAIResponses(ResponsesServices(settings, store, sealer, time.time, quota))


def _admitted() -> AuthContext:
    """The key of this request, its request counted against its ``rpm`` as a POST's is (429
    past it): reading stored responses is traffic like any other."""
    gw = gateway()
    auth = gw.authenticate(api_key(request))
    gw.limits.admit(auth, 0)  # no tokens, so nothing held: only the request is counted
    return auth


def _stored(response_id: str) -> StoredResponse:
    """The key's organisation's stored response without its conversation (never read), or 404."""
    auth = _admitted()
    services = dialect().services
    found = services.store.get(auth.org_id, response_id, services.clock(), context=False) if services.store else None
    if found is None:
        raise not_found(response_id)
    return found


@bp.post("/responses")
def create_response() -> Response:
    """Create a response, JSON or ``"stream": true``."""
    gw = gateway()
    return respond(gw.handle(dialect(), client_request(request, gw.config)))


@bp.get("/responses/<response_id>")
def retrieve_response(response_id: str) -> Response:
    found = _stored(response_id)
    return json_response(client_view(found.response, found.encrypted))


@bp.delete("/responses/<response_id>")
def delete_response(response_id: str) -> Response:
    auth = _admitted()
    services = dialect().services
    if services.store is None or not services.store.delete(auth.org_id, response_id, services.clock()):
        raise not_found(response_id)
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


@bp.get("/responses/<response_id>/input_items")
def list_input_items(response_id: str) -> Response:
    """The response's input items, a page at a time (``OpenAIResponses.input_items``)."""
    auth = _admitted()
    return json_response(dialect().input_items(auth.org_id, response_id, request.args))
