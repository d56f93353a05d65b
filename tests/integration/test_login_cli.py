"""``ezat-compat login`` and ``ezat-compat token`` as a person runs them, against a real gateway
(gunicorn, two workers, the simulator upstream) and the loopback OpenID Connect provider: the
commands are processes of their own with ``HOME`` and ``XDG_CONFIG_HOME`` in the test's folder
(and no OS keyring), the browser step done with ``requests`` (tests/support/device.py).

What is held: ``login --no-browser`` prints the address and the code on stderr, waits for the
sign-in and keeps the credentials in ``$XDG_CONFIG_HOME/ezat-compat/credentials.json``, mode 0600
in a folder 0700; ``token`` prints the key alone on stdout, which the OpenAI Python SDK uses for a
chat completion billed to the person; a key near its end is refreshed (a new key, the refresh token
rotated), once for many concurrent ``token`` calls; ``token`` without a sign-in, or after the
IdP ended it, exits 1 with one line naming ``ezat-compat login --gateway URL``.
"""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from openai import OpenAI

from tests.integration.harness import Sim
from tests.support.browser import ConsoleGateway
from tests.support.device import approve, begin_login, device_gateway, ezat, rows, start_gateway
from tests.support.oidc import LoopbackIdP, loopback_idp

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="sim").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def idp() -> Iterator[LoopbackIdP]:
    with loopback_idp() as provider:
        for sub in ("lena", "mark", "otto"):
            provider.add_user(sub, name=sub.title(), email=f"{sub}@example.com", groups=["engineers"])
        yield provider


@pytest.fixture(scope="module")
def gateway(sim: Sim, idp: LoopbackIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    server = start_gateway(device_gateway(tmp_path_factory.mktemp("login"), idp, sim))
    yield server
    server.stop()


def login(home: Path, gateway: ConsoleGateway, idp: LoopbackIdP, sub: str) -> str:
    """``ezat-compat login --gateway URL --no-browser`` with the browser step done as ``sub``;
    returns what it printed on stderr."""
    started = begin_login(home, gateway.url)
    assert started.uri == gateway.url + "/oauth/device"
    page = approve(requests.Session(), started.uri, idp, sub, user_code=started.code)
    assert page.status_code == 200, page.text
    status, out, err = started.finish()
    assert status == 0, err
    assert out == ""  # stdout is for `token` alone
    assert f"Signed in to {gateway.url}" in err
    return err


def credentials(home: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((home / "config" / "ezat-compat" / "credentials.json").read_text())
    return document


def set_expiry(home: Path, gateway: ConsoleGateway, expires_at: float) -> None:
    """Make the kept key look as if it ends at ``expires_at`` (what a few hours of waiting do)."""
    path = home / "config" / "ezat-compat" / "credentials.json"
    document = json.loads(path.read_text())
    document["gateways"][gateway.url]["expires_at"] = expires_at
    path.write_text(json.dumps(document))


def test_login_then_token_works_with_the_openai_sdk(gateway: ConsoleGateway, idp: LoopbackIdP, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    login(home, gateway, idp, "lena")
    folder = home / "config" / "ezat-compat"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "credentials.json").stat().st_mode) == 0o600
    entry = credentials(home)["gateways"][gateway.url]
    assert entry["store"] == "file" and entry["key"].startswith("ezat_sk_")

    printed = ezat(home, "token")  # one gateway signed in to: --gateway is optional
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == entry["key"] + "\n"
    assert printed.stderr == ""
    key = printed.stdout.strip()
    client = OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0)
    completion = client.chat.completions.create(
        model="claude-sonnet-5-5", messages=[{"role": "user", "content": "hello"}], max_tokens=32
    )
    assert completion.choices[0].message.content
    lena = rows(gateway, "SELECT id FROM users WHERE subject = 'lena'")[0]["id"]
    billed = rows(
        gateway, "SELECT user_id FROM ledger WHERE request_id = :r", r=completion.id.removeprefix("chatcmpl-")
    )
    assert billed == [{"user_id": lena}]
    assert ezat(home, "token", "--gateway", gateway.url + "/").stdout == key + "\n"  # the same URL, written either way


def test_token_refreshes_a_key_near_its_end_once_for_concurrent_calls(
    gateway: ConsoleGateway, idp: LoopbackIdP, tmp_path: Path
) -> None:

    home = tmp_path / "home"
    home.mkdir()
    login(home, gateway, idp, "mark")
    before = credentials(home)["gateways"][gateway.url]
    set_expiry(home, gateway, time.time() + 60)  # less than 5 minutes left
    refreshes = len(rows(gateway, "SELECT id FROM audit_log WHERE action = 'session.refresh'"))
    with ThreadPoolExecutor(max_workers=6) as pool:
        done = list(pool.map(lambda _: ezat(home, "token"), range(6)))
    assert all(d.returncode == 0 for d in done), [d.stderr for d in done]
    keys = {d.stdout for d in done}
    assert len(keys) == 1, keys  # one refresh, under the lock; the others read its key
    key = keys.pop().strip()
    assert key != before["key"]
    after = credentials(home)["gateways"][gateway.url]
    assert after["key"] == key and after["refresh_token"] != before["refresh_token"]
    assert stat.S_IMODE((home / "config" / "ezat-compat" / "credentials.json").stat().st_mode) == 0o600
    assert len(rows(gateway, "SELECT id FROM audit_log WHERE action = 'session.refresh'")) == refreshes + 1
    answer = requests.post(
        f"{gateway.url}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text

    set_expiry(home, gateway, time.time() - 10)  # expired: refreshed again
    again = ezat(home, "token")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() not in (key, before["key"])


def test_token_without_a_sign_in_says_to_log_in(gateway: ConsoleGateway, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = ezat(home, "token")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "run `ezat-compat login --gateway URL`" in done.stderr
    named = ezat(home, "token", "--gateway", gateway.url)
    assert named.returncode == 1 and named.stderr.count("\n") == 1
    assert f"run `ezat-compat login --gateway {gateway.url}`" in named.stderr


def test_token_after_the_idp_ended_the_sign_in_says_to_log_in_again(
    gateway: ConsoleGateway, idp: LoopbackIdP, tmp_path: Path
) -> None:

    home = tmp_path / "home"
    home.mkdir()
    login(home, gateway, idp, "otto")
    assert requests.post(f"{idp.issuer}/users/otto/revoke-tokens", timeout=10).status_code == 204
    set_expiry(home, gateway, time.time() - 10)
    done = ezat(home, "token")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"run `ezat-compat login --gateway {gateway.url}`" in done.stderr


def test_login_to_a_gateway_without_identity_fails_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = ezat(home, "login", "--gateway", "http://127.0.0.1:9", "--no-browser")  # nothing listens on port 9
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "can't reach http://127.0.0.1:9" in done.stderr
    bad = ezat(home, "login", "--gateway", "ftp://example.com")
    assert bad.returncode == 1 and "--gateway" in bad.stderr
