"""The loopback OpenID Connect provider of tests/support/oidc.py, as a relying party uses it:
discovery, the authorization request (state, nonce, PKCE), the sign-in form, the token exchange,
and an ID token signed by the provider's published key, carrying the person's groups."""

from __future__ import annotations

import base64
import hashlib
import secrets

import pytest
import requests
from joserfc import jwt
from joserfc.jwk import KeySet

from tests.support.oidc import loopback_idp

pytestmark = pytest.mark.integration  # the provider runs in a process of its own, on loopback


def test_a_relying_party_signs_a_person_in_with_their_groups() -> None:
    with loopback_idp() as idp:
        idp.add_user("alice", name="Alice Admin", email="alice@example.com", groups=["platform-admins"])
        discovery = requests.get(idp.issuer + "/.well-known/openid-configuration", timeout=5).json()
        assert discovery["issuer"] == idp.issuer
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        redirect_uri = "http://127.0.0.1:9/console/auth/callback"
        params = {
            "response_type": "code",
            "client_id": idp.client_id,
            "redirect_uri": redirect_uri,
            "scope": "openid email profile",
            "state": "the-state",
            "nonce": "the-nonce",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        form = requests.get(discovery["authorization_endpoint"], params=params, timeout=5)
        assert form.status_code == 200 and 'name="sub"' in form.text
        assert idp.authorizations()[-1]["code_challenge_method"] == "S256"
        back = requests.post(form.url, data={"sub": "alice"}, allow_redirects=False, timeout=5)
        assert back.status_code == 302 and back.headers["Location"].startswith(redirect_uri)
        assert "state=the-state" in back.headers["Location"]
        code = back.headers["Location"].split("code=", 1)[1].split("&", 1)[0]
        token = requests.post(
            discovery["token_endpoint"],
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect_uri,
                "code_verifier": verifier,
            },
            auth=(idp.client_id, idp.client_secret),
            timeout=5,
        )
        assert token.status_code == 200, token.text
        keys = KeySet.import_key_set(requests.get(discovery["jwks_uri"], timeout=5).json())
        claims = jwt.decode(token.json()["id_token"], keys, algorithms=["RS256"]).claims
        assert (
            claims["iss"] == idp.issuer
            and claims["aud"] in (idp.client_id, [idp.client_id])
            and claims["nonce"] == "the-nonce"
        )
        assert (claims["sub"], claims["name"], claims["email"]) == ("alice", "Alice Admin", "alice@example.com")
        assert claims["groups"] == ["platform-admins"]
