"""The IdP's JWTs as bearers (ezat_compat/idp/bearer.py), without a network or a database: RSA
keys made here with joserfc, a fake key source standing for the IdP, fake people and accounts.

What is held: every claim check (issuer, audience and ``azp``, expiry, ``nbf``/``iat`` with the
clock skew, subject), the algorithms (never ``none`` nor HMAC), the signature (a changed payload,
another key under the IdP's ``kid``, a key the token carries itself), an unknown ``kid`` fetching
the keys again at most once in a while, the IdP unreachable being a 503; the cache (a repeated
token checks nothing and signs nobody in again, yet its key is authenticated at every request;
bounded; no longer than the token's ``exp``), a person's refusal remembered briefly, and
concurrent requests with one new token checking it once; the pipeline's routing of a secret.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from joserfc import jwt
from joserfc.jwk import KeySet, OctKey, RSAKey

from ezat_compat.domain import IdentitySettings
from ezat_compat.errors import AuthenticationError, OverloadedError, PermissionDeniedError
from ezat_compat.idp import bearer
from ezat_compat.idp.bearer import BearerTokens, accepted_algorithms, check_claims, looks_like_jwt
from ezat_compat.idp.oidc import IdentityProviderError
from ezat_compat.pipeline import Gateway
from ezat_compat.store.accounts import Accounts, AuthContext
from ezat_compat.store.people import NoOrganisationError, People, PersonDisabledError

ISSUER = "https://idp.example.com/realms/acme"
CLIENT_ID = "ezat-gateway"
SETTINGS = IdentitySettings(issuer=ISSUER, client_id=CLIENT_ID, jwt_bearers=True, clock_skew_s=60)
IDP_KEY = RSAKey.generate_key(2048, parameters={"kid": "idp-1", "use": "sig"})
ROTATED_KEY = RSAKey.generate_key(2048, parameters={"kid": "idp-2", "use": "sig"})
ATTACKER_KEY = RSAKey.generate_key(2048, parameters={"kid": "idp-1"})  # the IdP's kid, another key


def b64(data: dict[str, Any] | bytes) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    found: dict[str, Any] = {
        "iss": ISSUER,
        "sub": "alice",
        "aud": CLIENT_ID,
        "exp": now + 600,
        "iat": now,
        "email": "alice@example.com",
        "groups": ["team-a"],
    }
    found.update(changes)
    return {k: v for k, v in found.items() if v is not None}


def token(key: RSAKey = IDP_KEY, header: dict[str, Any] | None = None, **changes: Any) -> str:
    return jwt.encode(header or {"alg": "RS256", "kid": key.kid}, claims(**changes), key)


def signed(header: dict[str, Any], payload: dict[str, Any], key: RSAKey = IDP_KEY) -> str:
    """A JWS made by hand (RS256), for headers joserfc refuses to write."""
    signing_input = b64(header) + "." + b64(payload)
    signature = key.private_key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())  # type: ignore[union-attr]
    return signing_input + "." + b64(signature)


def public(*keys: RSAKey) -> dict[str, Any]:
    return {"keys": [k.as_dict(private=False) for k in keys]}


@dataclass
class FakeIdP:
    """The IdP's documents as ``OidcClient`` serves them: ``jwks`` is what a fetch would find
    now; ``key_set()`` answers from the last fetch unless ``force``."""

    jwks: dict[str, Any] = field(default_factory=lambda: public(IDP_KEY))
    algorithms: list[str] = field(default_factory=lambda: ["RS256"])
    down: bool = False
    fetches: int = 0
    forced: int = 0
    metadata_calls: int = 0
    _fetched: dict[str, Any] | None = None

    def metadata(self) -> dict[str, Any]:
        self.metadata_calls += 1
        if self.down:
            raise IdentityProviderError("connection refused")
        return {"issuer": ISSUER, "id_token_signing_alg_values_supported": self.algorithms}

    def key_set(self, *, force: bool = False) -> KeySet:
        if self.down:
            raise IdentityProviderError("connection refused")
        if force or self._fetched is None:
            self.fetches += 1
            self.forced += force
            self._fetched = self.jwks
        return KeySet.import_key_set(self._fetched)  # type: ignore[arg-type]


@dataclass
class FakePeople:
    disabled: set[str] = field(default_factory=set)
    no_org: set[str] = field(default_factory=set)
    sign_ins: list[dict[str, Any]] = field(default_factory=list)
    slow_s: float = 0.0

    def sign_in(self, claims: dict[str, Any], identity: IdentitySettings, *, now: datetime | None = None) -> Any:
        assert identity is SETTINGS
        time.sleep(self.slow_s)
        self.sign_ins.append(dict(claims))
        if claims["sub"] in self.disabled:
            raise PersonDisabledError(claims["email"])
        if claims["sub"] in self.no_org:
            raise NoOrganisationError(claims["email"])
        return SimpleNamespace(subject=claims["sub"])

    def bearer_key(self, person: Any, *, now: datetime | None = None) -> int:
        return 1000 + len(person.subject)  # one key per person


@dataclass
class FakeAccounts:
    calls: list[int] = field(default_factory=list)
    refuse: bool = False

    def authenticate_key_id(self, key_id: int, now: datetime) -> AuthContext:
        self.calls.append(key_id)
        if self.refuse:
            raise AuthenticationError("This API key's owner is disabled; ask your administrator to enable them.")
        return AuthContext(
            key_id=key_id,
            key_public_id=f"key_{key_id}",
            org_id=1,
            org_name="team-a",
            model_patterns=(),
            spend_limit_micros=None,
            rpm=None,
            tpm=None,
            user_id=7,
        )


@dataclass
class Rig:
    idp: FakeIdP
    people: FakePeople
    accounts: FakeAccounts
    tokens: BearerTokens


def rig(settings: IdentitySettings = SETTINGS, **options: Any) -> Rig:
    idp, people, accounts = FakeIdP(), FakePeople(), FakeAccounts()
    tokens = BearerTokens(idp, cast(People, people), cast(Accounts, accounts), settings, **options)
    return Rig(idp, people, accounts, tokens)


def refused(tokens: BearerTokens, value: str) -> str:
    with pytest.raises(AuthenticationError) as caught:
        tokens.verify(value, time.time())
    assert caught.value.status == 401
    return caught.value.message


NOW = 1_800_000_000.0


def check(**changes: Any) -> None:
    base = claims(exp=NOW + 600, iat=NOW)
    base.update(changes)
    check_claims(
        {k: v for k, v in base.items() if v is not None}, issuer=ISSUER, audience=CLIENT_ID, now=NOW, skew_s=60
    )


# ------------------------------------------------------------ shapes and algorithms


def test_only_a_compact_jws_looks_like_a_jwt() -> None:
    assert looks_like_jwt(token())
    assert looks_like_jwt(b64({"alg": "none"}) + "." + b64({"sub": "a"}) + ".")  # refused later, by name
    for value in (
        "ezat_sk_0123456789abcdef",
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0",  # two segments
        token() + ".extra",  # a JWE has five
        "eyJ.e+J.abc",  # not base64url
        "abc." + token(),
        token() + "\n",
    ):
        assert not looks_like_jwt(value), value


def test_the_algorithms_are_the_discoverys_without_none_and_hmac() -> None:
    assert accepted_algorithms({"id_token_signing_alg_values_supported": ["RS256", "none", "HS256", "ES256"]}) == (
        "RS256",
        "ES256",
    )
    assert accepted_algorithms({}) == ("RS256",)
    assert accepted_algorithms({"id_token_signing_alg_values_supported": ["XX999", "PS256", 3]}) == ("PS256",)
    assert accepted_algorithms({"id_token_signing_alg_values_supported": ["none", "HS512"]}) == ()


# ------------------------------------------------------------ the claims


def test_claims_that_pass() -> None:
    check()
    check(aud=[CLIENT_ID])
    check(aud=[CLIENT_ID, "other-api"], azp="svc-a")
    check(exp=NOW - 59)  # within the skew
    check(nbf=NOW + 59, iat=NOW + 59)
    check(iat=None)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"iss": ISSUER + "/"}, bearer.ISSUER),
        ({"iss": None}, bearer.ISSUER),
        ({"aud": "other-api"}, bearer.AUDIENCE),
        ({"aud": ["other-api", "more"], "azp": CLIENT_ID}, bearer.AUDIENCE),
        ({"aud": None}, bearer.AUDIENCE),
        ({"aud": {"value": CLIENT_ID}}, bearer.AUDIENCE),
        ({"aud": [CLIENT_ID, "other-api"]}, bearer.AUTHORIZED_PARTY),
        ({"aud": [CLIENT_ID, "other-api"], "azp": ""}, bearer.AUTHORIZED_PARTY),
        ({"exp": None}, bearer.NO_EXPIRY),
        ({"exp": "1900000000"}, bearer.NO_EXPIRY),
        ({"exp": True}, bearer.NO_EXPIRY),
        ({"exp": float("nan")}, bearer.NO_EXPIRY),
        ({"exp": NOW - 60}, bearer.EXPIRED),
        ({"exp": NOW - 3600}, bearer.EXPIRED),
        ({"nbf": NOW + 61}, bearer.NOT_YET_VALID),
        ({"iat": NOW + 61}, bearer.NOT_YET_VALID),
        ({"iat": "yesterday"}, bearer.MALFORMED),
        ({"sub": None}, bearer.NO_SUBJECT),
        ({"sub": ""}, bearer.NO_SUBJECT),
        ({"sub": 42}, bearer.NO_SUBJECT),
    ],
)
def test_claims_that_fail(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(AuthenticationError) as caught:
        check(**changes)
    assert caught.value.message == message


def test_no_skew_means_none() -> None:
    base = claims(exp=NOW, iat=NOW - 10)
    with pytest.raises(AuthenticationError, match="expired"):
        check_claims(base, issuer=ISSUER, audience=CLIENT_ID, now=NOW, skew_s=0)
    check_claims(base, issuer=ISSUER, audience=CLIENT_ID, now=NOW - 1, skew_s=0)


def test_the_audience_is_the_configured_one_else_the_client_id() -> None:
    api = IdentitySettings(issuer=ISSUER, client_id=CLIENT_ID, audience="api://ezat", jwt_bearers=True)
    tokens = rig(api).tokens
    assert tokens.verify(token(aud="api://ezat"), time.time())["sub"] == "alice"
    assert refused(tokens, token()) == bearer.AUDIENCE


# ------------------------------------------------------------ the signature and its key


def test_a_token_of_the_idp_passes() -> None:
    r = rig()
    found = r.tokens.verify(token(), time.time())
    assert found["sub"] == "alice" and found["groups"] == ["team-a"]
    no_kid = token(header={"alg": "RS256", "typ": "JWT"})  # the IdP publishes one key: that one
    assert r.tokens.verify(no_kid, time.time())["sub"] == "alice"
    assert r.tokens.verify(token(header={"alg": "RS256", "kid": "idp-1", "typ": "at+jwt"}), time.time())
    assert r.idp.fetches == 1


def test_alg_none_and_hmac_are_refused() -> None:
    r = rig()
    payload = b64(claims())
    assert refused(r.tokens, b64({"alg": "none"}) + "." + payload + ".") == bearer.ALGORITHM
    assert refused(r.tokens, b64({"alg": "none", "kid": "idp-1"}) + "." + payload + ".c2ln") == bearer.ALGORITHM
    # the classic confusion: HMAC keyed with the IdP's public key
    secret = OctKey.import_key(json.dumps(IDP_KEY.as_dict(private=False)).encode())
    confused = jwt.encode({"alg": "HS256", "kid": "idp-1"}, claims(), secret)
    assert refused(r.tokens, confused) == bearer.ALGORITHM
    r.idp.algorithms = ["RS256", "HS256", "none"]  # even when the discovery lists them
    assert refused(r.tokens, confused) == bearer.ALGORITHM
    assert refused(r.tokens, b64({"alg": "none"}) + "." + payload + ".") == bearer.ALGORITHM
    r.idp.algorithms = ["ES256"]  # an algorithm the discovery doesn't list
    assert refused(r.tokens, token()) == bearer.ALGORITHM


def test_a_changed_payload_or_another_key_is_a_bad_signature() -> None:
    r = rig()
    header, _, signature = token().split(".")
    forged = ".".join([header, b64(claims(sub="mallory")), signature])
    assert refused(r.tokens, forged) == bearer.SIGNATURE
    assert refused(r.tokens, token(ATTACKER_KEY)) == bearer.SIGNATURE  # signed by another under the IdP's kid
    embedded = {"alg": "RS256", "jwk": ATTACKER_KEY.as_dict(private=False)}  # "here is my key"
    assert refused(r.tokens, token(ATTACKER_KEY, header=embedded)) == bearer.SIGNATURE
    assert refused(r.tokens, token()[:-4] + "AAAA") == bearer.SIGNATURE


def test_headers_that_are_refused() -> None:
    r = rig()
    assert r.tokens.verify(signed({"alg": "RS256", "kid": "idp-1"}, claims()), time.time())  # the helper's good
    critical = {"alg": "RS256", "kid": "idp-1", "crit": ["b64"], "b64": True}
    assert refused(r.tokens, signed(critical, claims())) == bearer.EXTENSION
    assert refused(r.tokens, token(header={"alg": "RS256", "kid": "idp-1", "typ": "logout+jwt"})) == (bearer.TOKEN_TYPE)
    assert refused(r.tokens, "eyJub3QganNvbg.eyJzdWIiOiJhIn0.c2ln") == bearer.MALFORMED
    assert refused(r.tokens, b64(b"[1]") + "." + b64(claims()) + ".c2ln") == bearer.MALFORMED
    assert refused(r.tokens, "eyJ" + "A" * bearer.MAX_TOKEN_CHARS + ".eyJ.c2ln") == bearer.MALFORMED
    nested = base64.urlsafe_b64encode(b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}").rstrip(b"=").decode()
    assert refused(r.tokens, b64(claims()) + "." + nested + ".c2ln") == bearer.MALFORMED  # payload: iss first
    assert refused(r.tokens, nested + "." + b64(claims()) + ".c2ln") == bearer.MALFORMED


def test_another_issuer_costs_no_key_fetch() -> None:
    r = rig()
    assert refused(r.tokens, token(iss="https://evil.example.com")) == bearer.ISSUER
    assert refused(r.tokens, token(ATTACKER_KEY, iss="https://evil.example.com")) == bearer.ISSUER
    assert r.idp.fetches == 0 and r.idp.metadata_calls == 0


def test_an_unknown_kid_fetches_the_keys_again_at_most_once_in_a_while() -> None:
    clock = [1000.0]
    r = rig(monotonic=lambda: clock[0])
    assert r.tokens.verify(token(), time.time())  # idp-1, fetched once
    r.idp.jwks = public(IDP_KEY, ROTATED_KEY)  # the IdP rotates
    assert r.tokens.verify(token(ROTATED_KEY), time.time())["sub"] == "alice"
    assert (r.idp.fetches, r.idp.forced) == (2, 1)
    made_up = token(RSAKey.generate_key(2048, parameters={"kid": "made-up"}))
    assert refused(r.tokens, made_up) == bearer.UNKNOWN_KEY  # just fetched: not again
    assert r.idp.forced == 1
    clock[0] += bearer.REFETCH_EVERY_S
    assert refused(r.tokens, made_up) == bearer.UNKNOWN_KEY  # fetched again: still unknown
    assert refused(r.tokens, made_up) == bearer.UNKNOWN_KEY  # too soon: not fetched
    assert r.idp.forced == 2
    clock[0] += bearer.REFETCH_EVERY_S
    assert refused(r.tokens, made_up) == bearer.UNKNOWN_KEY
    assert r.idp.forced == 3


def test_several_keys_need_a_kid() -> None:
    r = rig()
    r.idp.jwks = public(IDP_KEY, ROTATED_KEY)
    assert refused(r.tokens, token(header={"alg": "RS256"})) == bearer.AMBIGUOUS_KEY
    assert r.tokens.verify(token(ROTATED_KEY), time.time())


def test_a_key_for_encryption_or_another_algorithm_never_verifies() -> None:
    r = rig()
    r.idp.jwks = {"keys": [{**IDP_KEY.as_dict(private=False), "use": "enc"}]}
    assert refused(r.tokens, token()) == bearer.SIGNATURE
    r = rig()
    r.idp.jwks = {"keys": [{**IDP_KEY.as_dict(private=False), "alg": "PS256"}]}
    assert refused(r.tokens, token()) == bearer.SIGNATURE


def test_the_idp_unreachable_is_a_503_not_a_500() -> None:
    r = rig()
    r.idp.down = True
    with pytest.raises(OverloadedError) as caught:
        r.tokens.authenticate(token(), datetime.now(UTC))
    assert caught.value.status == 503 and caught.value.retry_after == bearer.RETRY_AFTER_S
    assert caught.value.message == bearer.UNREACHABLE
    assert not r.people.sign_ins


# ------------------------------------------------------------ the person, the cache


def test_a_repeated_token_is_checked_once_and_its_key_at_every_request() -> None:
    r = rig()
    value = token()
    first = r.tokens.authenticate(value, datetime.now(UTC))
    again = r.tokens.authenticate(value, datetime.now(UTC))
    assert first.key_id == again.key_id == 1005 and first.user_id == 7
    assert len(r.people.sign_ins) == 1 and r.accounts.calls == [1005, 1005]
    r.accounts.refuse = True  # the person is disabled: refused at the next request, cache or not
    with pytest.raises(AuthenticationError, match="owner is disabled"):
        r.tokens.authenticate(value, datetime.now(UTC))
    assert len(r.people.sign_ins) == 1


def test_a_cached_token_is_checked_again_at_its_exp() -> None:
    r = rig(SETTINGS)
    exp = time.time() + 30
    value = token(exp=int(exp))
    r.tokens.authenticate(value, datetime.now(UTC))
    r.tokens.authenticate(value, datetime.fromtimestamp(exp - 1, UTC))
    assert len(r.people.sign_ins) == 1
    r.tokens.authenticate(value, datetime.fromtimestamp(exp + 1, UTC))  # past exp, within the skew
    assert len(r.people.sign_ins) == 2
    with pytest.raises(AuthenticationError, match="expired"):
        r.tokens.authenticate(value, datetime.fromtimestamp(exp + 61, UTC))


def test_the_cache_lives_five_minutes_at_most_and_is_bounded() -> None:
    r = rig(cache_entries=2)
    now = time.time()
    values = [token(sub=f"user-{i}", exp=int(now) + 3600) for i in range(3)]
    for value in values:
        r.tokens.authenticate(value, datetime.fromtimestamp(now, UTC))
    r.tokens.authenticate(values[2], datetime.fromtimestamp(now, UTC))
    assert len(r.people.sign_ins) == 3  # 1 and 2 are cached
    r.tokens.authenticate(values[0], datetime.fromtimestamp(now, UTC))  # 0 was forgotten (the oldest)
    assert len(r.people.sign_ins) == 4
    r.tokens.authenticate(values[2], datetime.fromtimestamp(now + bearer.CACHE_S + 1, UTC))
    assert len(r.people.sign_ins) == 5


def test_a_person_refused_at_sign_in_is_remembered_briefly() -> None:
    r = rig()
    r.people.disabled.add("alice")
    r.people.no_org.add("bob")
    now = time.time()
    for _ in range(3):
        with pytest.raises(AuthenticationError, match="is disabled") as caught:
            r.tokens.authenticate(token(), datetime.fromtimestamp(now, UTC))
        assert caught.value.status == 401
    value = token(sub="bob", email="bob@example.com")
    for _ in range(2):
        with pytest.raises(PermissionDeniedError, match="no group") as denied:
            r.tokens.authenticate(value, datetime.fromtimestamp(now, UTC))
        assert denied.value.status == 403
    assert len(r.people.sign_ins) == 2  # alice's token once (remembered since), bob's once
    r.people.disabled.clear()
    later = datetime.fromtimestamp(now + bearer.REFUSAL_S + 1, UTC)
    assert r.tokens.authenticate(token(), later).key_id == 1005
    assert not r.accounts.calls[:-1]


def test_concurrent_requests_with_a_new_token_check_it_once() -> None:
    r = rig()
    r.people.slow_s = 0.2
    value = token()
    found: list[int] = []
    threads = [
        threading.Thread(target=lambda: found.append(r.tokens.authenticate(value, datetime.now(UTC)).key_id))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == [1005] * 8
    assert len(r.people.sign_ins) == 1


# ------------------------------------------------------------ the pipeline's routing


@dataclass
class Routed:
    to: list[str] = field(default_factory=list)

    def authenticate(self, secret: str, now: datetime) -> str:
        self.to.append("accounts")
        return "accounts"


@dataclass
class RoutedBearers:
    to: list[str]

    @staticmethod
    def takes(secret: str) -> bool:
        return BearerTokens.takes(secret)

    def authenticate(self, token: str, now: datetime) -> str:
        self.to.append("bearers")
        return "bearers"


def test_the_pipeline_sends_only_jwts_to_the_bearers_and_only_when_on() -> None:
    accounts = Routed()
    on = SimpleNamespace(accounts=accounts, bearers=RoutedBearers(accounts.to))
    off = SimpleNamespace(accounts=accounts, bearers=None)
    for secret in ("ezat_sk_abc", "ezat_sk_eyJ.eyJ.eyJ", "not-a-key", "eyJonly"):
        Gateway.authenticate(on, secret)  # type: ignore[arg-type]
    Gateway.authenticate(on, token())  # type: ignore[arg-type]
    Gateway.authenticate(off, token())  # type: ignore[arg-type]
    assert accounts.to == ["accounts"] * 4 + ["bearers", "accounts"]
    with pytest.raises(AuthenticationError, match="Missing API key"):
        Gateway.authenticate(on, "")  # type: ignore[arg-type]
