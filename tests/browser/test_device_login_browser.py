"""``ezat-compat login`` with its browser step done in Chromium (Playwright, headless) as a person
does it: the command prints the address and the code, the person opens the address, checks the
code filled in, continues to the company's IdP (the loopback provider), signs in and lands on
"You are signed in as …"; the command ends, and ``ezat-compat token`` prints a key the OpenAI SDK
uses. A person in no mapped group sees why on the page, and the command says it was refused. The
gateway keeps the production ``Secure`` cookies (Chromium keeps them on http://127.0.0.1).
Screenshots in ``test-results/console/``; skipped like the console's browser tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from openai import OpenAI

from tests.integration.harness import Sim
from tests.support.browser import ConsoleGateway, Shots
from tests.support.device import GROUP, begin_login, device_gateway, ezat, rows, start_gateway
from tests.support.oidc import LoopbackIdP, loopback_idp

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def idp() -> Iterator[LoopbackIdP]:
    with loopback_idp() as provider:
        provider.add_user("rita", name="Rita Dev", email="rita@example.com", groups=[GROUP])
        provider.add_user("sami", name="Sami Temp", email="sami@example.com", groups=["contractors"])
        yield provider


@pytest.fixture(scope="module")
def gateway(
    browser: Browser, sim: Sim, idp: LoopbackIdP, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleGateway]:
    """(``browser`` first: without one, the test skips before any server starts.)"""
    server = start_gateway(device_gateway(tmp_path_factory.mktemp("device-browser"), idp, sim, secure_cookies=True))
    yield server
    server.stop()


def sign_in_in_browser(page: Page, shots: Shots, uri: str, code: str, idp: LoopbackIdP, sub: str) -> None:
    """The person's part: the verification page, the code checked, the IdP's form."""
    page.goto(f"{uri}?user_code={code}")
    page.wait_for_load_state()
    box = page.get_by_label("Code")
    assert box.input_value() == code
    shots(page, "verification")
    page.get_by_role("button", name="Continue").click()
    page.wait_for_url(re.compile("^" + re.escape(idp.issuer) + "/"))
    page.fill("input[name=sub]", sub)
    page.get_by_role("button", name="Authorize").click()
    page.wait_for_url(re.compile(r"/oauth/device/callback"))
    page.wait_for_load_state()


def test_login_in_chromium_then_token_for_the_openai_sdk(
    gateway: ConsoleGateway, idp: LoopbackIdP, page: Page, shots: Shots, page_errors: list[str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    started = begin_login(home, gateway.url)
    assert started.uri == gateway.url + "/oauth/device"
    sign_in_in_browser(page, shots, started.uri, started.code, idp, "rita")
    status = page.get_by_role("status")
    assert "You are signed in as rita@example.com; return to your terminal." in status.inner_text()
    shots(page, "signed-in")
    code, out, err = started.finish()
    assert code == 0 and out == "", err
    assert f"Signed in to {gateway.url}" in err
    assert not [e for e in page_errors if e.startswith(gateway.url)]  # no CSP violation on our pages

    printed = ezat(home, "token")
    assert printed.returncode == 0, printed.stderr
    key = printed.stdout.strip()
    client = OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0)
    completion = client.chat.completions.create(
        model="claude-sonnet-5-5", messages=[{"role": "user", "content": "hello"}], max_tokens=32
    )
    assert completion.choices[0].message.content
    rita = rows(gateway, "SELECT id FROM users WHERE subject = 'rita'")[0]["id"]
    billed = rows(
        gateway, "SELECT user_id FROM ledger WHERE request_id = :r", r=completion.id.removeprefix("chatcmpl-")
    )
    assert billed == [{"user_id": rita}]


def test_a_person_in_no_mapped_group_sees_why_and_the_command_is_refused(
    gateway: ConsoleGateway, idp: LoopbackIdP, page: Page, shots: Shots, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    started = begin_login(home, gateway.url)
    sign_in_in_browser(page, shots, started.uri, started.code, idp, "sami")
    assert page.get_by_role("heading", level=1).inner_text() == "Not allowed"
    assert "no group the gateway maps to an organization" in page.get_by_role("alert").inner_text()
    shots(page, "refused")
    code, out, err = started.finish()
    assert code == 1 and out == ""
    assert "the sign-in was refused" in err
