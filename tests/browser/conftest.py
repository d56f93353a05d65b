"""The console as people use it: Debian's Chromium, headless, driven by Playwright against a real
gateway (gunicorn, two workers, its admin listener serving ``/console``), a simulator as its
upstream, and a real OpenID Connect provider on loopback whose groups map to the console's roles
(tests/support/oidc.py, tests/support/browser.py). Outside CI the browser tests skip when
Playwright or Chromium is missing; under CI=true they fail instead.

Each page a test visits is written as a full-page PNG to ``test-results/console/``
(``<test>--<step>.png``, replaced at each run of the test), for whoever reads a failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.harness import REPO, ModelSpec, Sim
from tests.support.browser import (
    CHROMIUM_ARGS,
    ORGS,
    PEOPLE,
    SCREENSHOTS,
    ConsoleGateway,
    Shots,
    on_loopback,
    require_browser,
)
from tests.support.docs import code_block
from tests.support.oidc import LoopbackIdP, loopback_idp

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page, Playwright

CLIENT_SECRET = "loopback-client-secret"  # the gateway reads it from EZAT_OIDC_CLIENT_SECRET
REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


# Module-scoped: Playwright's sync API keeps an event loop running in the process while its driver
# lives, so a later test of another module on the same worker could not start one of its own
# (``asyncio.run``: "cannot be called from a running event loop").
@pytest.fixture(scope="module")
def playwright_driver() -> Iterator[Playwright]:
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright_driver: Playwright) -> Iterator[Browser]:
    chromium = playwright_driver.chromium.launch(executable_path=require_browser(), args=CHROMIUM_ARGS, headless=True)
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def idp() -> Iterator[LoopbackIdP]:
    with loopback_idp() as provider:
        for sub, (name, groups) in PEOPLE.items():
            provider.add_user(sub, name=name, email=f"{sub}@example.com", groups=groups)
        yield provider


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="sim-a").start()
    yield server
    server.stop()


def docs_identity(idp: LoopbackIdP) -> str:
    """docs/console.md's ``[identity]`` table as printed, but for its issuer and client id (the
    loopback provider's): its groups are the tests' people's."""
    table = code_block(REPO / "docs" / "console.md", "toml", "[identity]")
    table, issuers = re.subn(r'(?m)^issuer = ".*"$', f'issuer = "{idp.issuer}"', table)
    table, clients = re.subn(r'(?m)^client_id = ".*"$', f'client_id = "{idp.client_id}"', table)
    assert (issuers, clients) == (1, 1), table
    return table


@pytest.fixture(scope="module")
def gateway(
    browser: Browser, sim: Sim, idp: LoopbackIdP, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleGateway]:
    """A gateway with two workers (a sign-in that starts in one and ends in the other must work),
    the admin listener, and docs/console.md's ``[identity]`` on the loopback provider:
    ``platform-admins`` are gateway admins, ``finance`` viewers, ``team-a-leads`` administer
    team-a. The session cookie
    keeps its production ``Secure`` flag: Chromium keeps Secure cookies of http://127.0.0.1.
    Sign-in attempts are hardly limited: the tests all sign in from one address.
    (``browser`` first: without one, the test skips before any server starts.)"""
    identity = docs_identity(idp)
    # Every test signs in from 127.0.0.1: more often than a person would in a minute.
    console = "[console]\nsign_in_attempts_per_minute = 1000\n"
    server = ConsoleGateway(
        root=tmp_path_factory.mktemp("console"),
        models=[
            ModelSpec(deployments=[{"name": "sim-a", "base_url": sim.url}]),
            ModelSpec(
                id="anthropic/claude-haiku-4-5",
                aliases=("claude-haiku-4-5",),
                deployments=[{"name": "sim-a", "base_url": sim.url}],
                sampling=True,
                thinking="budget",
                efforts=("low", "medium", "high"),
                prefill=True,
                max_output_tokens=32000,
            ),
        ],
        workers=2,
        admin=True,
        env={"EZAT_OIDC_CLIENT_SECRET": CLIENT_SECRET},
        extra_toml=identity + console,
    ).start()
    for org in ORGS:
        server.admin_api("POST", "/workspaces", json={"name": org, "balance": "10000"})  # $100.00, in cents
    yield server
    server.stop()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Shots:
    """This test's screenshots, those of its previous run removed first."""
    test = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob(f"{test}--*.png"):
        old.unlink(missing_ok=True)
    return Shots(test=test)


@pytest.fixture
def outside() -> list[str]:
    """The requests the browser was refused: anything not on loopback (the console ships its
    assets; the provider's own page asks a CDN for its style sheet, refused as well)."""
    return []


@pytest.fixture
def context(browser: Browser, outside: list[str]) -> Iterator[BrowserContext]:
    """A fresh browser profile (no cookies) per test, 1280x800, that reaches only loopback and
    lets the console's Copy buttons use the clipboard."""
    ctx = browser.new_context(
        viewport={"width": 1280, "height": 800}, permissions=["clipboard-read", "clipboard-write"]
    )

    def only_loopback(route: Any) -> None:
        if on_loopback(route.request.url):
            route.continue_()
        else:
            outside.append(f"{route.request.url} (from {route.request.frame.url})")
            route.abort()

    ctx.route("**/*", only_loopback)
    yield ctx
    ctx.close()


@pytest.fixture
def page_errors() -> list[str]:
    """The page's console errors (a CSP violation shows there) and uncaught exceptions, each
    after the URL of the page it happened on."""
    return []


@pytest.fixture
def dialogs() -> list[str]:
    """The questions the page asked (confirm()), in order: each was answered OK."""
    return []


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Each phase's report on the test item (``page`` reads the call's, to screenshot a failure)."""
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    return report


@pytest.fixture
def page(
    request: pytest.FixtureRequest, context: BrowserContext, shots: Shots, page_errors: list[str], dialogs: list[str]
) -> Iterator[Page]:
    """A tab that accepts confirm() dialogs (the console asks before revoking), noting them; when
    the test fails, the page it failed on is screenshotted too (``<test>--failed.png``)."""
    tab = context.new_page()
    tab.set_default_timeout(15_000)

    def answer(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    tab.on("dialog", answer)
    tab.on(
        "console", lambda message: page_errors.append(f"{tab.url}: {message.text}") if message.type == "error" else None
    )
    tab.on("pageerror", lambda error: page_errors.append(f"{tab.url}: {error}"))
    yield tab
    call = request.node.stash.get(REPORTS, {}).get("call")
    if call is not None and call.failed and not tab.is_closed():
        shots(tab, "failed")
