"""The IdP's own JWTs as bearers on the inference routes, through the real gateway (gunicorn,
gevent) against a real OpenID Connect provider on loopback (tests/support/oidc.py), its tokens
made by the provider's own authorization code flow and signed with its key.

What is held: with ``[identity] jwt_bearers = true`` a JWT of the provider is accepted as
``Authorization: Bearer`` on the three POST routes and the ledger names its person (made at the
first request, billed to the organisation their group maps to); a token of another issuer, one
whose payload was changed, one signed with a key of our own under the provider's ``kid``, one
for another audience and one with ``alg: none`` are 401s in each dialect's envelope; an expired
one is a 401 (``clock_skew_s = 0``, tokens that live two seconds); a person in no mapped group is
a 403; a disabled person's JWT is refused at the next request and accepted again once enabled;
the gateway's own keys work as before; with ``jwt_bearers = false`` a JWT is "Invalid API key.".
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from joserfc import jwt
from joserfc.jwk import RSAKey
from sqlalchemy import select

from ezat_compat.idp import bearer
from ezat_compat.store.people import People
from ezat_compat.store.store import Store, open_store
from ezat_compat.store.tables import api_keys, ledger
from tests.integration.conftest import standard_models
from tests.integration.harness import Sim
from tests.support.oidc import LoopbackIdP, loopback_idp
from tests.support.spend_limits import TabledGateway

pytestmark = pytest.mark.integration

SONNET = "anthropic/claude-sonnet-5-5"
CHAT = "/openai/v1/chat/completions"
RESPONSES = "/openai/v1/responses"
MESSAGES = "/v1/messages"
ROUTES = (CHAT, RESPONSES, MESSAGES)
SHORT_LIFE_S = 2  # the second provider's tokens: expired soon after they are made


def identity(idp: LoopbackIdP, *, jwt_bearers: bool = True, clock_skew_s: int = 60) -> str:
    return f"""
[admin]
bind = ""
on_main_listener = true

[identity]
issuer = "{idp.issuer}"
client_id = "{idp.client_id}"
jwt_bearers = {str(jwt_bearers).lower()}
clock_skew_s = {clock_skew_s}

[identity.groups.team-a]
org = "team-a"
"""


@dataclass
class Rig:
    idp: LoopbackIdP  # the gateways' provider
    other: LoopbackIdP  # another provider (short-lived tokens): the second gateway's
    on: TabledGateway  # jwt_bearers = true, issuer ``idp``
    off: TabledGateway  # jwt_bearers = false, issuer ``idp``
    short: TabledGateway  # jwt_bearers = true, issuer ``other``, clock_skew_s = 0
    store: Store  # the first gateway's database

    @property
    def people(self) -> People:
        assert self.store.people is not None
        return self.store.people


@pytest.fixture(scope="module")
def rig(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root: Path = tmp_path_factory.mktemp("jwt-bearers")
    with loopback_idp() as idp, loopback_idp(token_max_age_s=SHORT_LIFE_S) as other:
        for provider in (idp, other):
            provider.add_user("alice", name="Alice", email="alice@example.com", groups=["team-a"])
            provider.add_user("bob", name="Bob", email="bob@example.com", groups=["team-a", "finance"])
            provider.add_user("dave", name="Dave", email="dave@example.com", groups=["interns"])
        gateways = []
        for name, tables in (
            ("on", identity(idp)),
            ("off", identity(idp, jwt_bearers=False)),
            ("short", identity(other, clock_skew_s=0)),
        ):
            gateway = TabledGateway(root=root / name, models=standard_models(sim.url), tables=tables)
            gateways.append(gateway.start())
        try:
            for gateway in gateways:
                gateway.cli("orgs", "top-up", "team-a", "100")
            store = open_store(f"sqlite:///{(root / 'on' / 'ezat.db').as_posix()}")
            try:
                yield Rig(idp, other, *gateways, store=store)
            finally:
                store.close()
        finally:
            for gateway in gateways:
                gateway.stop()


def body(path: str) -> dict[str, Any]:
    if path == RESPONSES:
        return {"model": SONNET, "input": "Say hi.", "max_output_tokens": 64}
    return {"model": SONNET, "max_tokens": 64, "messages": [{"role": "user", "content": "Say hi."}]}


def post(url: str, path: str, token: str) -> requests.Response:
    return requests.post(url + path, json=body(path), headers={"authorization": f"Bearer {token}"}, timeout=30)


def refusal(response: requests.Response, path: str, status: int = 401) -> str:
    """The message of a refusal, after checking the dialect's envelope."""
    assert response.status_code == status, (path, response.status_code, response.text)
    document = response.json()
    if path == MESSAGES:
        assert document["type"] == "error", document
        expected = "authentication_error" if status == 401 else "permission_error"
        assert document["error"]["type"] == expected, document
    else:
        expected = "invalid_request_error" if status == 401 else "permission_error"
        assert document["error"]["type"] == expected, document
        if status == 401:
            assert document["error"]["code"] == "invalid_api_key", document
    message = document["error"]["message"]
    assert isinstance(message, str)
    return message


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def payload(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    found = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    assert isinstance(found, dict)
    return found


def ledger_rows(store: Store, user_id: int) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(ledger).where(ledger.c.user_id == user_id)))


