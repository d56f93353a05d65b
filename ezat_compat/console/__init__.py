"""The web console (``/console/…``): people sign in with the company's identity provider and see,
hand out and cap the gateway's use, in server-rendered pages (docs/console.md).

- ``auth``: the blueprint "console": sign-in (OpenID Connect, ``oidc``), break-glass links,
  sign-out, the static files and templates;
- ``security``: the guard every console blueprint gets (session, timeouts, CSRF, headers) and the
  sign-in rate limit;
- ``access``: the signed-in ``Person`` and what they may see and change (``require_view``,
  ``require_change``: the ``AdminContext`` every change passes to ``admin/service.py``);
- ``errors``: the HTML error pages;
- ``pages`` (the blueprint "console_pages"): the overview, organisations, keys, limits, usage,
  audit and deployments.

``register`` serves it on an app, wherever the admin API is served (app.py ``_register_admin``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from flask import Blueprint, Flask, Response, g, request, url_for
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from flask.wrappers import Request
from werkzeug.exceptions import BadRequest
from werkzeug.routing import BuildError

from ezat_compat.console import auth, security
from ezat_compat.console.access import PERSON_KEY, Person, csrf_field
from ezat_compat.console.errors import is_console_path, render_console_error
from ezat_compat.console.proxy import ForwardedPrefix
from ezat_compat.datafiles import data_folder
from ezat_compat.domain import Config
from ezat_compat.idp.oidc import OidcClient
from ezat_compat.sealing import load_sealer
from ezat_compat.store.accounts import StoreError
from ezat_compat.store.store import Store

__all__ = ["ForwardedPrefix", "register"]

PAGES_MODULE = "ezat_compat.console.pages"
FLASH_KEY_PURPOSE = b"console flash messages"  # what the app's secret key is derived for
FLASH_COOKIE = "ezat_console_flash"


def _import(name: str) -> ModuleType | None:
    """The module ``name``; None while it doesn't exist (a part of the console that isn't in this
    build), any other import error raised."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def console_url(endpoint: str, fallback: str = "", **values: Any) -> str:
    """``url_for(endpoint)``, else the console's ``fallback`` path under the script root (a page
    of a blueprint that isn't in this build)."""
    try:
        return url_for(endpoint, **values)
    except BuildError:
        return request.script_root + "/console/" + fallback


def signed_in_person() -> Person | None:
    """The signed-in person of this request, if the guard found one (templates: the header)."""
    found: Person | None = g.get(PERSON_KEY)
    return found


class _ConsoleCookie(SecureCookieSessionInterface):
    """Flask's signed-cookie session, opened on the console's pages only: any other request (an
    inference, the admin API) gets Flask's null session, without a serializer made for it or a
    cookie looked for."""

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if not is_console_path(request.path):
            return None  # Flask makes its null session
        return super().open_session(app, request)


def _flash_messages(app: Flask, config: Config) -> None:
    """Flask's flashed messages (a signed cookie of their own, ``ezat_console_flash``, read on the
    console's pages only) for the pages' "done" notes: the app's secret key is derived from the
    sealing key, the same on every worker and node. Sessions are never kept in it
    (``store/console.py`` keeps them)."""
    app.session_interface = _ConsoleCookie()
    if not app.secret_key:
        app.secret_key = load_sealer(data_folder(config)).derive(FLASH_KEY_PURPOSE)
    app.config.update(
        SESSION_COOKIE_NAME=FLASH_COOKIE,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=config.console.secure_cookies,
    )


def _store_refused(exc: StoreError) -> Response:
    """A value the store refuses, raised by a console view: the 400 page that names it (the
    admin API's own handler would answer in its JSON envelope)."""
    return render_console_error(BadRequest(str(exc)))


def _serve(app: Flask, bp: Blueprint) -> None:
    """Register ``bp`` on ``app``, guarded, its store refusals as pages."""
    bp.register_error_handler(StoreError, _store_refused)
    app.register_blueprint(security.guard(bp))


def register(app: Flask, config: Config, store: Store) -> None:
    """Serve the console on ``app``: the blueprint "console" (sign-in, static files, templates)
    and the pages' "console_pages", both guarded; the templates' globals (``csrf_field``,
    ``console_person``, ``console_url``)."""
    security.install(app, config.console, store)
    _flash_messages(app, config)
    app.extensions[auth.OIDC] = OidcClient(config.identity) if config.identity.enabled else None
    _serve(app, auth.blueprint())
    pages = _import(PAGES_MODULE)
    if pages is not None:
        _serve(app, pages.blueprint())
    app.jinja_env.globals.update(csrf_field=csrf_field, console_person=signed_in_person, console_url=console_url)
