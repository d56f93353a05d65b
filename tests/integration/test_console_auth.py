"""Signing in to the console against a real OpenID Connect provider on loopback
(oidc-provider-mock, tests/support/oidc.py), driven with ``requests`` one redirect at a time as a
browser would follow them: the gateway's app served by werkzeug in this process, so the test can
move the console's clock (``security.CLOCK``) and read its store (the ``console`` fixture and the
``Browser`` of tests/support/console_auth.py).

What is held: the authorization request carries PKCE (S256 of the verifier kept on the server),
a state and a nonce; a wrong state, a replayed callback, a callback in another browser and an ID
token with another nonce are refused; groups map to roles (and no role is a 403 page); idle and
absolute timeouts end a session; signing out ends it on the server; a POST without the session's
CSRF token is refused; sign-in attempts are limited per address (429 page); a break-glass link
signs in once; the cookies' flags and the security headers; each sign-in, sign-out and link
leaves its audit row.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit, urlunsplit

import pytest
import requests
from sqlalchemy import select

from ezat_compat import cli
from ezat_compat.console.security import COOKIE_NAME, CSP
from ezat_compat.store.tables import console_logins
from tests.support.console_auth import ABSOLUTE_S, ATTEMPTS, IDLE_S, Browser, Console

# The console on loopback, and its clock put back before each test: pytest finds them here.
from tests.support.console_auth import console as console
from tests.support.console_auth import wall_clock as wall_clock

pytestmark = pytest.mark.integration


def _query(url: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query=urlencode({**_query(url), **changes})))


def _audit(console: Console, action: str) -> list[dict[str, Any]]:
    trail = console.store.admin.entries(limit=1000)  # type: ignore[union-attr]
    return [e.to_json() for e in trail if e.action == action]


# ---------------------------------------------------------------- the flow


def test_an_admin_signs_in_with_pkce_state_and_nonce(console: Console) -> None:
    browser = Browser(console)
    authorize = browser.begin()
    sent = _query(authorize)
    assert sent["response_type"] == "code" and sent["client_id"] == console.idp.client_id
    assert sent["redirect_uri"] == console.url + "/console/auth/callback"
    assert set(sent["scope"].split()) == {"openid", "email", "profile"}
    assert len(sent["state"]) >= 32 and len(sent["nonce"]) >= 32 and sent["state"] != sent["nonce"]
    assert sent["code_challenge_method"] == "S256"
    with console.store.engine.connect() as conn:
        verifiers = list(conn.execute(select(console_logins.c.code_verifier)).scalars())
    challenges = {
        base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b"=").decode() for v in verifiers
    }
    assert sent["code_challenge"] in challenges  # S256 of a verifier the server keeps, never the verifier
    assert sent["code_challenge"] not in verifiers
    # The login cookie binds the sign-in to this browser: HttpOnly, Lax, on the console's path.
    (binding,) = [c for c in browser.session.cookies if c.name == "ezat_console_login"]
    assert binding.path == "/console/auth" and binding.has_nonstandard_attr("HttpOnly")

    landed = browser.get(browser.callback_url(authorize, "alice"))
    assert landed.status_code == 303 and landed.headers["Location"].endswith("/console/")
    set_cookie = landed.headers["Set-Cookie"]
    assert f"{COOKIE_NAME}=" in set_cookie
    assert "HttpOnly" in set_cookie and "SameSite=Lax" in set_cookie and "Path=/console" in set_cookie
    assert "Secure" not in set_cookie  # [console] secure_cookies = false (plain HTTP on loopback)
    assert browser.signed_in()
    (session,) = console.sessions_of("alice")
    assert (session.role, session.name, session.email) == ("admin", "Alice Admin", "alice@example.com")
    signed = [e for e in _audit(console, "console.sign_in") if e["actor"] == "sso:alice"]
    assert signed and signed[0]["target"] == {"type": "console_session", "id": session.public_id}
    assert signed[0]["address"] == browser.headers["X-Forwarded-For"]


def test_groups_map_to_roles_and_no_role_is_refused(console: Console) -> None:
    team_a = console.store.accounts.find_org("team-a")
    assert team_a is not None
    assert Browser(console).sign_in("bob").status_code == 303  # team-a-leads and finance: org admin wins
    (bob,) = console.sessions_of("bob")
    assert (bob.role, bob.org_ids) == ("org_admin", frozenset({team_a.id}))
    assert Browser(console).sign_in("carol").status_code == 303
    (carol,) = console.sessions_of("carol")
    assert (carol.role, carol.org_ids) == ("viewer", frozenset())

    refused = Browser(console)
    page = refused.sign_in("dave")
    assert page.status_code == 403 and "text/html" in page.headers["Content-Type"]
    assert "<h1>Not allowed</h1>" in page.text
    assert COOKIE_NAME not in refused.session.cookies and not console.sessions_of("dave")
    assert [e["actor"] for e in _audit(console, "console.sign_in_refused")] == ["sso:dave"]


def test_a_wrong_state_is_refused(console: Console) -> None:
    browser = Browser(console)
    callback = browser.callback_url(browser.begin(), "alice")
    forged = browser.get(_with_query(callback, state="not-the-state-we-sent"))
    assert forged.status_code == 400 and "The sign-in failed" in forged.text
    assert COOKIE_NAME not in browser.session.cookies


def test_a_replayed_callback_is_refused(console: Console) -> None:
    browser = Browser(console)
    callback = browser.callback_url(browser.begin(), "alice")
    assert browser.get(callback).status_code == 303
    again = Browser(console)
    again.session.cookies.update({c.name: c.value for c in browser.session.cookies if c.name == "ezat_console_login"})
    assert again.get(callback).status_code == 400  # the same browser's binding, the same URL: used
    assert browser.get(callback).status_code == 400


def test_a_callback_in_another_browser_is_refused(console: Console) -> None:
    """Login CSRF: a callback URL planted in a victim's browser lacks the binding cookie."""
    attacker = Browser(console)
    callback = attacker.callback_url(attacker.begin(), "alice")
    victim = Browser(console)
    assert victim.get(callback).status_code == 400
    assert COOKIE_NAME not in victim.session.cookies