def test_a_jwt_is_accepted_on_the_three_routes_and_the_ledger_names_its_person(rig: Rig) -> None:
    token = rig.idp.jwt_for("alice")
    assert payload(token)["iss"] == rig.idp.issuer and payload(token)["groups"] == ["team-a"]
    for path in ROUTES:
        response = post(rig.on.url, path, token)
        assert response.status_code == 200, (path, response.text)
    alice = rig.people.get("alice")
    assert (alice.email, alice.org, alice.idp_groups) == ("alice@example.com", "team-a", ("team-a",))
    rows = ledger_rows(rig.store, alice.id)
    assert len(rows) == 3, rows
    with rig.store.engine.connect() as conn:
        keys = conn.execute(select(api_keys).where(api_keys.c.user_id == alice.id)).all()
    assert [k.name for k in keys] == ["IdP tokens"]  # one key for all her JWTs
    assert {r.key_id for r in rows} == {keys[0].id}
    # a new token of hers (the IdP refreshed it) is billed to the same person and key
    again = post(rig.on.url, CHAT, rig.idp.jwt_for("alice"))
    assert again.status_code == 200, again.text
    assert {r.key_id for r in ledger_rows(rig.store, alice.id)} == {keys[0].id}


def test_the_gateways_keys_work_as_before(rig: Rig) -> None:
    key = rig.on.new_key("team-a")
    for path in ROUTES:
        response = requests.post(rig.on.url + path, json=body(path), headers={"x-api-key": key}, timeout=30)
        assert response.status_code == 200, (path, response.text)
    assert refusal(post(rig.on.url, CHAT, "ezat_sk_" + "x" * 40), CHAT) == "Invalid API key."
    assert refusal(post(rig.on.url, MESSAGES, "not-a-key-nor-a-jwt"), MESSAGES) == "Invalid API key."


def forgeries(rig: Rig) -> dict[str, tuple[str, str]]:
    """Tokens the gateway must refuse, each with the message it refuses it with."""
    good = rig.idp.jwt_for("alice")
    header, _, signature = good.split(".")
    changed = ".".join([header, b64({**payload(good), "sub": "bob", "groups": ["team-a"]}), signature])
    kid = rig.idp.jwks()["keys"][0]["kid"]
    ours = RSAKey.generate_key(2048, parameters={"kid": kid})
    own_key = jwt.encode({"alg": "RS256", "kid": kid}, payload(good), ours)
    unsigned = b64({"alg": "none", "typ": "JWT"}) + "." + b64(payload(good)) + "."
    return {
        "another issuer": (rig.other.jwt_for("alice"), bearer.ISSUER),
        "payload changed": (changed, bearer.SIGNATURE),
        "our key under the IdP's kid": (own_key, bearer.SIGNATURE),
        "another audience": (rig.idp.jwt_for("alice", audience="another-service"), bearer.AUDIENCE),
        "alg none": (unsigned, bearer.ALGORITHM),
    }


