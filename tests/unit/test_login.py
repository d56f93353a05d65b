"""``ezat-compat login``/``token``'s own rules (ezat_compat/login.py), the gateway replayed with
``responses`` and the clock and sleep passed in: the polling follows RFC 8628 section 3.5 (the
interval, 5 s more at each ``slow_down``, a refusal or an expiry ends it); the refresh margin; the
gateway's URL as kept; the credentials file (0600 in a folder 0700, one entry per gateway, replaced
whole) and the OS keyring when one is usable (the file then holds no secret)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import responses

from ezat_compat.login import (
    CLIENT_ID,
    DEVICE_CODE_GRANT,
    Credential,
    Credentials,
    LoginError,
    SignInOverError,
    current_key,
    normal_gateway,
    refresh_margin,
    sign_in,
)

GATEWAY = "https://llm.example.com"
GRANT = {
    "device_code": "dc-secret",
    "user_code": "BCDF-GHJK",
    "verification_uri": f"{GATEWAY}/oauth/device",
    "verification_uri_complete": f"{GATEWAY}/oauth/device?user_code=BCDF-GHJK",
    "expires_in": 600,
    "interval": 5,
}
TOKENS = {"access_token": "ezat_sk_new", "token_type": "Bearer", "expires_in": 28800, "refresh_token": "rt-2"}


class Clock:
    """A clock that ``sleep`` moves on; the waits are noted."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


class FakeKeyring:
    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, user: str) -> str | None:
        return self.secrets.get((service, user))

    def set_password(self, service: str, user: str, secret: str) -> None:
        self.secrets[(service, user)] = secret


def _errors(*errors: str) -> list[dict[str, Any]]:
    return [{"error": e, "error_description": e} for e in errors]


def _replay(polls: list[dict[str, Any]]) -> None:
    responses.add(responses.POST, f"{GATEWAY}/oauth/device/code", json=GRANT)
    for answer in polls:
        status = 200 if "access_token" in answer else 400
        responses.add(responses.POST, f"{GATEWAY}/oauth/token", json=answer, status=status)


@responses.activate
def test_polling_waits_the_interval_and_5_s_more_at_each_slow_down(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    _replay([*_errors("authorization_pending", "slow_down", "authorization_pending", "slow_down"), TOKENS])
    credential = sign_in(GATEWAY, no_browser=True, sleep=clock.sleep, clock=clock)
    assert clock.waits == [5, 5, 10, 10, 15]
    assert credential == Credential(GATEWAY, "rt-2", "ezat_sk_new", clock.now + 28800, 28800)
    said = capsys.readouterr().err
    assert f"open {GATEWAY}/oauth/device and enter the code BCDF-GHJK" in said
    polls = [c.request for c in responses.calls if c.request.url.endswith("/oauth/token")]
    sent = dict(p.split("=", 1) for p in str(polls[0].body).split("&"))
    assert sent == {
        "grant_type": DEVICE_CODE_GRANT.replace(":", "%3A"),
        "device_code": "dc-secret",
        "client_id": CLIENT_ID,
    }


@pytest.mark.parametrize(
    ("error", "said"),
    [("access_denied", "the sign-in was refused"), ("expired_token", "the code has expired")],
)
@responses.activate
def test_a_refusal_or_an_expiry_ends_the_polling(error: str, said: str) -> None:
    clock = Clock()
    _replay(_errors("authorization_pending", error))
    with pytest.raises(LoginError, match=said):
        sign_in(GATEWAY, no_browser=True, sleep=clock.sleep, clock=clock)


@responses.activate
def test_polling_stops_when_the_code_has_expired_here_too() -> None:
    clock = Clock()
    _replay(_errors(*["authorization_pending"] * 200))
    with pytest.raises(LoginError, match="the code has expired"):
        sign_in(GATEWAY, no_browser=True, sleep=clock.sleep, clock=clock)
    assert sum(clock.waits) >= 600 and len(clock.waits) <= 121


@responses.activate
def test_a_gateway_without_the_device_grant_says_so() -> None:
    responses.add(
        responses.POST, f"{GATEWAY}/oauth/device/code", json={"error": {"message": "Invalid URL"}}, status=404
    )
    with pytest.raises(LoginError, match="offers no command-line sign-in"):
        sign_in(GATEWAY, no_browser=True, sleep=lambda _: None)


@pytest.mark.parametrize(("life_s", "margin_s"), [(28800, 300), (3000, 300), (1800, 180), (180, 18), (0, 0)], ids=str)
def test_the_refresh_margin_is_5_minutes_or_a_tenth_of_the_life(life_s: float, margin_s: float) -> None:
    assert refresh_margin(life_s) == margin_s


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("https://llm.example.com/", "https://llm.example.com"),
        (" http://127.0.0.1:8080 ", "http://127.0.0.1:8080"),
        ("https://tools.example.com/ezat/", "https://tools.example.com/ezat"),
    ],
)
def test_the_gateway_url_is_kept_without_its_final_slash(given: str, kept: str) -> None:
    assert normal_gateway(given) == kept


