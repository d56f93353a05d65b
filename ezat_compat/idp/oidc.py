"""The gateway's OpenID Connect client (the console's sign-in, the device grant's): discovery, the
authorization request, the ID token and the IdP's keys.

Built on Authlib: its requests client (``OAuth2Session``) writes the authorization request (PKCE
S256 from the verifier we keep) and exchanges the code at the token endpoint (client secret, or
none for a public client), and its ``CodeIDToken`` checks the ID token's claims, after joserfc
(Authlib's JOSE library) has checked its signature against the issuer's JWKS. What is checked,
per OpenID Connect Core 1.0, section 3.1.3.7: the signature (with an algorithm the discovery
document lists, never ``none``), ``iss`` equal to ``[identity] issuer``, ``aud`` naming our
``client_id`` (``azp`` too when there are several audiences), ``exp``/``iat`` with a minute of
leeway, and ``nonce`` equal to the one sent.

The discovery document and the JWKS are fetched on first use and kept for ``CACHE_S``; a token
signed with a key the cached set doesn't have fetches the set again once (the IdP rotated its
keys). Every request to the IdP has a timeout; a failure is ``IdentityProviderError`` (the
console answers 502: try again later), a token that fails a check is ``InvalidSignInError``.

The device grant (``api/oauth.py``) keeps the IdP's refresh token of a sign-in (``sign_in``) and
asks again with it at each refresh of the person's command-line session (``refresh``): the IdP's
refusal (the person left, their sessions were revoked) ends the session. The claims of a refresh
are the new ID token's when the IdP sends one (checked as above, but for the nonce, and its
``sub`` must be the person's: OpenID Connect Core 1.0, section 12.2), else its userinfo's with the
new access token (``sub`` checked the same way, section 5.3.2).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from authlib.common.security import generate_token
from authlib.integrations.base_client import OAuthError
from authlib.integrations.requests_client import OAuth2Session
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry

from ezat_compat.domain import IdentitySettings

log = logging.getLogger("ezat_compat.idp")

TIMEOUT_S = 10.0  # connect and read, each request to the IdP
CACHE_S = 3600.0  # the discovery document and the JWKS are fetched again after this
LEEWAY_S = 60  # clock skew allowed on exp, iat and nbf
DISCOVERY_PATH = "/.well-known/openid-configuration"
_MAX_DOCUMENT_BYTES = 1024 * 1024


class IdentityProviderError(Exception):
    """The IdP can't be reached or answered something unusable: try again later (502)."""


class InvalidSignInError(Exception):
    """The IdP's answer fails a check (the code, the ID token's signature or claims): the
    sign-in is refused; start again."""


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    """A sign-in to send the browser on: ``url`` at the IdP, and what the callback needs."""

    url: str
    state: str
    nonce: str
    code_verifier: str


@dataclass(frozen=True, slots=True)
class SignedIn:
    """What the IdP said of a sign-in or a refresh: the checked ``claims``, and its refresh
    token (None when it gave none: the sign-in can't be refreshed)."""

    claims: dict[str, Any]
    refresh_token: str | None = None


def discovery_url(issuer: str) -> str:
    """``<issuer>/.well-known/openid-configuration`` (OpenID Connect Discovery 1.0, section 4)."""
    return issuer.rstrip("/") + DISCOVERY_PATH


