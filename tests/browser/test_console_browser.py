"""The console as the people around a gateway use it, in Chromium: a platform admin signs in
through the company's identity provider, hands out a key, watches it being used (the OpenAI SDK
against the gateway), rotates and revokes it, and finds each change in the audit trail under
their name; a team lead is refused the other team's pages; a viewer changes nothing; a person
the configuration maps to no role is refused; a forged form is refused; signing out ends the
session; the break-glass link signs in once.

The servers, the browser and the people are in conftest.py; every page visited is screenshotted
into ``test-results/console/``. ``EZAT_CONSOLE_DOCS_SHOT=1 pytest -n0 tests/browser -k every_page``
also rewrites docs/img/console-overview.png, the overview docs/console.md shows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.integration.harness import REPO
from tests.support.browser import (
    ADMIN,
    ORG_ADMIN,
    STRANGER,
    VIEWER,
    ConsoleGateway,
    Shots,
    assert_clean,
    not_allowed,
    prefix_proxy,
    sign_in,
    visit,
)
from tests.support.oidc import LoopbackIdP

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Locator, Page, Response

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]

MODEL = "claude-sonnet-5-5"
NAV = ("Overview", "Organisations", "Keys", "Limits", "Usage", "Audit", "Deployments")
COOKIE = "ezat_console"
DOCS_SHOT = REPO / "docs" / "img" / "console-overview.png"


# ---------------------------------------------------------------------------------------- helpers


def chat(gateway: ConsoleGateway, secret: str) -> str:
    """One chat completion through the gateway with the OpenAI SDK, as a client of the key would."""
    client = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=secret, max_retries=0, timeout=30)
    completion = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello"}])
    assert completion.choices[0].message.content, completion
    return completion.choices[0].message.content


def refused(gateway: ConsoleGateway, secret: str) -> int:
    """The status the gateway answers a key it refuses (the SDK raises)."""
    with pytest.raises(openai.APIStatusError) as caught:
        chat(gateway, secret)
    return caught.value.status_code


def usd(text: str) -> Decimal:
    """The first dollar amount of a text (``$0.0123``, ``$1,234.50``)."""
    found = re.search(r"\$\s*([0-9][0-9,]*(?:\.[0-9]+)?)", text)
    assert found, f"no dollar amount in {text!r}"
    return Decimal(found.group(1).replace(",", ""))


def eventually(check: Callable[[], bool], page: Page, what: str, timeout_s: float = 30) -> None:
    """Reload ``page`` until ``check()`` holds (the usage rollup may lag a request a little)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: still not so after {timeout_s} s on {page.url}"
        time.sleep(0.5)
        page.reload()


def follow(page: Page, target: Locator) -> Response | None:
    """Click a link or a form's button and wait for the page it leads to (redirects followed)."""
    with page.expect_navigation() as navigation:
        target.click()
    return navigation.value


def csrf_token(page: Page) -> str:
    """The session's CSRF token, as every POST form of the console carries it (sign-out's too)."""
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    assert token, f"no csrf_token field on {page.url}"
    return token


def table_rows(table: Locator) -> list[str]:
    return [" ".join(row.locator("td, th").all_text_contents()) for row in table.locator("tr:has(td)").all()]


def orgs(gateway: ConsoleGateway) -> dict[str, dict[str, Any]]:
    """The organisations (the admin API's workspaces) by name."""
    return {w["name"]: w for w in gateway.admin_api("GET", "/workspaces", params={"limit": 100})["data"]}


def org_ids(gateway: ConsoleGateway) -> dict[str, str]:
    """The organisations' public ids (``wrkspc_…``, what the console's URLs name) by name."""
    return {name: w["id"] for name, w in orgs(gateway).items()}


def key_ids(gateway: ConsoleGateway, org: str) -> dict[str, str]:
    """The organisation's keys: their names by id."""
    answer = gateway.admin_api("GET", "/api_keys", params={"workspace_id": org, "limit": 100})
    return {k["id"]: k["name"] for k in answer["data"]}


