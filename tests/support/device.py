"""Helpers of the command-line sign-in's tests (the device grant, ``/oauth/…``): a gateway whose
``[identity]`` is the loopback provider's (tests/support/oidc.py) with groups that name
organisations, and the person's browser step done with ``requests`` one redirect at a time.

    with loopback_idp() as idp:
        idp.add_user("dana", groups=["engineers"])
        gateway = device_gateway(tmp_path, idp, sim).start()
        grant = start(gateway.url)
        page = approve(requests.Session(), grant["verification_uri_complete"], idp, "dana")
        tokens = poll_until_issued(gateway.url, grant)

``approve`` follows what a browser does: the verification page (its CSRF token read from the
form), the form's POST (a 303 to the provider), the provider's form as ``sub`` (a 302 back to the
gateway's callback), the callback (the page saying who signed in).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests
from sqlalchemy import create_engine, text

from tests.integration.harness import REPO, ModelSpec, Sim
from tests.support.browser import ConsoleGateway
from tests.support.oidc import AUTHORIZE_PATH, LoopbackIdP

CLIENT_ID = "ezat-cli"
CLIENT_SECRET = "loopback-client-secret"  # the gateway reads it from EZAT_OIDC_CLIENT_SECRET
DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
ORG = "team-a"
GROUP = "engineers"  # [identity.groups."engineers"]: paid by team-a
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def identity_toml(
    idp: LoopbackIdP, *, key_hours: float = 8.0, session_days: int = 30, secure_cookies: bool = False
) -> str:
    """``[identity]`` for ``idp`` with the group ``engineers`` paid by ``team-a``; ``[console]``
    with room for the tests' many sign-ins from one address, and plain-HTTP cookies unless
    ``secure_cookies`` (``requests`` sends no ``Secure`` cookie over http; Chromium keeps them
    for http://127.0.0.1)."""
    return (
        idp.identity_toml()
        + f"key_hours = {key_hours}\nsession_days = {session_days}\n"
        + f'\n[identity.groups."{GROUP}"]\norg = "{ORG}"\n'
        + f"\n[console]\nsecure_cookies = {'true' if secure_cookies else 'false'}\n"
        + "sign_in_attempts_per_minute = 1000\n"
    )


def device_gateway(
    root: Path, idp: LoopbackIdP, sim: Sim, *, workers: int = 2, extra_toml: str = "", **identity: Any
) -> ConsoleGateway:
    """A gunicorn gateway (not started) on the simulator, with ``identity_toml`` (``identity``:
    its ``key_hours``/``session_days``) and then ``extra_toml``."""
    return ConsoleGateway(
        root=root,
        models=[ModelSpec(deployments=[{"name": "sim", "base_url": sim.url}])],
        workers=workers,
        env={"EZAT_OIDC_CLIENT_SECRET": CLIENT_SECRET},
        extra_toml=identity_toml(idp, **identity) + extra_toml,
    )


def start_gateway(gateway: ConsoleGateway, balance: str = "100") -> ConsoleGateway:
    """Start ``gateway`` with the organisation ``team-a`` made first (``[identity.groups]``
    must name organisations that exist when it starts)."""
    gateway.root.mkdir(parents=True, exist_ok=True)
    gateway.write_config()
    gateway.cli("db", "upgrade")
    gateway.cli("orgs", "create", ORG, "--balance", balance)
    gateway.start()
    return gateway


def start(gateway_url: str, client_id: str = CLIENT_ID) -> dict[str, Any]:
    """``POST /oauth/device/code``: the device authorization (RFC 8628 section 3.2)."""
    answer = requests.post(f"{gateway_url}/oauth/device/code", data={"client_id": client_id}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Cache-Control"] == "no-store"
    body: dict[str, Any] = answer.json()
    return body


def token(gateway_url: str, **form: str) -> requests.Response:
    """One ``POST /oauth/token`` with ``form``."""
    return requests.post(f"{gateway_url}/oauth/token", data=form, timeout=30)


def poll(gateway_url: str, grant: dict[str, Any], client_id: str = CLIENT_ID) -> requests.Response:
    """One poll of the token endpoint with the device code of ``grant``."""
    return token(gateway_url, grant_type=DEVICE_CODE_GRANT, device_code=grant["device_code"], client_id=client_id)


def refresh(gateway_url: str, refresh_token: str, client_id: str = CLIENT_ID) -> requests.Response:
    return token(gateway_url, grant_type="refresh_token", refresh_token=refresh_token, client_id=client_id)


def csrf_token(page: str) -> str:
    found = _CSRF.search(page)
    assert found is not None, page[:2000]
    return html.unescape(found.group(1))


def submit_code(session: requests.Session, verification_uri: str, user_code: str | None = None) -> requests.Response:
    """Open the verification page (``verification_uri``, ``?user_code=`` prefilled or not) and
    submit its form with ``user_code`` (default: the prefilled one); returns the POST's answer
    (a 303 to the provider when the code is good), redirects not followed."""
    page = session.get(verification_uri, timeout=10)
    assert page.status_code == 200, page.text[:1000]
    if user_code is None:
        prefilled = re.search(r'name="user_code" value="([^"]*)"', page.text)
        assert prefilled is not None, page.text[:2000]
        user_code = html.unescape(prefilled.group(1))
    action = urljoin(verification_uri, "/oauth/device")
    return session.post(
        action,
        data={"csrf_token": csrf_token(page.text), "user_code": user_code},
        allow_redirects=False,
        timeout=10,
    )


def approve(
    session: requests.Session, verification_uri: str, idp: LoopbackIdP, sub: str, user_code: str | None = None
) -> requests.Response:
    """The person's whole browser step as ``sub``: returns the callback's page."""
    to_idp = submit_code(session, verification_uri, user_code)
    assert to_idp.status_code == 303, (to_idp.status_code, to_idp.text[:1000])
    authorize = to_idp.headers["Location"]
    assert authorize.startswith(idp.issuer + AUTHORIZE_PATH), authorize
    back = requests.post(authorize, data={"sub": sub}, allow_redirects=False, timeout=10)
    assert back.status_code == 302, (back.status_code, back.text[:500])
    return session.get(back.headers["Location"], timeout=30)


def poll_until_issued(gateway_url: str, grant: dict[str, Any], *, timeout_s: float = 30) -> dict[str, Any]:
    """Poll at the grant's interval until the tokens come (or fail on any other error)."""
    deadline = time.monotonic() + timeout_s
    interval = float(grant["interval"])
    while True:
        answer = poll(gateway_url, grant)
        if answer.status_code == 200:
            body: dict[str, Any] = answer.json()
            return body
        error = answer.json()["error"]
        assert error in ("authorization_pending", "slow_down"), answer.text
        if error == "slow_down":
            interval += 5
        assert time.monotonic() < deadline, "the tokens never came"
        time.sleep(interval)


def database(gateway: ConsoleGateway) -> Any:
    """An engine on the gateway's SQLite database, for the tests' own looks (and a few writes
    that move time: an expiry brought forward)."""
    return create_engine(f"sqlite:///{(gateway.root / 'ezat.db').as_posix()}")


def rows(gateway: ConsoleGateway, sql: str, **params: Any) -> list[dict[str, Any]]:
    engine = database(gateway)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text(sql), params)]
    finally:
        engine.dispose()