class OidcClient:
    """The IdP of ``[identity]``, for one process. Thread-safe."""

    def __init__(self, settings: IdentitySettings, *, timeout_s: float = TIMEOUT_S) -> None:
        self.settings = settings
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._jwks: dict[str, Any] | None = None
        self._jwks_at = 0.0

    # ------------------------------------------------------------ documents

    def _get_json(self, url: str) -> dict[str, Any]:
        try:
            response = requests.get(url, timeout=self._timeout_s, headers={"accept": "application/json"})
            try:
                response.raise_for_status()
                if len(response.content) > _MAX_DOCUMENT_BYTES:
                    raise IdentityProviderError(f"{url}: the document is larger than 1 MiB")
                document = response.json()
            finally:
                response.close()
        except (requests.RequestException, ValueError) as exc:
            raise IdentityProviderError(f"{url}: {type(exc).__name__}: {exc}") from None
        if not isinstance(document, dict):
            raise IdentityProviderError(f"{url}: not a JSON object")
        return document

    def metadata(self) -> dict[str, Any]:
        """The issuer's discovery document (cached); its ``issuer`` must be ours exactly."""
        with self._lock:
            if self._metadata is not None and time.monotonic() - self._metadata_at < CACHE_S:
                return self._metadata
        document = self._get_json(discovery_url(self.settings.issuer))
        if document.get("issuer") != self.settings.issuer:
            raise IdentityProviderError(
                f"the discovery document names the issuer {document.get('issuer')!r}, not "
                f"{self.settings.issuer!r} ([identity] issuer must be written as the IdP names itself)"
            )
        for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(document.get(name), str) or not document[name].startswith(("https://", "http://")):
                raise IdentityProviderError(f"the discovery document has no usable {name}")
        with self._lock:
            self._metadata, self._metadata_at = document, time.monotonic()
        return document

    def key_set(self, *, force: bool = False) -> KeySet:
        with self._lock:
            cached = self._jwks if not force and time.monotonic() - self._jwks_at < CACHE_S else None
        if cached is None:
            cached = self._get_json(self.metadata()["jwks_uri"])
            with self._lock:
                self._jwks, self._jwks_at = cached, time.monotonic()
        try:
            return KeySet.import_key_set(cached)  # type: ignore[arg-type]
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise IdentityProviderError(f"the IdP's JWKS is not usable: {exc}") from None

    # ------------------------------------------------------------ the flow

    def _session(self) -> OAuth2Session:
        secret = self.settings.client_secret
        return OAuth2Session(
            client_id=self.settings.client_id,
            client_secret=secret or None,
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
            scope=self.settings.scopes,
            code_challenge_method="S256",
        )

    def authorization_request(self, redirect_uri: str) -> AuthorizationRequest:
        """A new sign-in: fresh ``state``, ``nonce`` and PKCE verifier, and the IdP's URL with
        them (the verifier's S256 challenge, never the verifier)."""
        endpoint = self.metadata()["authorization_endpoint"]
        state, nonce, verifier = generate_token(43), generate_token(43), generate_token(64)
        with self._session() as session:
            url, _ = session.create_authorization_url(
                endpoint, state=state, code_verifier=verifier, nonce=nonce, redirect_uri=redirect_uri
            )
        return AuthorizationRequest(url=url, state=state, nonce=nonce, code_verifier=verifier)

    def finish(self, *, code: str, redirect_uri: str, code_verifier: str, nonce: str) -> dict[str, Any]:
        """Exchange the callback's ``code`` (with the PKCE verifier) and return the ID token's
        claims once every check has passed. ``InvalidSignInError`` when the IdP refuses the code
        or the token fails a check; ``IdentityProviderError`` when the IdP can't be reached."""
        return self.sign_in(code=code, redirect_uri=redirect_uri, code_verifier=code_verifier, nonce=nonce).claims

    def sign_in(self, *, code: str, redirect_uri: str, code_verifier: str, nonce: str) -> SignedIn:
        """``finish``, with the IdP's refresh token of the sign-in kept (for ``refresh``)."""
        metadata = self.metadata()
        try:
            with self._session() as session:
                token = session.fetch_token(
                    metadata["token_endpoint"],
                    grant_type="authorization_code",
                    code=code,
                    redirect_uri=redirect_uri,
                    code_verifier=code_verifier,
                    timeout=self._timeout_s,
                )
        except requests.RequestException as exc:
            raise IdentityProviderError(f"the token endpoint: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # Authlib's OAuthError and its kin: the IdP refused the code
            raise InvalidSignInError(f"the IdP refused the code: {exc}") from None
        id_token = token.get("id_token")
        if not isinstance(id_token, str):
            raise InvalidSignInError("the IdP's answer has no ID token")
        claims = self._id_token_claims(id_token, nonce, str(token.get("access_token") or ""), metadata)
        refresh = token.get("refresh_token")
        return SignedIn(claims, refresh if isinstance(refresh, str) and refresh else None)

    def refresh(self, refresh_token: str, *, subject: str) -> SignedIn:
        """Ask the IdP again for the person ``subject`` with their ``refresh_token`` (RFC 6749
        section 6): the claims as they are now (module docstring) and the refresh token to keep
        (the IdP's rotated one, else the same). ``InvalidSignInError`` when the IdP refuses it
        (the person's sign-in is over) or its answer fails a check; ``IdentityProviderError``
        when the IdP can't be reached or fails (try again later)."""
        metadata = self.metadata()
        try:
            with self._session() as session:
                token = session.refresh_token(
                    metadata["token_endpoint"], refresh_token=refresh_token, timeout=self._timeout_s
                )
        except requests.RequestException as exc:
            raise IdentityProviderError(f"the token endpoint: {type(exc).__name__}: {exc}") from None
        except OAuthError as exc:
            # Only invalid_grant says the sign-in is over (RFC 6749 section 5.2); any other refusal
            # (temporarily_unavailable, a 429…) is the IdP failing for now: try again later.
            if exc.error == "invalid_grant":
                raise InvalidSignInError(f"the IdP refused the refresh token: {exc}") from None
            raise IdentityProviderError(f"the token endpoint refused the refresh: {exc}") from None
        except Exception as exc:  # an answer Authlib can't read: the IdP failing, not a verdict
            raise IdentityProviderError(f"the token endpoint: {type(exc).__name__}: {exc}") from None
        access_token = str(token.get("access_token") or "")
        id_token = token.get("id_token")
        if isinstance(id_token, str) and id_token:
            claims = self._id_token_claims(id_token, "", access_token, metadata)
        elif access_token and isinstance(metadata.get("userinfo_endpoint"), str):
            claims = self._userinfo(metadata["userinfo_endpoint"], access_token)
        else:
            raise InvalidSignInError("the IdP's refresh gave neither an ID token nor an access token for userinfo")
        if str(claims.get("sub") or "") != subject:
            raise InvalidSignInError("the IdP's refresh names another subject")
        rotated = token.get("refresh_token")
        return SignedIn(claims, rotated if isinstance(rotated, str) and rotated else refresh_token)

    def _userinfo(self, url: str, access_token: str) -> dict[str, Any]:
        """The userinfo endpoint's claims for ``access_token`` (OpenID Connect Core 1.0, 5.3)."""
        try:
            response = requests.get(
                url,
                timeout=self._timeout_s,
                headers={"accept": "application/json", "authorization": f"Bearer {access_token}"},
            )
            try:
                if response.status_code in (401, 403):
                    raise InvalidSignInError(f"the userinfo endpoint refused the access token ({response.status_code})")
                response.raise_for_status()
                if len(response.content) > _MAX_DOCUMENT_BYTES:
                    raise IdentityProviderError("the userinfo document is larger than 1 MiB")
                document = response.json()
            finally:
                response.close()
        except (requests.RequestException, ValueError) as exc:
            raise IdentityProviderError(f"the userinfo endpoint: {type(exc).__name__}: {exc}") from None
        if not isinstance(document, dict):
            raise IdentityProviderError("the userinfo endpoint's answer is not a JSON object")
        return document

    def _id_token_claims(
        self, id_token: str, nonce: str, access_token: str, metadata: dict[str, Any]
    ) -> dict[str, Any]:
        algorithms = [a for a in metadata.get("id_token_signing_alg_values_supported") or ["RS256"] if a != "none"]
        registry = JWSRegistry(algorithms=algorithms, strict_check_header=False)
        try:
            try:
                decoded = jwt.decode(id_token, self.key_set(), registry=registry)
            except InvalidKeyIdError:
                decoded = jwt.decode(id_token, self.key_set(force=True), registry=registry)
            claims = CodeIDToken(
                decoded.claims,
                decoded.header,
                {
                    "iss": {"essential": True, "value": self.settings.issuer},
                    "aud": {"essential": True, "value": self.settings.client_id},
                },
                {"nonce": nonce or None, "client_id": self.settings.client_id, "access_token": access_token or None},
            )
            claims.validate(leeway=LEEWAY_S)
        except (JoseError, ValueError) as exc:
            raise InvalidSignInError(f"the ID token fails a check: {type(exc).__name__}: {exc}") from None
        return dict(claims)
