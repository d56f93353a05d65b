"""Signing in from the command line (the device grant, RFC 8628: ``/oauth/…``) against a real
gateway (gunicorn, two workers, the simulator upstream) and a real OpenID Connect provider on
loopback (tests/support/oidc.py), the person's browser step driven with ``requests`` one
redirect at a time (tests/support/device.py).

What is held: the device authorization's shape (RFC 8628 section 3.2: an absolute verification
URI, a user code of 8 unambiguous letters, 600 s, 5 s); the token endpoint's errors (section
3.5: ``authorization_pending``, ``slow_down`` with a longer interval, ``access_denied``,
``expired_token``; RFC 6749 section 5.2: ``invalid_grant``, ``invalid_request``,
``unsupported_grant_type``; JSON, 400, ``Cache-Control: no-store``); the tokens issued once; the
minted key works on Chat Completions and the ledger names the person, its life is ``key_hours``
and it is refused once expired; a refresh rotates the refresh token (the old one refused) and
mints a new key; a refresh after the IdP revoked the person's tokens, after the person left
every mapped group, or once they are disabled, is ``invalid_grant`` and revokes the session's
key; a person in no mapped group is refused at the browser and the client told
``access_denied``; the verification form needs its CSRF token; each change leaves its audit row;
no secret reaches the gateway's log; ``/oauth/…`` is 404 without ``[identity]``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from tests.integration.harness import Gateway, ModelSpec, Sim
from tests.support.browser import ConsoleGateway
from tests.support.device import (
    CLIENT_ID,
    DEVICE_CODE_GRANT,
    GROUP,
    ORG,
    approve,
    chat,
    execute,
    poll,
    poll_until_issued,
    refresh,
    rows,
    start,
    start_gateway,
    submit_code,
    token,
)
from tests.support.oidc import LoopbackIdP, loopback_idp

pytestmark = pytest.mark.integration

KEY_HOURS = 2.5
SESSION_DAYS = 7
PEOPLE = {  # subject: IdP groups (each test that changes a person has one of its own)
    "dana": [GROUP, "staff"],
    "erin": [GROUP],
    "fred": [GROUP],
    "gina": [GROUP],
    "hugo": [GROUP],
    "nadia": ["contractors"],  # in no group the gateway maps: no organisation pays
}
SECRETS: list[str] = []  # every device code, refresh token and key handed out: never in the log


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="sim").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def idp() -> Iterator[LoopbackIdP]:
    with loopback_idp() as provider:
        for sub, groups in PEOPLE.items():
            provider.add_user(sub, name=sub.title(), email=f"{sub}@example.com", groups=groups)
        yield provider


@pytest.fixture(scope="module")
def gateway(sim: Sim, idp: LoopbackIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    from tests.support.device import device_gateway

    server = start_gateway(
        device_gateway(tmp_path_factory.mktemp("device"), idp, sim, key_hours=KEY_HOURS, session_days=SESSION_DAYS)
    )
    yield server
    server.stop()


def _kept(*values: str) -> None:
    SECRETS.extend(v for v in values if v)


def sign_in(gateway: ConsoleGateway, idp: LoopbackIdP, sub: str) -> dict[str, Any]:
    """The whole flow for ``sub``: the tokens."""
    grant = start(gateway.url)
    _kept(grant["device_code"])
    page = approve(requests.Session(), grant["verification_uri_complete"], idp, sub)
    assert page.status_code == 200, page.text
    tokens = poll_until_issued(gateway.url, grant)
    _kept(tokens["access_token"], tokens["refresh_token"])
    return tokens


def person_id(gateway: ConsoleGateway, sub: str) -> int:
    found = rows(gateway, "SELECT id FROM users WHERE subject = :sub", sub=sub)
    assert len(found) == 1, found
    return int(found[0]["id"])


def audit(gateway: ConsoleGateway, action: str) -> list[dict[str, Any]]:
    return rows(gateway, "SELECT * FROM audit_log WHERE action = :action ORDER BY id", action=action)


def assert_oauth_error(answer: requests.Response, error: str, status: int = 400) -> dict[str, Any]:
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert answer.headers["Content-Type"].startswith("application/json")
    assert answer.headers["Cache-Control"] == "no-store"
    body: dict[str, Any] = answer.json()
    assert body["error"] == error, body
    assert isinstance(body["error_description"], str) and body["error_description"]
    return body


def refused_within(gateway: ConsoleGateway, key: str, seconds: float = 10) -> requests.Response:
    """Chat with ``key`` until it is refused (a worker may have it cached a moment)."""
    deadline = time.monotonic() + seconds
    while True:
        answer = chat(gateway.url, key)
        if answer.status_code == 401 or time.monotonic() > deadline:
            return answer
        time.sleep(0.5)


# ---------------------------------------------------------------- the device authorization


def test_device_authorization_has_rfc_8628_shape(gateway: ConsoleGateway) -> None:
    grant = start(gateway.url)
    _kept(grant["device_code"])
    assert set(grant) == {
        "device_code",
        "user_code",
        "verification_uri",
        "verification_uri_complete",
        "expires_in",
        "interval",
    }
    assert grant["verification_uri"] == gateway.url + "/oauth/device"
    assert re.fullmatch(r"[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}", grant["user_code"])
    query = parse_qs(urlsplit(grant["verification_uri_complete"]).query)
    assert query == {"user_code": [grant["user_code"]]}
    assert (grant["expires_in"], grant["interval"]) == (600, 5)
    assert len(grant["device_code"]) >= 40  # 256 bits, base64url
    stored = rows(gateway, "SELECT * FROM device_grants WHERE user_code = :c", c=grant["user_code"].replace("-", ""))
    assert len(stored) == 1 and stored[0]["code_hash"] != grant["device_code"]  # a hash alone is kept
    assert grant["device_code"] not in json.dumps(stored, default=str)


def test_device_code_needs_a_client_id(gateway: ConsoleGateway) -> None:
    answer = requests.post(f"{gateway.url}/oauth/device/code", data={}, timeout=10)
    assert_oauth_error(answer, "invalid_request")


def test_pending_then_slow_down_with_a_longer_interval(gateway: ConsoleGateway) -> None:
    grant = start(gateway.url)
    _kept(grant["device_code"])
    assert_oauth_error(poll(gateway.url, grant), "authorization_pending")
    body = assert_oauth_error(poll(gateway.url, grant), "slow_down")
    assert body["interval"] == 10
    body = assert_oauth_error(poll(gateway.url, grant), "slow_down")
    assert body["interval"] == 15


def test_whole_flow_mints_a_working_key_bound_to_the_person(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    before = datetime.now(UTC).timestamp()
    grant = start(gateway.url)
    _kept(grant["device_code"])
    session = requests.Session()
    page = session.get(grant["verification_uri_complete"], timeout=10)
    assert page.status_code == 200
    assert grant["user_code"] in page.text  # prefilled, for the person to compare with the terminal
    assert "script" not in page.text.lower()
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["Cache-Control"] == "no-store"
    to_idp = submit_code(session, grant["verification_uri_complete"])
    assert to_idp.status_code == 303, to_idp.text
    sent = {k: v[-1] for k, v in parse_qs(urlsplit(to_idp.headers["Location"]).query).items()}
    assert sent["code_challenge_method"] == "S256" and sent["code_challenge"] and sent["nonce"] and sent["state"]
    assert sent["redirect_uri"] == gateway.url + "/oauth/device/callback"
    assert sent["client_id"] == idp.client_id
    back = requests.post(to_idp.headers["Location"], data={"sub": "dana"}, allow_redirects=False, timeout=10)
    done = session.get(back.headers["Location"], timeout=30)
    assert done.status_code == 200
    assert "You are signed in as <strong>dana@example.com</strong>; return to your terminal." in done.text

    answer = poll(gateway.url, grant)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Cache-Control"] == "no-store"
    tokens = answer.json()
    _kept(tokens["access_token"], tokens["refresh_token"])
    assert tokens["token_type"] == "Bearer"
    assert tokens["access_token"].startswith("ezat_sk_")
    assert tokens["expires_in"] == int(KEY_HOURS * 3600)
    assert len(tokens["refresh_token"]) >= 40

    dana = person_id(gateway, "dana")
    keys = rows(gateway, "SELECT * FROM api_keys WHERE user_id = :u", u=dana)
    assert len(keys) == 1
    life_s = keys[0]["expires_at"] / 1e6 - before
    assert KEY_HOURS * 3600 - 5 < life_s < KEY_HOURS * 3600 + 60
    org = rows(gateway, "SELECT id FROM orgs WHERE name = :n", n=ORG)[0]["id"]
    assert keys[0]["org_id"] == org

    completion = chat(gateway.url, tokens["access_token"])
    assert completion.status_code == 200, completion.text
    request_id = completion.headers["request-id"]
    ledger = rows(gateway, "SELECT user_id, key_id FROM ledger WHERE request_id = :r", r=request_id)
    assert ledger == [{"user_id": dana, "key_id": keys[0]["id"]}]

    sessions = rows(gateway, "SELECT * FROM user_sessions WHERE user_id = :u", u=dana)
    assert len(sessions) == 1 and sessions[0]["key_id"] == keys[0]["id"]
    assert sessions[0]["idp_refresh"].startswith("ezs2.")  # the IdP's refresh token, sealed
    assert (sessions[0]["expires_at"] - sessions[0]["refreshed_at"]) / 1e6 == SESSION_DAYS * 86400
    approvals = [a for a in audit(gateway, "device.approve") if a["actor"] == "sso:dana"]
    assert approvals and approvals[-1]["target_id"] == grant["user_code"]
    opened = [a for a in audit(gateway, "session.open") if a["actor"] == "sso:dana"]
    assert opened and opened[-1]["target_id"] == sessions[0]["public_id"]

    # Used once: the same device code gets nothing more.
    assert_oauth_error(poll(gateway.url, grant), "invalid_grant")


def test_user_code_is_read_in_any_case_without_the_dash(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    grant = start(gateway.url)
    _kept(grant["device_code"])
    typed = grant["user_code"].replace("-", " ").lower()
    page = approve(requests.Session(), grant["verification_uri"], idp, "hugo", user_code=typed)
    assert page.status_code == 200, page.text
    tokens = poll_until_issued(gateway.url, grant)
    _kept(tokens["access_token"], tokens["refresh_token"])


def test_expired_device_code(gateway: ConsoleGateway) -> None:
    grant = start(gateway.url)
    _kept(grant["device_code"])
    code = grant["user_code"].replace("-", "")
    assert execute(gateway, "UPDATE device_grants SET expires_at = expires_at - 601000000 WHERE user_code = :c", c=code)
    assert_oauth_error(poll(gateway.url, grant), "expired_token")
    typed = submit_code(requests.Session(), grant["verification_uri_complete"])
    assert typed.status_code == 400
    assert "unknown or has expired" in typed.text


def test_person_in_no_mapped_group_is_refused_and_the_client_told(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    grant = start(gateway.url)
    _kept(grant["device_code"])
    page = approve(requests.Session(), grant["verification_uri_complete"], idp, "nadia")
    assert page.status_code == 403
    assert "no group the gateway maps to an organization" in page.text
    assert_oauth_error(poll(gateway.url, grant), "access_denied")
    denied = audit(gateway, "device.deny")
    assert any(a["actor"] == "sso:nadia" and a["target_id"] == grant["user_code"] for a in denied)
    assert not rows(gateway, "SELECT id FROM api_keys WHERE name LIKE '%nadia%'")


def test_verification_form_needs_its_csrf_token(gateway: ConsoleGateway) -> None:
    grant = start(gateway.url)
    _kept(grant["device_code"])
    session = requests.Session()
    session.get(grant["verification_uri_complete"], timeout=10)
    forged = session.post(
        f"{gateway.url}/oauth/device",
        data={"user_code": grant["user_code"], "csrf_token": "x" * 43},
        allow_redirects=False,
        timeout=10,
    )
    assert forged.status_code == 400
    assert "out of date" in forged.text
    elsewhere = requests.post(
        f"{gateway.url}/oauth/device", data={"user_code": grant["user_code"]}, allow_redirects=False, timeout=10
    )
    assert elsewhere.status_code == 400


def test_callback_of_another_browser_or_replayed_is_refused(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    grant = start(gateway.url)
    _kept(grant["device_code"])
    to_idp = submit_code(requests.Session(), grant["verification_uri_complete"])
    back = requests.post(to_idp.headers["Location"], data={"sub": "dana"}, allow_redirects=False, timeout=10)
    stranger = requests.get(back.headers["Location"], timeout=10)  # no binding cookie
    assert stranger.status_code == 400
    assert "unknown to this browser" in stranger.text
    assert_oauth_error(poll(gateway.url, grant), "authorization_pending")


def test_token_endpoint_errors(gateway: ConsoleGateway) -> None:
    assert_oauth_error(token(gateway.url), "invalid_request")
    assert_oauth_error(token(gateway.url, grant_type="password", username="a", password="b"), "unsupported_grant_type")
    assert_oauth_error(token(gateway.url, grant_type=DEVICE_CODE_GRANT, client_id=CLIENT_ID), "invalid_request")
    assert_oauth_error(token(gateway.url, grant_type=DEVICE_CODE_GRANT, device_code="nope"), "invalid_request")
    assert_oauth_error(
        token(gateway.url, grant_type=DEVICE_CODE_GRANT, device_code="nope", client_id=CLIENT_ID), "invalid_grant"
    )
    assert_oauth_error(token(gateway.url, grant_type="refresh_token"), "invalid_request")
    assert_oauth_error(refresh(gateway.url, "not-a-token"), "invalid_grant")
    grant = start(gateway.url)
    _kept(grant["device_code"])
    assert_oauth_error(poll(gateway.url, grant, client_id="another-client"), "invalid_grant")
    assert requests.get(f"{gateway.url}/oauth/token", timeout=10).status_code == 405


# ---------------------------------------------------------------- refreshing


def test_refresh_rotates_the_token_and_mints_a_new_key(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    first = sign_in(gateway, idp, "dana")
    second = refresh(gateway.url, first["refresh_token"])
    assert second.status_code == 200, second.text
    assert second.headers["Cache-Control"] == "no-store"
    renewed = second.json()
    _kept(renewed["access_token"], renewed["refresh_token"])
    assert renewed["refresh_token"] != first["refresh_token"]
    assert renewed["access_token"] != first["access_token"]
    assert renewed["expires_in"] == int(KEY_HOURS * 3600)
    assert chat(gateway.url, renewed["access_token"]).status_code == 200
    assert chat(gateway.url, first["access_token"]).status_code == 200  # the old key lives out its hours
    assert_oauth_error(refresh(gateway.url, first["refresh_token"]), "invalid_grant")  # rotated: refused
    third = refresh(gateway.url, renewed["refresh_token"])
    assert third.status_code == 200, third.text
    _kept(third.json()["access_token"], third.json()["refresh_token"])
    assert any(a["actor"] == "sso:dana" for a in audit(gateway, "session.refresh"))


def test_refresh_with_another_client_id_is_refused_and_changes_nothing(
    gateway: ConsoleGateway, idp: LoopbackIdP
) -> None:
    tokens = sign_in(gateway, idp, "hugo")
    assert_oauth_error(refresh(gateway.url, tokens["refresh_token"], client_id="someone-else"), "invalid_grant")
    again = refresh(gateway.url, tokens["refresh_token"])
    assert again.status_code == 200, again.text
    _kept(again.json()["access_token"], again.json()["refresh_token"])


def test_refresh_after_the_idp_revoked_the_person_is_refused(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    tokens = sign_in(gateway, idp, "erin")
    assert requests.post(f"{idp.issuer}/users/erin/revoke-tokens", timeout=10).status_code == 204
    assert_oauth_error(refresh(gateway.url, tokens["refresh_token"]), "invalid_grant")
    assert refused_within(gateway, tokens["access_token"]).status_code == 401  # the session's key revoked
    erin = person_id(gateway, "erin")
    ended = rows(gateway, "SELECT ended_at, idp_refresh FROM user_sessions WHERE user_id = :u", u=erin)
    assert ended and all(s["ended_at"] is not None and s["idp_refresh"] is None for s in ended)
    refused = [a for a in audit(gateway, "session.refused") if a["actor"] == "sso:erin"]
    assert refused and "identity provider refused" in refused[-1]["after"]
    assert_oauth_error(refresh(gateway.url, tokens["refresh_token"]), "invalid_grant")  # over for good


def test_refresh_after_leaving_every_mapped_group_is_refused(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    tokens = sign_in(gateway, idp, "fred")
    idp.add_user("fred", name="Fred", email="fred@example.com", groups=["contractors"])
    assert_oauth_error(refresh(gateway.url, tokens["refresh_token"]), "invalid_grant")
    assert refused_within(gateway, tokens["access_token"]).status_code == 401
    refused = [a for a in audit(gateway, "session.refused") if a["actor"] == "sso:fred"]
    assert refused and "NoOrganisationError" in refused[-1]["after"]


def test_refresh_of_a_disabled_person_is_refused(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    tokens = sign_in(gateway, idp, "gina")
    execute(gateway, "UPDATE users SET disabled_at = 1 WHERE subject = 'gina'")
    assert_oauth_error(refresh(gateway.url, tokens["refresh_token"]), "invalid_grant")
    refused = [a for a in audit(gateway, "session.refused") if a["actor"] == "sso:gina"]
    assert refused and "PersonDisabledError" in refused[-1]["after"]


def test_minted_key_is_refused_once_expired(gateway: ConsoleGateway, idp: LoopbackIdP) -> None:
    tokens = sign_in(gateway, idp, "hugo")
    assert chat(gateway.url, tokens["access_token"]).status_code == 200
    hugo = person_id(gateway, "hugo")
    moved = execute(
        gateway,
        "UPDATE api_keys SET expires_at = :past WHERE user_id = :u AND revoked_at IS NULL",
        past=int((time.time() - 1) * 1e6),
        u=hugo,
    )
    assert moved >= 1
    assert refused_within(gateway, tokens["access_token"]).status_code == 401


def test_sign_in_attempts_are_limited_per_address(
    sim: Sim, idp: LoopbackIdP, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.support.device import device_gateway

    limited = device_gateway(tmp_path_factory.mktemp("limited"), idp, sim, workers=1)
    limited.extra_toml = limited.extra_toml.replace(
        "sign_in_attempts_per_minute = 1000", "sign_in_attempts_per_minute = 2"
    )
    start_gateway(limited)
    try:
        answers = [
            requests.post(f"{limited.url}/oauth/device/code", data={"client_id": CLIENT_ID}, timeout=10)
            for _ in range(11)
        ]
        for answer in answers[:10]:
            _kept(answer.json()["device_code"])
        assert [a.status_code for a in answers] == [200] * 10 + [429]  # five times the attempts
        assert answers[10].headers["Retry-After"] == "60"
        assert answers[10].json()["error"] == "slow_down"
        page = requests.Session()
        page.get(f"{limited.url}/oauth/device", timeout=10)
        tries = [
            page.post(
                f"{limited.url}/oauth/device",
                data={"user_code": "BCDF-GHJK", "csrf_token": page.cookies.get("ezat_device_csrf", "")},
                timeout=10,
            ).status_code
            for _ in range(3)
        ]
        assert tries == [400, 400, 429]  # an unknown code twice, then no more guesses this minute
    finally:
        limited.stop()


def test_without_identity_there_is_no_oauth(sim: Sim, tmp_path: Path) -> None:
    plain = Gateway(root=tmp_path, models=[ModelSpec(deployments=[{"name": "sim", "base_url": sim.url}])]).start()
    try:
        answer = requests.post(f"{plain.url}/oauth/device/code", data={"client_id": CLIENT_ID}, timeout=10)
        assert answer.status_code == 404
        assert requests.get(f"{plain.url}/oauth/device", timeout=10).status_code == 404
    finally:
        plain.stop()


def test_no_secret_reaches_the_log(gateway: ConsoleGateway) -> None:
    """Last of the module: every secret the tests were handed, looked for in the gateway's log and
    its audit rows."""
    assert len(SECRETS) > 10
    log = gateway.log_text()
    assert "/oauth/token" in log  # the log is the one the requests went to
    trail = json.dumps(rows(gateway, "SELECT * FROM audit_log"), default=str)
    for secret in SECRETS:
        assert secret not in log
        assert secret not in trail