@pytest.mark.parametrize("bad", ["llm.example.com", "ftp://llm.example.com", "https://x.example.com/?a=1", ""])
def test_a_gateway_that_is_no_http_url_is_refused(bad: str) -> None:
    with pytest.raises(LoginError, match="--gateway"):
        normal_gateway(bad)


def test_the_file_is_0600_in_a_folder_0700_one_entry_per_gateway(tmp_path: Path) -> None:
    store = Credentials(tmp_path / "cfg" / "ezat-compat")
    first = Credential(GATEWAY, "rt", "ezat_sk_a", 2.0e9, 28800)
    other = Credential("http://127.0.0.1:8080", "rt-b", "ezat_sk_b", 2.0e9, 28800)
    with store.locked():
        store.save(first)
        store.save(other)
    assert stat.S_IMODE(store.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.gateways() == ["http://127.0.0.1:8080", GATEWAY]
    assert store.load(GATEWAY) == first and store.load(other.gateway) == other
    assert [p.name for p in store.folder.iterdir() if p.name.startswith(".credentials-")] == []  # replaced whole


def test_with_a_usable_keyring_the_file_holds_no_secret(tmp_path: Path) -> None:
    keyring = FakeKeyring()
    store = Credentials(tmp_path / "ezat-compat", keyring)
    credential = Credential(GATEWAY, "rt-secret", "ezat_sk_secret", 2.0e9, 28800)
    store.save(credential)
    assert "secret" not in store.path.read_text()
    assert json.loads(store.path.read_text())["gateways"] == {GATEWAY: {"store": "keyring"}}
    assert json.loads(keyring.secrets[("ezat-compat", GATEWAY)])["refresh_token"] == "rt-secret"
    assert store.load(GATEWAY) == credential


@responses.activate
def test_token_keeps_a_fresh_key_and_renews_a_due_one(tmp_path: Path) -> None:
    clock = Clock()
    store = Credentials(tmp_path / "ezat-compat")
    store.save(Credential(GATEWAY, "rt-1", "ezat_sk_old", clock.now + 3600, 28800))
    assert current_key(store, None, clock=clock) == "ezat_sk_old"  # an hour left: kept, no request
    assert len(responses.calls) == 0
    clock.now += 3600 - 200  # 200 s left: due
    responses.add(responses.POST, f"{GATEWAY}/oauth/token", json=TOKENS)
    assert current_key(store, GATEWAY + "/", clock=clock) == "ezat_sk_new"
    assert store.load(GATEWAY) == Credential(GATEWAY, "rt-2", "ezat_sk_new", clock.now + 28800, 28800)
    assert "refresh_token=rt-1" in str(responses.calls[0].request.body)


@responses.activate
def test_a_refused_refresh_says_to_sign_in_again_and_a_gateway_away_keeps_the_key(tmp_path: Path) -> None:
    clock = Clock()
    store = Credentials(tmp_path / "ezat-compat")
    store.save(Credential(GATEWAY, "rt-1", "ezat_sk_old", clock.now + 100, 28800))
    responses.add(responses.POST, f"{GATEWAY}/oauth/token", json={"error": "temporarily_unavailable"}, status=503)
    assert current_key(store, None, clock=clock) == "ezat_sk_old"  # still valid 100 s: better than nothing
    responses.replace(responses.POST, f"{GATEWAY}/oauth/token", json={"error": "invalid_grant"}, status=400)
    with pytest.raises(SignInOverError, match=f"run `ezat-compat login --gateway {GATEWAY}`"):
        current_key(store, None, clock=clock)


def test_token_without_a_sign_in_or_with_several_gateways(tmp_path: Path) -> None:
    store = Credentials(tmp_path / "ezat-compat")
    with pytest.raises(LoginError, match=r"run `ezat-compat login --gateway URL`"):
        current_key(store, None)
    store.save(Credential(GATEWAY, "rt", "k1", 2.0e9, 28800))
    store.save(Credential("http://127.0.0.1:8080", "rt", "k2", 2.0e9, 28800))
    with pytest.raises(LoginError, match="several gateways"):
        current_key(store, None)
    assert current_key(store, "http://127.0.0.1:8080/") == "k2"