def test_an_id_token_with_another_nonce_is_refused(console: Console) -> None:
    browser = Browser(console)
    authorize = _with_query(browser.begin(), nonce="a-nonce-the-gateway-never-sent")
    refused = browser.get(browser.callback_url(authorize, "alice"))
    assert refused.status_code == 400 and "did not pass the checks" in refused.text
    assert COOKIE_NAME not in browser.session.cookies


def test_the_idp_refusing_is_refused(console: Console) -> None:
    browser = Browser(console)
    authorize = browser.begin()
    back = requests.post(authorize, data={"action": "deny"}, allow_redirects=False, timeout=10)
    assert back.status_code == 302
    refused = browser.get(urljoin(authorize, back.headers["Location"]))
    assert refused.status_code == 400 and COOKIE_NAME not in browser.session.cookies


# ---------------------------------------------------------------- sessions


def test_an_idle_session_ends(console: Console) -> None:
    browser = Browser(console)
    browser.sign_in("alice")
    console.clock.offset = timedelta(seconds=IDLE_S - 60)
    assert browser.signed_in()  # used: its idle time starts again
    console.clock.offset = timedelta(seconds=2 * IDLE_S - 120)
    assert browser.signed_in()
    console.clock.offset = timedelta(seconds=3 * IDLE_S)
    assert not browser.signed_in()
    (session,) = [s for s in console.sessions_of("alice") if s.ended_at is not None and s.ended_at > datetime.now(UTC)]
    assert session.ended_at is not None


