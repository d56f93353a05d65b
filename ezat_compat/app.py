"""The composition root: ``create_app(config)`` builds the process's collaborators once and
registers one blueprint per dialect. Nothing happens at import."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from typing import Any

from flask import Flask, Response, g, request
from sqlalchemy.engine import make_url
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from ezat_compat.api import anthropic as anthropic_api
from ezat_compat.api import openai as openai_api
from ezat_compat.api import responses as responses_api
from ezat_compat.api.common import gateway, json_response, new_request_id, raw_json_response, too_large
from ezat_compat.catalog import Catalog
from ezat_compat.cooldowns import make_cooldowns
from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.dialects.openai_chat import OpenAIChat
from ezat_compat.domain import Config
from ezat_compat.errors import GatewayError, InvalidRequestError, MethodNotAllowedError, RouteNotFoundError
from ezat_compat.limits import RateLimits
from ezat_compat.metrics import Metrics
from ezat_compat.pipeline import Gateway
from ezat_compat.store.accounts import Accounts
from ezat_compat.store.db import make_engine
from ezat_compat.store.ledger import Ledger
from ezat_compat.store.thinking import make_thinking_stash
from ezat_compat.upstream.client import UpstreamClient
from ezat_compat.upstream.images import ImageFetcher

log = logging.getLogger("ezat_compat")
ANTHROPIC_PREFIX = "/v1/"
ANTHROPIC = AnthropicMessages()
OPENAI = OpenAIChat()


def embedded_limits_path(database_url: str) -> str:
    """Where the embedded (no Redis) rate-limit counters live: next to a SQLite database,
    else in the temp folder, one file per database."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        return os.path.abspath(url.database) + "-limits"
    digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"ezat-limits-{digest}.db")


def build_gateway(config: Config) -> Gateway:
    """Every collaborator of the gateway core, for this process."""
    from ezat_compat.store.hotpath import make_hot_path

    gw_cfg = config.gateway
    engine = make_engine(gw_cfg.database_url)
    hot_path = make_hot_path(engine)  # one per process: Accounts and Ledger share its connection
    redis_url = gw_cfg.redis_url or None
    cooldowns = make_cooldowns(
        gw_cfg.redis_url,
        failures=gw_cfg.cooldown_failures,
        cooldown_s=gw_cfg.cooldown_s,
        max_cooldown_s=gw_cfg.max_cooldown_s,
    )
    metrics = Metrics()
    metrics.watch_cooldowns(lambda: cooldowns.cooling(time.time()))
    if gw_cfg.allow_private_image_hosts:
        log.warning(
            "allow_private_image_hosts = true: image URLs may reach loopback and private "
            "addresses. Use this in tests only."
        )
    return Gateway(
        config,
        catalog=Catalog(config.models, created=int(time.time())),
        accounts=Accounts(engine, hot_path),
        ledger=Ledger(engine, hot_path),
        limits=RateLimits(redis_url, embedded_limits_path(gw_cfg.database_url)),
        cooldowns=cooldowns,
        upstream=UpstreamClient(
            connect_timeout_s=gw_cfg.connect_timeout_s, stream_idle_timeout_s=gw_cfg.stream_idle_timeout_s
        ),
        images=ImageFetcher(threads=gw_cfg.image_fetch_threads, allow_private=gw_cfg.allow_private_image_hosts),
        metrics=metrics,
        thinking=make_thinking_stash(engine, gw_cfg.redis_url, gw_cfg.thinking_ttl_s),
    )


def _render(err: GatewayError) -> Response:
    """The error in the envelope of the dialect the path belongs to (routing 404/405 included)."""
    dialect = ANTHROPIC if request.path.startswith(ANTHROPIC_PREFIX) else OPENAI
    status, body, headers = dialect.render_error(err, getattr(g, "request_id", None))
    return raw_json_response(body, status, headers)


def _http_error(exc: HTTPException) -> GatewayError:
    if isinstance(exc, NotFound):
        return RouteNotFoundError(f"Invalid URL ({request.method} {request.path}).")
    if isinstance(exc, MethodNotAllowed):
        allowed = ", ".join(sorted(m for m in (exc.valid_methods or []) if m not in ("HEAD", "OPTIONS")))
        return MethodNotAllowedError(
            f"Method {request.method} is not allowed for {request.path}" + (f"; use {allowed}." if allowed else ".")
        )
    if isinstance(exc, RequestEntityTooLarge):
        return too_large()
    if exc.code and 400 <= exc.code < 500:
        return InvalidRequestError(exc.description or exc.name)
    return GatewayError(exc.description or "Internal error.")


def _register_errors(app: Flask) -> None:
    @app.errorhandler(GatewayError)
    def gateway_error(err: GatewayError) -> Response:
        return _render(err)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return _render(_http_error(exc))

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        log.exception("unexpected error in request %s", getattr(g, "request_id", "?"))
        return _render(
            GatewayError(
                "The gateway failed to process the request; "
                f"quote request id {getattr(g, 'request_id', '?')} to support."
            )
        )


def _register_public(app: Flask) -> None:
    @app.get("/healthz")
    def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/metrics")
    def metrics() -> Response:
        data, content_type = gateway().metrics.render()
        return Response(data, content_type=content_type)

    @app.get("/api/models")
    def public_models() -> Response:
        return json_response(gateway().catalog.public_catalog())


def create_app(config: Config, *, gateway_core: Gateway | None = None) -> Flask:
    """The WSGI app for ``config``. Pass ``gateway_core`` to use prepared collaborators."""
    app = Flask("ezat_compat")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.extensions["ezat"] = gateway_core or build_gateway(config)

    @app.before_request
    def assign_request_id() -> None:
        g.request_id = new_request_id()

    @app.after_request
    def add_request_id(response: Response) -> Response:
        rid = getattr(g, "request_id", "")
        response.headers["request-id"] = rid
        response.headers["x-request-id"] = rid  # what the OpenAI SDKs read (``_request_id``)
        return response

    app.register_blueprint(openai_api.bp)
    app.register_blueprint(responses_api.bp)
    app.register_blueprint(anthropic_api.bp)
    _register_public(app)
    _register_errors(app)
    return app


def app_from_environment(**overrides: Any) -> Flask:
    """For ``wsgi.py``: the config named by ``EZAT_CONFIG`` (or ./ezat.toml)."""
    from ezat_compat.config import load_config, resolve_config_path

    return create_app(load_config(resolve_config_path(None)), **overrides)
