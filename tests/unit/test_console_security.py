"""The console's guard and sign-in decisions without an identity provider: roles from groups, who
sees and changes what, session liveness, the cookies' flags and path (behind a proxy's prefix
too), CSRF, the HTML error pages and headers, the listener the console is served on, and the
``[identity]``/``[console]`` configuration."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask import request as flask_request
from flask.testing import FlaskClient
from markupsafe import escape

from ezat_compat.app import create_app
from ezat_compat.config import ConfigError, parse_config
from ezat_compat.console import access
from ezat_compat.console.access import Person
from ezat_compat.console.auth import groups_of, role_of
from ezat_compat.console.proxy import ForwardedPrefix
from ezat_compat.console.security import CLOCK, COOKIE_NAME, CSP, alive
from ezat_compat.domain import Config, ConsoleSettings, IdentitySettings
from ezat_compat.store.console import ConsoleSession
from ezat_compat.store.store import Store
from tests.support.console import signed_in
from tests.support.migrated import migrated_sqlite

NOW = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)
MODELS = [
    {
        "id": "m",
        "aliases": [],
        "price": {"input": 1, "output": 1},
        "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "x"}],
    }
]
IDENTITY = IdentitySettings(
    issuer="https://idp.example.com",
    client_id="gw",
    admins=("platform-admins",),
    viewers=("finance",),
    org_admins=(("team-a-leads", "team-a"), ("team-b-leads", "team-b")),
)


# ---------------------------------------------------------------- roles and access


@pytest.mark.parametrize(
    ("groups", "role", "orgs"),
    [
        ((), None, ()),
        (("interns",), None, ()),
        (("finance",), "viewer", ()),
        (("team-a-leads",), "org_admin", ("team-a",)),
        (("team-a-leads", "team-b-leads", "finance"), "org_admin", ("team-a", "team-b")),
        (("finance", "platform-admins", "team-a-leads"), "admin", ()),
    ],
    ids=["none", "unmapped", "viewer", "org-admin", "org-admin-of-two-wins-over-viewer", "admin-wins"],
)
def test_the_widest_role_the_groups_give(groups: tuple[str, ...], role: str | None, orgs: tuple[str, ...]) -> None:
    assert role_of(groups, IDENTITY) == (role, orgs)


@pytest.mark.parametrize(
    ("claims", "groups"),
    [
        ({"groups": ["a", "b"]}, {"a", "b"}),
        ({"groups": "a"}, {"a"}),
        ({"groups": None}, set()),
        ({}, set()),
        ({"groups": [{"nested": 1}, "a"]}, {"a"}),
    ],
    ids=["list", "one-string", "null", "absent", "junk-ignored"],
)
def test_groups_of_the_claim(claims: dict[str, Any], groups: set[str]) -> None:
    assert groups_of(claims, "groups") == groups


def _person(role: str, org_ids: tuple[int, ...] = (), subject: str = "alice") -> Person:
    return Person(subject, "Alice", "a@example.com", role, frozenset(org_ids), "cs_1")


@pytest.mark.parametrize(
    ("who", "org_id", "sees", "changes"),
    [
        (_person("admin"), None, True, True),
        (_person("admin"), 5, True, True),
        (_person("viewer"), None, True, False),
        (_person("viewer"), 5, True, False),
        (_person("org_admin", (5,)), 5, True, True),
        (_person("org_admin", (5,)), 6, False, False),
        (_person("org_admin", (5,)), None, False, False),
    ],
    ids=[
        "admin-global",
        "admin-org",
        "viewer-global",
        "viewer-org",
        "org-admin-own",
        "org-admin-other",
        "org-admin-global",
    ],
)
def test_who_sees_and_changes_what(who: Person, org_id: int | None, sees: bool, changes: bool) -> None:
    assert (who.sees(org_id), who.changes(org_id)) == (sees, changes)


def test_the_audit_trails_author() -> None:
    assert _person("admin").actor == "sso:alice"
    assert _person("admin", subject="breakglass:bgl_1").actor == "breakglass:bgl_1"


def _session(created: datetime, seen: datetime, ended: datetime | None = None) -> ConsoleSession:
    return ConsoleSession("cs_1", "alice", "", "", "admin", frozenset(), "t", "", created, seen, ended)


SETTINGS = ConsoleSettings(idle_timeout_s=600, absolute_timeout_s=3600)


@pytest.mark.parametrize(
    ("session", "at", "is_alive"),
    [
        (_session(NOW, NOW), NOW + timedelta(seconds=599), True),
        (_session(NOW, NOW), NOW + timedelta(seconds=600), False),
        (_session(NOW, NOW + timedelta(seconds=3500)), NOW + timedelta(seconds=3599), True),
        (_session(NOW, NOW + timedelta(seconds=3500)), NOW + timedelta(seconds=3600), False),
        (_session(NOW, NOW, ended=NOW), NOW, False),
        (None, NOW, False),
    ],
    ids=["used", "idle", "busy", "absolute", "ended", "none"],
)
def test_a_session_is_alive_until_a_timeout_or_its_end(
    session: ConsoleSession | None, at: datetime, is_alive: bool
) -> None:
    assert alive(session, at, SETTINGS) is is_alive


def test_the_csrf_field_is_escaped() -> None:
    app = Flask("t")
    with app.test_request_context("/console/"):
        from flask import g

        g.console_csrf = '"><script>'
        field = str(access.csrf_field())
    assert field == f'<input type="hidden" name="csrf_token" value="{escape(chr(34) + "><script>")}">'
    assert "<script>" not in field


# ---------------------------------------------------------------- the proxy's prefix


def _echo(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [f"{environ.get('SCRIPT_NAME', '')}|{environ['wsgi.url_scheme']}|{environ.get('HTTP_HOST', '')}".encode()]


@pytest.mark.parametrize(
    ("peer", "path", "headers", "seen"),
    [
        (
            "127.0.0.1",
            "/console/keys",
            {"PREFIX": "/gw/", "PROTO": "https", "HOST": "ezat.example.com"},
            "/gw|https|ezat.example.com",
        ),
        ("10.0.0.9", "/console/keys", {"PREFIX": "/gw", "PROTO": "https", "HOST": "evil"}, "|http|gw"),
        ("127.0.0.1", "/v1/chat/completions", {"PREFIX": "/gw", "PROTO": "https"}, "|http|gw"),
        ("127.0.0.1", "/console/", {"PREFIX": '/gw"><', "PROTO": "gopher", "HOST": "a b"}, "|http|gw"),
    ],
    ids=["trusted", "untrusted-peer", "not-the-console", "malformed"],
)
def test_the_proxys_prefix_scheme_and_host(peer: str, path: str, headers: dict[str, str], seen: str) -> None:
    app = ForwardedPrefix(_echo, lambda address: address == "127.0.0.1")
    environ = {"REMOTE_ADDR": peer, "PATH_INFO": path, "wsgi.url_scheme": "http", "HTTP_HOST": "gw"}
    environ.update({f"HTTP_X_FORWARDED_{k}": v for k, v in headers.items()})
    body = b"".join(app(environ, lambda *_: None))
    assert body.decode() == seen


# ---------------------------------------------------------------- the app


def _config(tmp_path: Path, **sections: Any) -> Config:
    data = {
        "gateway": {"database_url": migrated_sqlite(tmp_path / "ezat.db")},
        "admin": {"bind": "", "on_main_listener": True},
        "models": MODELS,
        **sections,
    }
    return parse_config(data, path=str(tmp_path / "ezat.toml"), environ={})


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    app = create_app(_config(tmp_path, console={"secure_cookies": True}))
    app.extensions[CLOCK] = lambda: NOW
    yield app
    app.extensions["ezat_store"].close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def _store(app: Flask) -> Store:
    store: Store = app.extensions["ezat_store"]
    return store


def test_without_an_idp_the_sign_in_page_points_to_console_link(client: FlaskClient) -> None:
    page = client.get("/console/sign-in")
    assert page.status_code == 200 and "ezat-compat console-link" in page.text
    assert "Sign in with your identity provider" not in page.text
    assert page.headers["Content-Security-Policy"] == CSP and page.headers["X-Frame-Options"] == "DENY"
    login = client.get("/console/auth/login")
    assert login.status_code == 303 and login.headers["Location"].endswith("/console/sign-in?reason=no-idp")


def test_a_person_without_a_session_is_sent_to_sign_in(client: FlaskClient) -> None:
    response = client.post("/console/sign-out", data={"csrf_token": "x"})
    assert response.status_code == 303 and response.headers["Location"] == "/console/sign-in"


def test_the_session_cookie_is_secure_httponly_lax_on_the_consoles_path(app: Flask, client: FlaskClient) -> None:
    token, _, _ = _store(app).console.create_link(created_by="cli:test", now=NOW)  # type: ignore[union-attr]
    landed = client.get(f"/console/auth/link/{token}", headers={"X-Forwarded-Prefix": "/gw"})
    assert landed.status_code == 303 and landed.headers["Location"].startswith("/gw/console")
    cookie = landed.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    for flag in ("Secure", "HttpOnly", "SameSite=Lax", "Path=/gw/console"):
        assert flag in cookie.split("; "), (flag, cookie)
    assert "Expires" not in cookie and "Max-Age" not in cookie  # a session cookie of the browser


@pytest.mark.parametrize(
    ("path", "cookie_session"),
    [("/console", True), ("/console/keys", True), ("/openai/v1/chat/completions", False), ("/v1/messages", False),
     ("/admin/v1/organizations", False), ("/consoles", False)],
)  # fmt: skip
def test_flasks_cookie_session_is_opened_on_the_consoles_pages_only(
    app: Flask, path: str, cookie_session: bool
) -> None:
    """The flashed messages' signed cookie is the console's: another request gets Flask's null
    session (no serializer made, no cookie read), even when it brings the cookie."""
    with app.test_request_context(path, headers={"Cookie": "ezat_console_flash=forged"}):
        opened = app.session_interface.open_session(app, flask_request)
    assert (opened is not None) is cookie_session


def test_signing_out_takes_the_sessions_csrf_token(app: Flask, client: FlaskClient) -> None:
    session = signed_in(client, _store(app), role="viewer", now=NOW)
    assert client.post("/console/sign-out", data={"csrf_token": "forged"}).status_code == 400
    out = client.post("/console/sign-out", data={"csrf_token": session.csrf_token})
    assert out.status_code == 303
    ended = _store(app).console.get_session(session.public_id)  # type: ignore[union-attr]
    assert ended is not None and ended.ended_at == NOW
    audit = _store(app).admin.entries(limit=10)  # type: ignore[union-attr]
    assert [(e.action, e.actor) for e in audit][:1] == [("console.sign_out", "sso:test-viewer")]


@pytest.mark.parametrize(
    ("path", "status", "heading"),
    [("/console/no-such-page", 404, "Not found"), ("/console/auth/link/unknown", 400, "Bad request")],
)
def test_errors_on_console_paths_are_html_pages(client: FlaskClient, path: str, status: int, heading: str) -> None:
    page = client.get(path)
    assert page.status_code == status and page.mimetype == "text/html"
    assert f"<h1>{heading}</h1>" in page.text
    assert page.headers["Content-Security-Policy"] == CSP and page.headers["Cache-Control"] == "no-store"
    assert client.get("/v1/no-such-route").mimetype == "application/json"  # the APIs keep their envelopes


def test_an_unreachable_idp_is_a_502_page(tmp_path: Path) -> None:
    config = _config(tmp_path, identity={"issuer": "http://127.0.0.1:9", "client_id": "gw"})
    app = create_app(config)
    try:
        page = app.test_client().get("/console/auth/login")
        assert page.status_code == 502 and "try again in a moment" in page.text
    finally:
        app.extensions["ezat_store"].close()


class _Socket:
    def __init__(self, port: int) -> None:
        self.port = port

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_the_console_is_served_on_the_admin_listener_only(tmp_path: Path) -> None:
    app = create_app(_config(tmp_path, admin={"bind": "127.0.0.1:8081"}))
    try:
        client = app.test_client()
        main = client.get("/console/sign-in", environ_overrides={"gunicorn.socket": _Socket(8080)})
        assert main.status_code == 404 and main.mimetype == "text/html"
        admin = client.get("/console/sign-in", environ_overrides={"gunicorn.socket": _Socket(8081)})
        assert admin.status_code == 200
        assert client.get("/v1/models", environ_overrides={"gunicorn.socket": _Socket(8081)}).status_code == 404
    finally:
        app.extensions["ezat_store"].close()


# ---------------------------------------------------------------- configuration


def test_identity_and_console_default_when_absent(tmp_path: Path) -> None:
    config = parse_config({"models": MODELS}, path=str(tmp_path / "ezat.toml"), environ={})
    assert config.identity == IdentitySettings() and not config.identity.enabled
    assert config.console == ConsoleSettings()


def test_the_client_secret_comes_from_its_variable_and_is_never_shown(tmp_path: Path) -> None:
    data = {
        "models": MODELS,
        "identity": {
            "issuer": "https://idp.example.com/realms/acme",
            "client_id": "gw",
            "client_secret_env": "MY_SECRET",
            "org_admins": {"leads": "team-a"},
            "admins": ["ops"],
        },
    }
    config = parse_config(data, path=str(tmp_path / "ezat.toml"), environ={"MY_SECRET": "s3cr3t-value"})
    identity = config.identity
    assert identity.client_secret == "s3cr3t-value" and identity.enabled
    assert identity.org_admins == (("leads", "team-a"),) and identity.admins == ("ops",)
    assert "s3cr3t-value" not in repr(config) and "s3cr3t-value" not in repr(identity)


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        (
            "identity",
            {"issuer": "http://idp.example.com", "client_id": "x"},
            "identity.issuer: The issuer must be https",
        ),
        ("identity", {"issuer": "https://idp.example.com"}, "identity.client_id: Required with an issuer"),
        ("identity", {"issuer": "https://idp.example.com?x=1", "client_id": "x"}, "no query or fragment"),
        ("identity", {"scopes": "email"}, "identity.scopes: Must include openid"),
        ("identity", {"isuer": "https://idp.example.com"}, "identity.isuer: Unknown field."),
        (
            "console",
            {"idle_timeout_s": 3600, "absolute_timeout_s": 600},
            "console.absolute_timeout_s: Must be at least",
        ),
        ("console", {"idle_timeout_s": 10}, "console.idle_timeout_s"),
        ("console", {"secure_cookie": False}, "console.secure_cookie: Unknown field."),
    ],
    ids=[
        "http-issuer",
        "no-client-id",
        "issuer-query",
        "no-openid",
        "typo",
        "absolute-below-idle",
        "too-short",
        "typo-console",
    ],
)
def test_a_bad_identity_or_console_table_is_named(
    tmp_path: Path, section: str, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        parse_config({"models": MODELS, section: values}, path=str(tmp_path / "ezat.toml"), environ={})


def test_a_bug_in_a_console_view_is_a_500_page_that_quotes_the_request_id(tmp_path: Path) -> None:
    app = create_app(_config(tmp_path))

    def boom() -> str:
        raise RuntimeError("secret internals")

    app.add_url_rule("/console/boom", "boom", boom)
    try:
        page = app.test_client().get("/console/boom")
        assert page.status_code == 500 and page.mimetype == "text/html"
        assert "secret internals" not in page.text and page.headers["request-id"] in page.text
        assert page.headers["Content-Security-Policy"] == CSP
    finally:
        app.extensions["ezat_store"].close()