@pytest.mark.parametrize("path", ROUTES)
def test_forged_and_foreign_tokens_are_401s_in_each_dialects_envelope(rig: Rig, path: str) -> None:
    bob_before = [p for p in rig.people.list_people() if p.subject == "bob"]
    for name, (token, message) in forgeries(rig).items():
        assert refusal(post(rig.on.url, path, token), path) == message, name
    assert [p for p in rig.people.list_people() if p.subject == "bob"] == bob_before  # nobody signed in


def test_an_expired_jwt_is_a_401(rig: Rig) -> None:
    fresh = rig.other.jwt_for("alice")
    response = post(rig.short.url, CHAT, fresh)
    assert response.status_code == 200, response.text  # the provider's tokens work there...
    stale = rig.other.jwt_for("bob")
    time.sleep(max(0.0, payload(stale)["exp"] - time.time()) + 0.5)
    for path in ROUTES:  # ...until they expire (no clock skew allowed)
        assert refusal(post(rig.short.url, path, stale), path) == bearer.EXPIRED
        assert refusal(post(rig.short.url, path, fresh), path) == bearer.EXPIRED  # its cache ends at exp


def test_with_jwt_bearers_off_a_jwt_is_an_invalid_key(rig: Rig) -> None:
    token = rig.idp.jwt_for("alice")
    for path in ROUTES:
        assert refusal(post(rig.off.url, path, token), path) == "Invalid API key."


def test_a_person_in_no_mapped_group_is_a_403(rig: Rig) -> None:
    token = rig.idp.jwt_for("dave")
    for path in ROUTES:
        message = refusal(post(rig.on.url, path, token), path, status=403)
        assert "dave@example.com is in no group" in message, message


def test_a_disabled_persons_jwt_is_refused_at_the_next_request(rig: Rig) -> None:
    token = rig.idp.jwt_for("bob")
    assert post(rig.on.url, CHAT, token).status_code == 200
    rig.people.set_disabled("bob", True)
    try:
        for path in ROUTES:  # the same (cached) token, at once
            assert "owner is disabled" in refusal(post(rig.on.url, path, token), path)
        fresh = rig.idp.jwt_for("bob")  # a new token signs in again: refused as disabled
        assert "is disabled" in refusal(post(rig.on.url, MESSAGES, fresh), MESSAGES)
    finally:
        rig.people.set_disabled("bob", False)
    response = post(rig.on.url, RESPONSES, token)
    assert response.status_code == 200, response.text


def test_the_idp_unreachable_is_a_503_in_each_envelope_never_a_500(
    sim: Sim, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with loopback_idp() as gone:
        gone.add_user("alice", groups=["team-a"])
        token = gone.jwt_for("alice")
        gateway = TabledGateway(
            root=tmp_path_factory.mktemp("jwt-idp-gone"), models=standard_models(sim.url), tables=identity(gone)
        )
    try:  # the provider has stopped: the gateway can't fetch its discovery document nor its keys
        gateway.start()
        for path in ROUTES:
            response = post(gateway.url, path, token)
            status = 529 if path == MESSAGES else 503
            assert response.status_code == status, (path, response.status_code, response.text)
            document = response.json()
            assert document["error"]["message"] == bearer.UNREACHABLE, document
            assert document["error"]["type"] == ("overloaded_error" if path == MESSAGES else "server_error"), document
            assert int(response.headers["retry-after"]) == bearer.RETRY_AFTER_S
        assert "the IdP can't be reached to check a bearer token" in gateway.log_text()
    finally:
        gateway.stop()
