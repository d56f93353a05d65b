"""The admin API's assembly: the flask-smorest ``Api`` (its OpenAPI document at
``/v1/organizations/openapi.json``, built from the blueprints' marshmallow schemas; no UI that
would load scripts from a CDN) and every admin blueprint, each a ``flask_smorest.Blueprint``
with ``url_prefix="/v1/organizations"`` exported as ``blp`` by its module.

``create_app`` calls ``register`` once when the admin API is served at all (``[admin]``); which
listener may reach it is the app's business (``app._register_admin``). Errors are rendered by
the app's handlers (Anthropic's envelope on admin paths), never by flask-smorest's own.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from flask import Flask, Response, g
from flask_smorest import Api

from ezat_compat import __version__
from ezat_compat.admin.errors import ADMIN_PREFIX, AdminInvalidRequestError, render_admin_error
from ezat_compat.api.common import json_response
from ezat_compat.domain import Config
from ezat_compat.store.accounts import StoreError
from ezat_compat.store.store import Store

# The admin blueprints, registered in this order (each module exports ``blp``): the core
# (organization, workspaces, rate limits, keys, the audit trail), people and groups, spend limits,
# reports.
BLUEPRINT_MODULES = (
    "ezat_compat.admin.workspaces",
    "ezat_compat.admin.keys",
    "ezat_compat.admin.audit",
    "ezat_compat.admin.users",
    "ezat_compat.admin.groups",
    "ezat_compat.admin.spend",
    "ezat_compat.admin.reports",
)
OPENAPI_PATH = ADMIN_PREFIX + "/openapi.json"
CONFIG_EXTENSION = "ezat_admin_config"  # app.extensions: the Config the admin views read


class AdminApi(Api):
    """flask-smorest's ``Api`` without its error handler (it would answer every HTTP error of
    the whole app in its own shape): the app's handlers answer in each path's envelope."""

    def _register_error_handlers(self) -> None:
        return None


def _import(name: str) -> ModuleType | None:
    """The blueprint module ``name``; None while it doesn't exist yet (a part of the admin API
    that isn't in this build), any other import error raised."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def register(app: Flask, config: Config, store: Store) -> Api:
    """Serve the admin API on ``app``: the ``Api`` with its OpenAPI document and every admin
    blueprint. A ``StoreError`` raised by a view (a value the store refuses) answers 400."""
    app.config.update(
        API_TITLE="ezat-compat admin API",
        API_VERSION=__version__,
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX=ADMIN_PREFIX,
        OPENAPI_JSON_PATH="openapi.json",
    )
    app.extensions[CONFIG_EXTENSION] = config
    api = AdminApi(
        app,
        spec_kwargs={
            "info": {
                "description": "Anthropic's Admin API over the gateway's organisations (workspaces), keys, "
                "limits and usage, and the gateway's own extensions under the same prefix. docs/admin-api.md."
            },
        },
    )
    api.spec.components.security_scheme("AdminKey", {"type": "apiKey", "in": "header", "name": "x-api-key"})
    api.spec.components.security_scheme("AdminBearer", {"type": "http", "scheme": "bearer"})
    api.spec.options["security"] = [{"AdminKey": []}, {"AdminBearer": []}]
    for name in BLUEPRINT_MODULES:
        module = _import(name)
        if module is not None:
            api.register_blueprint(module.blp)

    @app.errorhandler(StoreError)
    def store_refused(exc: StoreError) -> Response:
        err = AdminInvalidRequestError(str(exc))
        record = g.get("record")
        if record is not None:
            record.note_error(err)
        status, body, headers = render_admin_error(err, getattr(g, "request_id", None))
        return json_response(body, status, headers)

    return api