def execute(gateway: ConsoleGateway, sql: str, **params: Any) -> int:
    engine = database(gateway)
    try:
        with engine.begin() as conn:
            return int(conn.execute(text(sql), params).rowcount)
    finally:
        engine.dispose()


def chat(gateway_url: str, key: str) -> requests.Response:
    """One chat completion with ``key``."""
    return requests.post(
        f"{gateway_url}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 32},
        timeout=30,
    )


# ---------------------------------------------------------------- the person's laptop

PROMPT = re.compile(r"open (\S+) and enter the code ([A-Z]{4}-[A-Z]{4})")


def laptop_env(home: Path) -> dict[str, str]:
    """The person's environment for ``ezat-compat login``/``token``: their own home and config
    folder, no OS keyring, none of the gateway's variables."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("EZAT_", "XDG_"))},
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring",
    }


def ezat(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ezat-compat ARGS`` on the person's laptop (``laptop_env``), finished."""
    return subprocess.run(
        [sys.executable, "-m", "ezat_compat.cli", *args],
        cwd=REPO,
        env=laptop_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


@dataclass
class Login:
    """``ezat-compat login --gateway URL --no-browser`` under way: what it asked the person to
    open and type (``uri``, ``code``); ``finish`` waits for it."""

    proc: subprocess.Popen[str]
    uri: str
    code: str
    said: str

    def finish(self, timeout_s: float = 60) -> tuple[int, str, str]:
        """Wait for the command: its status, stdout and everything it said on stderr."""
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return self.proc.returncode, out, self.said + err


def begin_login(home: Path, gateway_url: str) -> Login:
    """Start ``ezat-compat login --gateway gateway_url --no-browser`` and read its prompt."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ezat_compat.cli", "login", "--gateway", gateway_url, "--no-browser"],
        cwd=REPO,
        env=laptop_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said = proc.stderr.readline()
    found = PROMPT.search(said)
    if found is None:
        proc.kill()
        _, rest = proc.communicate()
        raise AssertionError(said + rest)
    return Login(proc, found.group(1), found.group(2), said)