def test_a_busy_session_ends_at_the_absolute_timeout(console: Console) -> None:
    browser = Browser(console)
    browser.sign_in("carol")
    for step in range(1, ABSOLUTE_S // (IDLE_S // 2)):
        console.clock.offset = timedelta(seconds=step * IDLE_S // 2)
        assert browser.signed_in(), step
    console.clock.offset = timedelta(seconds=ABSOLUTE_S)
    assert not browser.signed_in()
    # A request with the ended session's cookie is sent to the sign-in page, which says why.
    response = browser.post("/console/sign-out", {"csrf_token": "x"})
    assert response.status_code == 303 and "reason=expired" in response.headers["Location"]


def test_signing_out_ends_the_session_on_the_server(console: Console) -> None:
    browser = Browser(console)
    browser.sign_in("alice")
    cookie = browser.session.cookies.get(COOKIE_NAME)
    token = browser.csrf()
    out = browser.post("/console/sign-out", {"csrf_token": token})
    assert out.status_code == 303 and "reason=signed-out" in out.headers["Location"]
    assert COOKIE_NAME not in browser.session.cookies
    ended = console.store.console.find_session(cookie or "")  # type: ignore[union-attr]
    assert ended is not None and ended.ended_at is not None
    assert [e for e in _audit(console, "console.sign_out") if e["target"]["id"] == ended.public_id]
    thief = Browser(console)
    thief.session.cookies.set(COOKIE_NAME, cookie, path="/console")
    assert not thief.signed_in()
    page = thief.get("/console/sign-in")
    assert page.status_code == 200 and "Sign in with your identity provider" in page.text


def test_a_post_without_the_sessions_csrf_token_is_refused(console: Console) -> None:
    browser = Browser(console)
    browser.sign_in("alice")
    for data in ({}, {"csrf_token": ""}, {"csrf_token": "forged-" + browser.csrf()}):
        refused = browser.post("/console/sign-out", data)
        assert refused.status_code == 400, data
        assert "text/html" in refused.headers["Content-Type"] and refused.headers["Content-Security-Policy"] == CSP
    assert browser.signed_in()  # nothing happened


def test_sign_in_attempts_are_limited_per_address(console: Console) -> None:
    browser = Browser(console)
    for _ in range(ATTEMPTS):
        assert browser.get("/console/auth/login").status_code == 303
    refused = browser.get("/console/auth/login")
    assert refused.status_code == 429 and "<h1>Too many attempts</h1>" in refused.text
    assert refused.headers["Retry-After"] == "60"
    assert browser.get("/console/auth/link/whatever").status_code == 429
    assert Browser(console).get("/console/auth/login").status_code == 303  # another address


def test_a_break_glass_link_signs_in_once(console: Console, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--config", str(console.config_path), "console-link"]) == 0
    printed = capsys.readouterr()
    url = printed.out.strip().splitlines()[-1]
    assert "/console/auth/link/" in url and "good once" in printed.err
    path = urlsplit(url).path
    browser = Browser(console)
    landed = browser.get(path)
    assert landed.status_code == 303 and landed.headers["Location"].endswith("/console/")
    assert browser.signed_in()
    link_id = path.rsplit("/", 1)[1]
    (created,) = _audit(console, "console_link.create")[:1]
    assert created["actor"].startswith("cli:") and link_id not in str(created)  # the token is never kept
    subject = "breakglass:" + created["target"]["id"]
    (session,) = console.sessions_of(subject)
    assert session.role == "admin"
    assert [e["actor"] for e in _audit(console, "console_link.use")][:1] == [subject]
    again = Browser(console)
    used = again.get(path)
    assert used.status_code == 400 and COOKIE_NAME not in again.session.cookies


def test_the_console_pages_carry_the_security_headers(console: Console) -> None:
    browser = Browser(console)
    for path, status in (("/console/sign-in", 200), ("/console/no-such-page", 404)):
        response = browser.get(path)
        assert response.status_code == status
        assert response.headers["Content-Security-Policy"] == CSP
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["Referrer-Policy"] == "same-origin"
        assert response.headers["Cache-Control"] == "no-store"
        assert "text/html" in response.headers["Content-Type"]
