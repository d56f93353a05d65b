"""Helpers of the console's browser tests (tests/browser/): Debian's Chromium driven by
Playwright's Python API (``/usr/bin/chromium``; Playwright never downloads a browser here), the
gateway with more TOML tables (``[identity]``, ``[console]``), full-page screenshots in
``test-results/console/``, signing in through the loopback provider (tests/support/oidc.py) as a
person does, and the checks of a page: visited (its response), refused (403 "Not allowed"), and
clean (no CSP error or script error, nothing fetched off loopback)."""

from __future__ import annotations

import http.client
import importlib.util
import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest
import requests

from tests.conftest import IN_CI
from tests.integration.harness import REPO, Gateway
from tests.support.oidc import LoopbackIdP

if TYPE_CHECKING:
    from playwright.sync_api import Page, Response

CHROMIUM = os.environ.get("EZAT_CHROMIUM", "/usr/bin/chromium")  # Debian's; EZAT_CHROMIUM: another build
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = REPO / "test-results" / "console"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}

# The people of the tests' provider, by subject: their names, and the groups [identity] maps
# (tests/browser/conftest.py): platform-admins are gateway admins, finance viewers, team-a-leads
# administer team-a; contractors map to no role.
ADMIN, ORG_ADMIN, VIEWER, STRANGER = "alice", "olga", "fiona", "nadia"
PEOPLE = {
    ADMIN: ("Alice Admin", ["platform-admins", "staff"]),
    ORG_ADMIN: ("Olga Lead", ["team-a-leads"]),
    VIEWER: ("Fiona Finance", ["finance"]),
    STRANGER: ("Nadia Nobody", ["contractors"]),
}
ORGS = ("team-a", "team-b")


def require_browser() -> str:
    """Chromium's path, when it and Playwright are installed. Else the test skips, or fails
    under CI=true (``.ci/run`` installs Debian's chromium, the test extras Playwright)."""
    reason = ""
    if importlib.util.find_spec("playwright") is None:
        reason = "Playwright (pip: playwright) is not installed"
    elif not (shutil.which(CHROMIUM) or Path(CHROMIUM).is_file()):
        reason = f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium)"
    if not reason:
        return CHROMIUM
    if IN_CI:
        pytest.fail(
            f"{reason}, and CI=true requires it (.ci/run installs Debian's chromium, the test extras Playwright)"
        )
    pytest.skip(f"{reason}; the console's browser tests run in CI")


def on_loopback(url: str) -> bool:
    """Whether the browser may fetch ``url``: the gateway and the provider are on loopback."""
    return urlparse(url).hostname in {"127.0.0.1", "localhost", "::1"} or url.startswith(("data:", "about:", "blob:"))


@dataclass
class ConsoleGateway(Gateway):
    """The harness's gateway with more TOML tables after its own (``[identity]``, ``[console]``)."""

    extra_toml: str = ""
    admin_key: str = ""  # made on first use of ``admin_api``

    def admin_api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One admin API call (``/v1/organizations`` + ``path``) with an admin key of the tests':
        the tests' own view of organisations and keys, quicker than a CLI process per look."""
        if not self.admin_key:
            self.admin_key = self.new_admin_key("--name", "browser-tests")
        answer = requests.request(
            method,
            f"{self.admin_url}/v1/organizations{path}",
            headers={"x-api-key": self.admin_key},
            timeout=10,
            **kwargs,
        )
        assert answer.status_code == 200, (method, path, answer.status_code, answer.text)
        return answer.json()

    def write_config(self) -> None:
        super().write_config()
        with self.config_path.open("a") as config:
            config.write("\n" + self.extra_toml)

    @property
    def console(self) -> str:
        """The console's root URL, without the final slash."""
        return self.admin_url + "/console"


@dataclass
class Shots:
    """Full-page screenshots of one test, named ``<test>--<step>.png``."""

    test: str
    taken: list[Path] = field(default_factory=list)

    def __call__(self, page: Page, step: str) -> Path:
        path = SCREENSHOTS / f"{self.test}--{step}.png"
        page.screenshot(path=str(path), full_page=True)
        self.taken.append(path)
        return path


def sign_in(page: Page, console: str, idp: LoopbackIdP, sub: str) -> None:
    """Sign in as ``sub`` the way a person does: the console (its root URL, ``console``) sends an
    anonymous visitor to its sign-in page, whose link leads to the provider, whose form sends
    them back signed in."""
    page.goto(console + "/")
    assert page.url.startswith(console + "/sign-in"), page.url
    page.get_by_role("link", name="Sign in with your identity provider").click()
    page.wait_for_url(re.compile("^" + re.escape(idp.issuer) + "/"))
    page.fill("input[name=sub]", sub)
    page.get_by_role("button", name="Authorize").click()
    page.wait_for_url(re.compile("^" + re.escape(console)))
    page.wait_for_load_state()


def visit(page: Page, url: str) -> Response:
    """Go to ``url`` in ``page``: the response of the page it lands on (redirects followed)."""
    response = page.goto(url)
    assert response is not None, url
    return response


def not_allowed(page: Page, response: Response) -> None:
    """``response`` is the console's refusal: a 403 whose page says "Not allowed"."""
    assert response.status == 403, (response.url, response.status)
    assert page.get_by_role("heading", name=re.compile("not allowed", re.IGNORECASE)).count() >= 1, page.content()


def assert_clean(page_errors: list[str], outside: list[str], console: str) -> None:
    """No page of the console (at ``console``) broke its CSP or threw, and none asked anything
    off loopback (no CDN)."""
    console_errors = [e for e in page_errors if e.startswith(console)]
    assert not console_errors, console_errors
    console_outside = [u for u in outside if f"(from {console}" in u]
    assert not console_outside, console_outside


@contextmanager
def prefix_proxy(upstream: str, prefix: str) -> Iterator[str]:
    """A reverse proxy on a free loopback port that serves ``upstream`` under ``prefix`` as
    docs/console.md's recipes do: it strips the prefix and names it in ``X-Forwarded-Prefix``,
    with ``X-Forwarded-For``/``X-Forwarded-Proto``, the browser's ``Host`` kept. Redirects and
    cookies pass through untouched. Yields the proxy's root URL (without the prefix)."""
    target = urlparse(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            if not self.path.startswith(prefix + "/"):
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers.update(
                {
                    "X-Forwarded-Prefix": prefix,
                    "X-Forwarded-For": self.client_address[0],
                    "X-Forwarded-Proto": "http",
                    "Connection": "close",
                }
            )
            connection = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=30)
            try:
                connection.request(self.command, self.path[len(prefix) :], body=body or None, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in HOP_BY_HOP | {"content-length"}:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            finally:
                connection.close()

        do_GET = do_POST = do_HEAD = _forward

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
