"""The console's People page in Chromium (the servers, the browser and the people of conftest.py):
signing in records the person; a gateway admin finds everyone who signed in, disables a viewer
(who is refused at their next sign-in), finds the change in the audit trail under their name and
enables them again; the viewer reads the page and has no form to change it; an organisation's
admin is refused the page. Each page visited is screenshotted into ``test-results/console/``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from tests.support.browser import (
    ADMIN,
    ORG_ADMIN,
    VIEWER,
    ConsoleGateway,
    Shots,
    assert_clean,
    not_allowed,
    sign_in,
    visit,
)
from tests.support.oidc import LoopbackIdP

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]


def _signed_in_elsewhere(browser: Browser, gateway: ConsoleGateway, idp: LoopbackIdP, sub: str) -> BrowserContext:
    """Another browser profile, signed in as ``sub``."""
    other = browser.new_context(viewport={"width": 1280, "height": 800})
    sign_in(other.new_page(), gateway.console, idp, sub)
    return other


def _refused_sign_in(browser: Browser, gateway: ConsoleGateway, idp: LoopbackIdP, sub: str) -> int:
    """The status of the console's callback when ``sub`` signs in, in a fresh profile."""
    fresh = browser.new_context()
    try:
        tab = fresh.new_page()
        tab.goto(gateway.console + "/")
        tab.get_by_role("link", name="Sign in with your identity provider").click()
        tab.wait_for_url(re.compile("^" + re.escape(idp.issuer) + "/"))
        tab.fill("input[name=sub]", sub)
        with tab.expect_response(lambda r: "/console/auth/callback" in r.url) as callback:
            tab.get_by_role("button", name="Authorize").click()
        tab.wait_for_load_state()
        return callback.value.status
    finally:
        fresh.close()


def test_an_admin_disables_and_enables_a_person_from_the_people_page(
    page: Page,
    browser: Browser,
    gateway: ConsoleGateway,
    idp: LoopbackIdP,
    shots: Shots,
    page_errors: list[str],
    outside: list[str],
    dialogs: list[str],
) -> None:
    viewer = _signed_in_elsewhere(browser, gateway, idp, VIEWER)  # Fiona is a person now
    try:
        viewer_tab = viewer.pages[0]
        assert visit(viewer_tab, gateway.console + "/people").status == 200
        assert viewer_tab.get_by_role("button", name="Disable").count() == 0  # reads, changes nothing
        shots(viewer_tab, "viewer")
    finally:
        viewer.close()

    sign_in(page, gateway.console, idp, ADMIN)
    page.get_by_role("link", name="People").click()
    page.wait_for_load_state()
    shots(page, "people")
    rows = page.locator("#people-rows tbody tr")
    fiona = rows.filter(has_text=f"{VIEWER}@example.com")
    assert fiona.count() == 1 and "active" in fiona.inner_text()
    alice = rows.filter(has_text=f"{ADMIN}@example.com")
    assert "platform-admins" in alice.inner_text() and "just now" in alice.inner_text()
    assert page.locator("#group-rows caption").inner_text() == "Group mappings"

    fiona.get_by_role("button", name="Disable").click()
    page.wait_for_load_state()
    shots(page, "disabled")
    assert any("Disable" in question for question in dialogs)
    assert page.get_by_role("status").filter(has_text="is disabled").count() == 1
    assert "disabled" in page.locator("#people-rows tbody tr").filter(has_text=f"{VIEWER}@example.com").inner_text()
    assert _refused_sign_in(browser, gateway, idp, VIEWER) == 403

    trail = gateway.admin_api("GET", "/audit_log", params={"limit": 20})["data"]
    disabled = [row for row in trail if row["action"] == "user.disable"]
    assert disabled and disabled[0]["actor"] == f"sso:{ADMIN}"

    page.locator("#people-rows tbody tr").filter(has_text=f"{VIEWER}@example.com").get_by_role(
        "button", name="Enable"
    ).click()
    page.wait_for_load_state()
    assert page.get_by_role("status").filter(has_text="enabled again").count() == 1
    _signed_in_elsewhere(browser, gateway, idp, VIEWER).close()  # let in again
    assert_clean(page_errors, outside, gateway.console)


def test_an_organisation_admin_is_refused_the_people_page(
    page: Page, gateway: ConsoleGateway, idp: LoopbackIdP, shots: Shots
) -> None:
    sign_in(page, gateway.console, idp, ORG_ADMIN)
    assert page.get_by_role("link", name="People").count() == 0
    not_allowed(page, visit(page, gateway.console + "/people"))
    shots(page, "refused")