def new_key(gateway: ConsoleGateway, org: str, name: str) -> str:
    """A new key of ``org``, made through the admin API: its secret."""
    secret = gateway.admin_api("POST", "/api_keys", json={"workspace_id": org, "name": name})["secret"]
    assert isinstance(secret, str) and secret.startswith("ezat_sk_"), secret
    return secret


def same_key(a: str, b: str) -> bool:
    """Whether two spellings of a key's id name one key (``key_1a2b…``, the admin API's ``apikey_1a2b…``)."""
    return a.removeprefix("api") == b.removeprefix("api")


@contextmanager
def other_site(html: str) -> Iterator[str]:
    """A page on another origin (another loopback port) serving ``html``: the forger's site."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# ------------------------------------------------------------------------------------------ tests


def test_an_admin_hands_out_a_key_watches_it_used_rotates_and_revokes_it(
    page: Page,
    gateway: ConsoleGateway,
    idp: LoopbackIdP,
    shots: Shots,
    page_errors: list[str],
    outside: list[str],
    dialogs: list[str],
) -> None:
    sign_in(page, gateway.console, idp, ADMIN)
    shots(page, "overview-before")
    for link in NAV:
        assert page.get_by_role("link", name=link, exact=True).count() >= 1, f"no nav link {link!r}"
    assert page.get_by_role("button", name="Sign out").count() == 1
    assert "Alice Admin" in page.inner_text("body")
    spend_before = usd(page.inner_text("#spend-today"))
    # The authorization request the console sent: code flow with PKCE S256, state and nonce.
    authorization = idp.authorizations()[-1]
    assert authorization["response_type"] == "code" and authorization["code_challenge_method"] == "S256"
    assert authorization["state"] and authorization["nonce"] and authorization["code_challenge"]

    # Create a key for team-a.
    follow(page, page.get_by_role("link", name="Keys", exact=True).first)
    shots(page, "keys")
    form = page.locator("form").filter(has=page.get_by_role("button", name="Create key"))
    form.locator("select[name=org]").select_option(label="team-a")
    form.locator("input[name=name]").fill("browser-key")
    follow(page, form.get_by_role("button", name="Create key"))
    shots(page, "key-created")
    secret = page.inner_text("#new-secret").strip()
    assert secret.startswith("ezat_sk_"), secret
    page.locator('button[data-copy="#new-secret"]').click()
    assert page.evaluate("navigator.clipboard.readText()").strip() == secret, "Copy didn't copy the secret"
    snippets = page.inner_text("body")
    for client in ("curl", "OpenAI(", "Anthropic("):
        assert client in snippets, f"no {client} snippet on the key-created page"
    assert snippets.count(secret) >= 4, "the snippets don't carry the new secret"

    # Its owner pastes the OpenAI SDK snippet (only the address changed: the harness binds its
    # own port through EZAT_BIND) and uses the key.
    snippet = next(c for c in page.locator("pre, code").all_text_contents() if "OpenAI(" in c)
    printed = re.search(r'base_url="(http://[^"/]+)/openai/v1"', snippet)
    assert printed, snippet
    run = subprocess.run(
        [sys.executable, "-c", snippet.replace(printed.group(1), gateway.url)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout.strip(), run.stderr[-2000:]
    assert chat(gateway, secret)

    # The key's page: never the secret again.
    visit(page, gateway.console + "/keys")
    follow(page, page.get_by_role("link", name="browser-key").first)
    key_url = page.url
    key_id = key_url.rstrip("/").rsplit("/", 1)[1]
    assert any(same_key(key_id, k) for k in key_ids(gateway, "team-a")), (key_id, key_url)
    assert secret not in page.content()
    shots(page, "key")

    # The request in the usage page's rows and chart.
    visit(page, gateway.console + "/usage")
    rows = page.locator("#usage-rows")
    eventually(lambda: any(key_id in r or "browser-key" in r for r in table_rows(rows)), page, "the request in usage")
    usage_row = next(r for r in table_rows(rows) if key_id in r or "browser-key" in r)
    assert MODEL in usage_row or "sonnet" in usage_row, usage_row
    chart = page.locator("svg#usage-chart")
    assert chart.get_attribute("role") == "img" and chart.locator(":scope > title").count() == 1
    charted = chart.locator("xpath=following::table[contains(concat(' ', @class, ' '), ' chart-data ')][1]//td")
    assert any(re.search(r"[1-9]", v) for v in charted.all_text_contents()), "the chart's data shows no request"
    assert page.get_by_role("link", name="Download CSV").count() == 1
    shots(page, "usage")
    for org, listed in (("team-b", False), ("team-a", True)):
        page.locator("select[name=org]").select_option(label=org)
        follow(page, page.get_by_role("button", name="Filter"))
        assert f"org={org_ids(gateway)[org]}" in page.url, page.url
        assert any(key_id in r or "browser-key" in r for r in table_rows(rows)) == listed, (org, table_rows(rows))
    shots(page, "usage-filtered")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    csv_text = Path(download.value.path()).read_text(encoding="utf-8")
    assert key_id in csv_text or "browser-key" in csv_text, csv_text[:2000]

    # The spend moved on the overview.
    visit(page, gateway.console + "/")
    eventually(lambda: usd(page.inner_text("#spend-today")) > spend_before, page, "today's spend moved")
    shots(page, "overview-after")

    # Rotate with a grace window: both secrets work meanwhile.
    visit(page, key_url)
    rotate = page.locator("form").filter(has=page.get_by_role("button", name="Rotate"))
    rotate.locator("input[name=grace_seconds]").fill("600")
    follow(page, rotate.get_by_role("button", name="Rotate"))
    shots(page, "key-rotated")
    rotated = page.inner_text("#new-secret").strip()
    assert rotated.startswith("ezat_sk_") and rotated != secret
    assert chat(gateway, rotated)
    assert chat(gateway, secret), "the old secret stops working before its grace window ends"

    # Block (refused at once), unblock (works again), then revoke: each asked first.
    visit(page, key_url)
    follow(page, page.get_by_role("button", name="Block"))
    shots(page, "key-blocked")
    assert refused(gateway, rotated) in (401, 403)
    follow(page, page.get_by_role("button", name="Unblock"))
    assert chat(gateway, rotated)
    follow(page, page.get_by_role("button", name="Revoke"))
    shots(page, "key-revoked")
    asked = [q.split()[0] for q in dialogs]
    assert [q for q in asked if q in ("Rotate", "Block", "Revoke")] == ["Rotate", "Block", "Revoke"], dialogs
    assert refused(gateway, rotated) == 401
    assert refused(gateway, secret) == 401

    # Every change in the audit trail, with the person as its author, from the browser's address.
    visit(page, gateway.console + "/audit")
    shots(page, "audit")
    audit = page.locator("table#audit-rows")
    headers = [h.strip() for h in audit.locator("tr:has(th)").first.locator("th").all_text_contents()]
    assert headers[:5] == ["When", "Who", "Action", "Target", "From"], headers
    digits = key_id.rsplit("_", 1)[1]
    mine = [r for r in table_rows(audit) if re.search(r"alice", r, re.IGNORECASE) and digits in r]
    assert len(mine) >= 3, table_rows(audit)  # made, rotated, revoked
    assert re.search("create", mine[-1], re.IGNORECASE), mine  # newest first
    assert any(re.search("rotat", r, re.IGNORECASE) for r in mine), mine
    assert re.search("revok|archiv", mine[0], re.IGNORECASE), mine
    assert all("127.0.0.1" in r for r in mine), mine
    trail = json.loads(gateway.cli("audit", "list", "--json", "--actor", f"sso:{ADMIN}").stdout)
    actions = {entry["action"] for entry in trail}
    assert {"api_key.create", "api_key.rotate"} <= actions, actions
    assert_clean(page_errors, outside, gateway.console)


def test_every_page_renders_with_captioned_tables_and_charts_and_its_headers(
    page: Page,
    gateway: ConsoleGateway,
    idp: LoopbackIdP,
    shots: Shots,
    page_errors: list[str],
    outside: list[str],
) -> None:
    sign_in(page, gateway.console, idp, ADMIN)
    team_a = org_ids(gateway)["team-a"]
    pages = {
        "overview": "/",
        "organisations": "/organisations",
        "organisation": f"/organisations/{team_a}",
        "keys": "/keys",
        "limits": "/limits",
        "usage": "/usage",
        "audit": "/audit",
        "deployments": "/deployments",
    }
    for name, path in pages.items():
        response = visit(page, gateway.console + path)
        assert response.status == 200, (path, response.status)
        shots(page, name)
        headers = response.headers
        csp = headers.get("content-security-policy", "")
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, (path, csp)
        assert "unsafe-inline" not in csp, (path, csp)
        assert headers.get("x-frame-options", "").upper() == "DENY", path
        assert "no-store" in headers.get("cache-control", ""), path
        for table in page.locator("table").all():
            assert table.locator("caption").count() == 1, f"{path}: a table without a caption"
        for chart in page.locator("svg[role=img]").all():
            assert chart.locator("title").count() >= 1, f"{path}: a chart without a title"
            data = chart.locator("xpath=following::table[contains(concat(' ', @class, ' '), ' chart-data ')][1]")
            assert data.count() == 1, f"{path}: a chart without its data table"
        # As served (the CSP would refuse them): no inline script, no style element or attribute.
        html = response.text()
        assert not re.search(r"<script(?![^>]*\ssrc=)[^>]*>", html), f"{path}: an inline script"
        styled = re.findall(r"<[^>]*\sstyle=[^>]*>|<style\b", html)
        assert not styled, f"{path}: inline styles: {styled[:3]}"
    visit(page, gateway.console + "/")
    for chart_id in ("spend-chart", "requests-chart"):
        assert page.locator(f"svg#{chart_id}[role=img]").count() == 1, chart_id
    if os.environ.get("EZAT_CONSOLE_DOCS_SHOT"):
        write_docs_screenshot(page, gateway)
    assert_clean(page_errors, outside, gateway.console)


def write_docs_screenshot(page: Page, gateway: ConsoleGateway) -> None:
    """docs/img/console-overview.png: the overview as a 1280x800 window shows it, after some
    traffic of both organisations on both models, as a palette PNG (Pillow) to keep the
    repository small. Written when EZAT_CONSOLE_DOCS_SHOT is set."""
    from PIL import Image

    for org, model, count in (
        ("team-a", MODEL, 3),
        ("team-b", "claude-haiku-4-5", 2),
        ("team-a", "claude-haiku-4-5", 1),
    ):
        secret = new_key(gateway, org, f"{org}-app")
        client = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=secret, max_retries=0, timeout=30)
        for _ in range(count):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a story"}])
    page.reload()
    DOCS_SHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS_SHOT), full_page=False)
    with Image.open(DOCS_SHOT) as shot:
        small = shot.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(DOCS_SHOT, optimize=True)


def test_the_session_cookie_is_secure_httponly_and_samesite(
    page: Page, context: BrowserContext, gateway: ConsoleGateway, idp: LoopbackIdP
) -> None:
    sign_in(page, gateway.console, idp, ADMIN)
    (cookie,) = [c for c in context.cookies() if c["name"] == COOKIE]
    assert cookie["httpOnly"] and cookie["secure"], cookie
    assert cookie["sameSite"] in ("Lax", "Strict"), cookie
    assert cookie.get("expires", -1) == -1, "the session cookie outlives the browser"


def test_an_organisation_admin_is_refused_another_organisations_pages(
    page: Page, gateway: ConsoleGateway, idp: LoopbackIdP, shots: Shots
) -> None:
    new_key(gateway, "team-b", "b-key")
    ids = org_ids(gateway)
    b_keys = key_ids(gateway, "team-b")
    (b_key_id,) = ["key_" + key.rsplit("_", 1)[1] for key, name in b_keys.items() if name == "b-key"]  # the public id
    sign_in(page, gateway.console, idp, ORG_ADMIN)
    shots(page, "overview")

    response = visit(page, f"{gateway.console}/organisations/{ids['team-a']}")
    assert response.status == 200
    shots(page, "own-organisation")
    visit(page, f"{gateway.console}/organisations")
    assert "team-b" not in page.inner_text("main" if page.locator("main").count() else "body")
    shots(page, "organisations")

    visit(page, f"{gateway.console}/keys")
    offered = page.locator("select[name=org] option").all_text_contents()
    assert any("team-a" in o for o in offered) and not any("team-b" in o for o in offered), offered
    assert "b-key" not in page.inner_text("body")
    shots(page, "keys")

    for path in (f"/organisations/{ids['team-b']}", f"/keys/{b_key_id}", f"/keys?org={ids['team-b']}"):
        not_allowed(page, visit(page, gateway.console + path))
    shots(page, "refused")

    # Nor can a well-formed form (the session's own CSRF token) change team-b.
    visit(page, gateway.console + "/")
    token = csrf_token(page)
    before = orgs(gateway)["team-b"]
    forged = page.request.post(
        f"{gateway.console}/organisations/{ids['team-b']}/top-up",
        form={"csrf_token": token, "amount_usd": "1000"},
        max_redirects=0,
    )
    assert forged.status == 403, forged.status
    forged = page.request.post(
        f"{gateway.console}/keys", form={"csrf_token": token, "org": ids["team-b"], "name": "sneaky"}, max_redirects=0
    )
    assert forged.status in (400, 403), forged.status
    assert orgs(gateway)["team-b"] == before
    assert key_ids(gateway, "team-b") == b_keys


def test_a_viewer_sees_but_changes_nothing(page: Page, gateway: ConsoleGateway, idp: LoopbackIdP, shots: Shots) -> None:
    sign_in(page, gateway.console, idp, VIEWER)
    shots(page, "overview")
    ids = org_ids(gateway)
    assert visit(page, gateway.console + "/usage").status == 200
    token = csrf_token(page)
    keys_before = key_ids(gateway, "team-a")
    for path, form in (
        ("/keys", {"org": ids["team-a"], "name": "viewer-key"}),
        (f"/organisations/{ids['team-a']}/top-up", {"amount_usd": "5"}),
        (f"/organisations/{ids['team-a']}/suspend", {}),
    ):
        response = page.request.post(gateway.console + path, form={"csrf_token": token, **form}, max_redirects=0)
        assert response.status == 403, (path, response.status)
    assert key_ids(gateway, "team-a") == keys_before


def test_a_person_whose_groups_map_to_no_role_is_refused(
    page: Page, gateway: ConsoleGateway, idp: LoopbackIdP, shots: Shots
) -> None:
    page.goto(gateway.console + "/")
    page.get_by_role("link", name="Sign in with your identity provider").click()
    page.wait_for_url(re.compile("^" + re.escape(idp.issuer) + "/"))
    page.fill("input[name=sub]", STRANGER)
    with page.expect_response(lambda r: "/console/auth/callback" in r.url) as callback:
        page.get_by_role("button", name="Authorize").click()
    page.wait_for_load_state()
    shots(page, "refused")
    final = callback.value if callback.value.status == 403 else visit(page, page.url)
    assert final.status == 403, (final.url, final.status)
    assert page.get_by_role("heading", name=re.compile("not allowed", re.IGNORECASE)).count() >= 1
    # Not signed in either: the overview sends them to the sign-in page.
    page.goto(gateway.console + "/")
    assert "/console/sign-in" in page.url, page.url


def test_a_forged_form_is_refused(page: Page, gateway: ConsoleGateway, idp: LoopbackIdP, shots: Shots) -> None:
    sign_in(page, gateway.console, idp, ADMIN)
    team_a = org_ids(gateway)["team-a"]
    keys_before = key_ids(gateway, "team-a")
    fields = {"org": team_a, "name": "forged"}
    # The session's cookie, but no token, or a wrong one.
    for extra in ({}, {"csrf_token": "not-the-token"}, {"csrf_token": ""}):
        response = page.request.post(gateway.console + "/keys", form={**fields, **extra}, max_redirects=0)
        assert response.status == 400, (extra, response.status)
    # Another site's page that posts to the console in the signed-in person's browser (another
    # port of 127.0.0.1 is the same site: the SameSite cookie goes along, the token can't).
    forger = (
        f'<!doctype html><form method="post" action="{gateway.console}/keys">'
        f'<input name="org" value="{team_a}"><input name="name" value="forged">'
        '<button type="submit">Win a prize</button></form>'
    )
    with other_site(forger) as url:
        page.goto(url)
        with page.expect_response(lambda r: r.request.method == "POST" and r.url.startswith(gateway.console)) as landed:
            page.get_by_role("button", name="Win a prize").click()
        page.wait_for_load_state()
        assert landed.value.status == 400, landed.value.status
        shots(page, "forged-refused")
    assert key_ids(gateway, "team-a") == keys_before


def test_signing_out_ends_the_session(
    page: Page, context: BrowserContext, gateway: ConsoleGateway, idp: LoopbackIdP, shots: Shots
) -> None:
    sign_in(page, gateway.console, idp, ADMIN)
    (cookie,) = [c for c in context.cookies() if c["name"] == COOKIE]
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(re.escape(gateway.console) + "/sign-in"))
    shots(page, "signed-out")
    # The old cookie, put back as a thief would, no longer signs anyone in.
    context.add_cookies([cookie])
    page.goto(gateway.console + "/keys")
    assert "/console/sign-in" in page.url, page.url
    stale = page.request.get(gateway.console + "/keys", max_redirects=0)
    assert stale.status in (302, 303), stale.status


def test_the_break_glass_link_signs_in_once(
    page: Page, context: BrowserContext, gateway: ConsoleGateway, shots: Shots
) -> None:
    printed = gateway.cli("console-link").stdout
    found = re.search(r"/console/auth/link/\S+", printed)
    assert found, printed
    link = gateway.admin_url + found.group(0)
    landed = visit(page, link)
    assert page.url.startswith(gateway.console) and "/sign-in" not in page.url, page.url
    assert landed.status == 200, (page.url, landed.status)
    assert page.get_by_role("button", name="Sign out").count() == 1
    shots(page, "signed-in")
    context.clear_cookies()
    again = visit(page, link)
    assert "/sign-in" in page.url or again.status >= 400, (page.url, again.status)
    assert page.get_by_role("button", name="Sign out").count() == 0


def test_the_console_works_under_a_proxys_path_prefix(
    page: Page,
    context: BrowserContext,
    gateway: ConsoleGateway,
    idp: LoopbackIdP,
    shots: Shots,
    page_errors: list[str],
    outside: list[str],
) -> None:
    with prefix_proxy(gateway.admin_url, "/ezat") as proxy:
        console = proxy + "/ezat/console"
        sign_in(page, console, idp, ADMIN)  # the IdP sends the browser back through the prefix
        assert idp.authorizations()[-1]["redirect_uri"] == console + "/auth/callback"
        shots(page, "overview")
        (cookie,) = [c for c in context.cookies() if c["name"] == COOKIE]
        assert cookie["path"].rstrip("/") == "/ezat/console", cookie
        assets = page.locator("link[rel=stylesheet], script[src]").evaluate_all(
            "nodes => nodes.map(n => n.href || n.src)"
        )
        assert assets and all(a.startswith(console + "/static/") for a in assets), assets
        for link in NAV:
            answer = follow(page, page.get_by_role("link", name=link, exact=True).first)
            assert page.url.startswith(console), (link, page.url)
            assert answer is not None and answer.status == 200, (link, page.url, answer and answer.status)
        hrefs = page.locator("a[href^='/'], form[action^='/']").evaluate_all(
            "nodes => nodes.map(n => n.getAttribute('href') || n.getAttribute('action'))"
        )
        assert all(h.startswith("/ezat/") for h in hrefs), [h for h in hrefs if not h.startswith("/ezat/")]
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(re.compile(re.escape(console) + "/sign-in"))
        shots(page, "signed-out")
    assert_clean(page_errors, outside, console)
