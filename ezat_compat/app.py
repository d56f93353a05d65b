"""The composition root: ``create_app(config)`` builds the process's collaborators once and
registers one blueprint per dialect. Nothing happens at import.

Hooks: ``before_request`` gives the request its id and its ``RequestRecord`` (``g.record``,
which ``api/common.client_request`` hands to the pipeline); ``after_request`` writes the
request's log line and counts it (``RequestLog.finish``), except for a started stream, whose
line the pipeline writes when the stream ends; ``teardown_request`` finishes a record nothing
else did. ``/readyz`` answers from ``Readiness``; ``start_draining`` (re-exported from
``drain``) makes it answer 503 for the shutdown code.

Flask's dispatch serves every route; the only WSGI layer in front of it is ``TrustedForwarded``
(the client's address from a trusted proxy's ``X-Forwarded-For``).

The admin API (``admin/api.py``: ``/v1/organizations/…``) is served on ``[admin] bind``, a
listener of its own that serves nothing else but ``/healthz``, and on the main listener only
when ``[admin] on_main_listener`` says so; which listener a request came in on is asked of its
socket, as for ``metrics_bind``. Errors on its paths are Anthropic's envelope (``admin/errors.py``).
The web console (``console/``: ``/console/…``) is served with it, wherever it is; errors on its
paths are HTML pages (``console/errors.py``), and behind a trusted proxy its links follow the
proxy's prefix and scheme (``console.ForwardedPrefix``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from ezat_compat import memory
from ezat_compat.admin import api as admin_api
from ezat_compat.admin.errors import from_http_exception, is_admin_path, render_admin_error
from ezat_compat.api import anthropic as anthropic_api
from ezat_compat.api import clouds as clouds_api
from ezat_compat.api import oauth as oauth_api
from ezat_compat.api import openai as openai_api
from ezat_compat.api import responses as responses_api
from ezat_compat.api.common import gateway, json_response, new_request_id, raw_json_response, too_large, unproxied
from ezat_compat.catalog import Catalog
from ezat_compat.console import ForwardedPrefix
from ezat_compat.console import register as register_console
from ezat_compat.console.errors import is_console_path, render_console_error
from ezat_compat.console.security import STATE as CONSOLE_STATE
from ezat_compat.cooldowns import make_cooldowns
from ezat_compat.datafiles import data_folder
from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.dialects.openai_chat import OpenAIChat
from ezat_compat.domain import Config
from ezat_compat.errors import GatewayError, InvalidRequestError, MethodNotAllowedError, RouteNotFoundError
from ezat_compat.limits import RateLimits
from ezat_compat.pipeline import Gateway, health_key
from ezat_compat.sealing import load_sealer
from ezat_compat.server.drain import start_draining, stop_draining
from ezat_compat.server.forwarded import TrustedForwarded, parse_allow_list, trusted
from ezat_compat.server.logs import Outages, RequestLog
from ezat_compat.server.metrics import Metrics
from ezat_compat.server.readiness import Readiness, note_outage
from ezat_compat.server.telemetry import Tracing
from ezat_compat.store.store import Store, embedded_limits_path, open_store
from ezat_compat.translate.cache_scope import SCOPE_KEY_PURPOSE, CacheScopes
from ezat_compat.upstream.client import UpstreamClient
from ezat_compat.upstream.images import ImageFetcher

if TYPE_CHECKING:  # imported when [identity] jwt_bearers = true only (``_bearer_tokens``)
    from ezat_compat.idp.bearer import BearerTokens

log = logging.getLogger("ezat_compat")
__all__ = ["create_app", "data_folder", "embedded_limits_path", "start_draining", "stop_draining"]
METRICS_PORT_ROUTES = ("/metrics", "/healthz", "/readyz")  # what ``[server] metrics_bind`` serves
ANTHROPIC_PREFIX = "/v1/"
ANTHROPIC = AnthropicMessages()
OPENAI = OpenAIChat()


def build_gateway(config: Config, store: Store) -> Gateway:
    """Every collaborator of the gateway core, for this process, on its ``store``."""
    gw_cfg = config.gateway
    assert store.counters is not None and store.thinking is not None, "the gateway's kind of store"
    cooldowns = make_cooldowns(
        gw_cfg.redis_url,
        failures=gw_cfg.cooldown_failures,
        cooldown_s=gw_cfg.cooldown_s,
        max_cooldown_s=gw_cfg.max_cooldown_s,
    )
    metrics = Metrics()
    labels = {health_key(m, d): (m.id, d.name) for m in config.models for d in m.deployments}
    metrics.watch_cooldowns(lambda: cooldowns.cooling(time.time()), labels)
    if gw_cfg.allow_private_image_hosts:
        log.warning(
            "allow_private_image_hosts = true: image URLs may reach loopback and private "
            "addresses. Use this in tests only."
        )
    return Gateway(
        config,
        catalog=Catalog(config.models, created=int(time.time())),
        accounts=store.accounts,
        ledger=store.ledger,
        limits=RateLimits(counters=store.counters),
        cooldowns=cooldowns,
        upstream=UpstreamClient(
            connect_timeout_s=gw_cfg.connect_timeout_s,
            stream_idle_timeout_s=gw_cfg.stream_idle_timeout_s,
            pool_size=config.server.worker_connections,
            ca_file=gw_cfg.ca_file,
            max_body_bytes=int(gw_cfg.max_upstream_body_mb * 1024 * 1024),
        ),
        images=ImageFetcher(
            threads=gw_cfg.image_fetch_threads,
            allow_private=gw_cfg.allow_private_image_hosts,
            org_threads=gw_cfg.image_fetch_org_threads,
            decode_threads=gw_cfg.image_decode_threads,
            request_threads=gw_cfg.image_fetch_request_threads,
            extra_ca_files=(gw_cfg.ca_file,) if gw_cfg.ca_file else (),
        ),
        metrics=metrics,
        thinking=store.thinking,
        # keyed by the sealing key (every node that shares it gives an organisation one scope)
        cache_scopes=(
            CacheScopes(load_sealer(data_folder(config)).derive(SCOPE_KEY_PURPOSE))
            if gw_cfg.isolate_prompt_cache
            else None
        ),
        # [telemetry]: the traces of each request (None: off, and opentelemetry is never imported)
        tracing=Tracing(config.telemetry) if config.telemetry.enabled else None,
        bearers=_bearer_tokens(config, store),
    )


def _bearer_tokens(config: Config, store: Store) -> BearerTokens | None:
    """The IdP's JWTs as bearers on the inference routes: with ``[identity] jwt_bearers = true``
    only (else None, and nothing of it is imported)."""
    if not config.identity.jwt_bearers or store.people is None:
        return None
    from ezat_compat.idp.bearer import BearerTokens
    from ezat_compat.idp.oidc import OidcClient

    return BearerTokens(OidcClient(config.identity), store.people, store.accounts, config.identity)


def _render(err: GatewayError) -> Response:
    """The error in the envelope of the dialect the path belongs to (routing 404/405 included);
    the admin API's is Anthropic's, with ``x-should-retry: false`` on a 4xx."""
    record = g.get("record")
    if record is not None:
        record.note_error(err)
    if is_admin_path(request.path):
        status, admin_body, headers = render_admin_error(err, getattr(g, "request_id", None))
        return json_response(admin_body, status, headers)
    dialect = clouds_api.error_dialect(request.path) or (
        ANTHROPIC if request.path.startswith(ANTHROPIC_PREFIX) else OPENAI
    )
    status, body, headers = dialect.render_error(err, getattr(g, "request_id", None))
    return raw_json_response(body, status, headers)


def _http_error(exc: HTTPException) -> GatewayError:
    if is_admin_path(request.path):
        return from_http_exception(exc, request.method, request.path)
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


def unexpected_error(request_id: str | None) -> GatewayError:
    """What the client gets for a bug: a 500 that quotes the request id, nothing internal."""
    return GatewayError(f"The gateway failed to process the request; quote request id {request_id or '?'} to support.")


def _noted_outage(exc: BaseException) -> bool:
    """An outage of the database or Redis is logged once per incident (``Outages``), not per request."""
    readiness: Readiness = current_app.extensions["ezat_readiness"]
    return note_outage(readiness, exc)


def _let_go(err: BaseException) -> None:
    """Drop the tracebacks of an answered error and of the errors it came from. A frame that
    raised an error it also keeps (the failover loop's last upstream error) makes a reference
    cycle, which keeps every frame of the request (its parsed body: hundreds of MB for a 30 MB
    request) alive until the cyclic collector happens by; the answer is written, the frames
    are no longer needed."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        exc.__traceback__ = None
        todo += [exc.__cause__, exc.__context__]


def _console_page() -> bool:
    """Whether the error of this request is answered with the console's HTML page (a console
    path, on an app that serves the console)."""
    return CONSOLE_STATE in current_app.extensions and is_console_path(request.path)


def _register_errors(app: Flask) -> None:
    @app.errorhandler(GatewayError)
    def gateway_error(err: GatewayError) -> Response:
        if err.status >= 500:
            _noted_outage(err)
        try:
            return render_console_error(err) if _console_page() else _render(err)
        finally:
            _let_go(err)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        if _console_page():
            return render_console_error(exc)
        return _render(_http_error(exc))

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        try:
            if not _noted_outage(exc):
                log.exception("unexpected error in request %s", getattr(g, "request_id", "?"))
            if _console_page():
                return render_console_error(exc)
            return _render(unexpected_error(getattr(g, "request_id", None)))
        finally:
            _let_go(exc)  # logged: its frames (the request's body among them) can go at once


def metrics_listener(metrics_bind: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a request (its WSGI environ) came in on the ``metrics_bind`` listener: asked of
    the socket itself (gunicorn's ``gunicorn.socket``), never of the Host header."""
    unix = metrics_bind[len("unix:") :] if metrics_bind.startswith("unix:") else None
    port = metrics_bind.rpartition(":")[2]

    def on_metrics_listener(environ: Mapping[str, Any]) -> bool:
        sock = environ.get("gunicorn.socket")
        if sock is None:
            return False
        try:
            local = sock.getsockname()
        except OSError:
            return False
        if isinstance(local, str | bytes):
            return unix is not None and os.fsdecode(local) == unix
        return unix is None and str(local[1]) == port

    return on_metrics_listener


def _register_request_log(app: Flask, config: Config, store: Store | None) -> RequestLog:
    outages = Outages(log)
    ledger = getattr(gateway(), "ledger", None)  # a prepared gateway core (tests) may have none
    app.extensions["ezat_readiness"] = Readiness(
        config.gateway.database_url,
        config.gateway.redis_url,
        outages,
        hot=getattr(ledger, "hot", None),
        backlog=getattr(ledger, "pending", None),
        probe_engine=store.probe_engine if store is not None else None,
    )
    request_log = RequestLog(gateway().metrics, config.logging.format, outages)

    @app.before_request
    def start_record() -> None:
        req, context = unproxied(request), unproxied(g)  # read several times: not through the proxies
        rid = context.request_id = new_request_id()
        context.record = request_log.start(
            rid, req.method, req.path, req.remote_addr or "", req.endpoint or "unmatched"
        )

    @app.after_request
    def finish_record(response: Response) -> Response:
        context = unproxied(g)
        rid = context.request_id
        response.headers["request-id"] = rid
        response.headers["x-request-id"] = rid  # what the OpenAI SDKs read (``_request_id``)
        context.record.answered(response.status_code)
        return response

    @app.teardown_request
    def finish_unfinished(_exc: BaseException | None) -> None:
        record = g.get("record")
        if record is not None:
            record.unanswered()
        memory.after_request_of(request.content_length or 0)  # a 30 MB body's pages go back

    return request_log


def _register_public(app: Flask, config: Config) -> None:
    on_metrics_listener = metrics_listener(config.server.metrics_bind) if config.server.metrics_bind else None

    @app.get("/healthz")
    def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        readiness: Readiness = current_app.extensions["ezat_readiness"]
        status, body = readiness.status()
        return json_response(body, status, {"cache-control": "no-store"})

    @app.get("/metrics")
    def metrics() -> Response:
        if on_metrics_listener is not None and not on_metrics_listener(request.environ):
            raise NotFound()  # served on [server] metrics_bind only
        data, content_type = gateway().metrics.render()
        return Response(data, content_type=content_type)

    if on_metrics_listener is not None:

        @app.before_request
        def metrics_listener_serves_metrics_only() -> None:
            if request.path not in METRICS_PORT_ROUTES and on_metrics_listener(request.environ):
                raise NotFound()

    @app.get("/api/models")
    def public_models() -> Response:
        return json_response(gateway().catalog.public_catalog())


def _register_admin(app: Flask, config: Config, store: Store) -> None:
    """The admin API and the console, on ``[admin] bind`` (which then serves them and ``/healthz``
    only) and on the main listener when ``on_main_listener``; not at all when neither."""
    settings = config.admin
    if not settings.bind and not settings.on_main_listener:
        return
    admin_api.register(app, config, store)
    register_console(app, config, store)
    if not settings.bind:
        return
    on_admin_listener = metrics_listener(settings.bind)  # the same question of the socket
    on_main_too = settings.on_main_listener

    @app.before_request
    def admin_listener_serves_admin_only() -> None:
        req = unproxied(request)  # every request passes here: one context lookup, not three
        path = req.path
        if is_admin_path(path) or is_console_path(path):
            if not on_main_too and not on_admin_listener(req.environ):
                raise NotFound()  # served on [admin] bind only
        elif path != "/healthz" and on_admin_listener(req.environ):
            raise NotFound()


def create_app(config: Config, *, gateway_core: Gateway | None = None, store: Store | None = None) -> Flask:
    """The WSGI app for ``config``: the process's store (``open_store``, or ``store``), the
    gateway core on it (or ``gateway_core``: prepared collaborators), the dialects with their
    stores, the blueprints. ``app.extensions["ezat_store"]`` is the store, for whoever closes it."""
    app = Flask("ezat_compat")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    if gateway_core is None:
        store = store or open_store(config.gateway.database_url, config=config)
        gateway_core = build_gateway(config, store)
    app.extensions["ezat"] = gateway_core
    app.extensions["ezat_store"] = store
    anthropic_api.install(app, store.threads if store is not None else None)
    if store is not None:  # a prepared gateway core (tests) installs its own Responses dialect
        responses_api.install(app, config, store.responses)
    with app.app_context():
        _register_request_log(app, config, store)
    app.register_blueprint(openai_api.bp)
    app.register_blueprint(responses_api.bp)
    app.register_blueprint(anthropic_api.bp)
    app.register_blueprint(clouds_api.bedrock_bp)
    app.register_blueprint(clouds_api.vertex_bp)
    _register_public(app, config)
    if store is not None:
        oauth_api.register(app, config, store)  # /oauth/…: the device grant, when [identity] issuer is set
        _register_admin(app, config, store)
    _register_errors(app)
    app.wsgi_app = TrustedForwarded(app.wsgi_app, config.server.forwarded_allow_ips)  # type: ignore[method-assign]
    if CONSOLE_STATE in app.extensions:  # outside TrustedForwarded: it asks the proxy's own address
        allow = parse_allow_list(config.server.forwarded_allow_ips)
        app.wsgi_app = ForwardedPrefix(app.wsgi_app, lambda peer: trusted(peer, allow))  # type: ignore[method-assign]
    return app


def app_from_environment(**overrides: Any) -> Flask:
    """For ``wsgi.py``: the config named by ``EZAT_CONFIG`` (or ./ezat.toml)."""
    from ezat_compat.config import load_config, resolve_config_path

    return create_app(load_config(resolve_config_path(None)), **overrides)
