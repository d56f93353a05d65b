"""The IdP's own JWTs as bearers on the inference routes (``[identity] jwt_bearers = true``).

A service that already holds a JWT of the company's IdP — an access token for the gateway's
audience, or an ID token issued to it — sends it as ``Authorization: Bearer <JWT>``; the request
is made, billed and limited as the person the token names, as with a key of theirs.

What is checked, per RFC 9068 (section 4), RFC 8725 and OpenID Connect Core 1.0 (3.1.3.7), before
anything is written:

- the token is a compact JWS (three base64url segments), at most ``MAX_TOKEN_CHARS`` long;
- its ``alg`` is one the discovery document lists in ``id_token_signing_alg_values_supported``
  (RS256 when it lists none), never ``none`` nor an HMAC one (HS*: a public key is no secret);
  a ``crit`` header (an extension) and a ``typ`` other than a JWT's or an access token's
  (``JWT``, ``at+jwt``) are refused;
- ``iss`` is ``[identity] issuer`` exactly (looked at first: a token of another issuer costs no
  key fetch and no signature check);
- the signature, with the IdP's key (``OidcClient.key_set``) that the header's ``kid`` names
  (without a ``kid``, the one key of the algorithm's type the IdP publishes); an unknown ``kid``
  fetches the key set again (the IdP rotated its keys), at most once every ``REFETCH_EVERY_S``
  so that made-up ``kid`` values can't make the gateway hammer the IdP; keys the token carries
  itself (``jwk``, ``jku``, ``x5u``, ``x5c``) are never used;
- ``aud`` (a string or a list) names ``[identity] audience`` (``client_id`` when unset); with
  several audiences, ``azp`` must say which party the token was issued to (OpenID Connect's rule
  for such tokens; its value is the calling client's, which the gateway doesn't restrict);
- ``exp`` is present and not past, ``nbf`` and ``iat`` (when present) not in the future, each
  with ``[identity] clock_skew_s`` of leeway; ``sub`` is present.

Then the person is signed in from the claims (``People.sign_in``: created at first, their groups
brought up to date) and their IdP-token key found or made (``People.bearer_key``). A verified
token is remembered by its SHA-256 (``CACHE_ENTRIES`` at most, least recently used forgotten
first) until its ``exp`` or ``CACHE_S`` after it was checked, whichever is sooner: the same token
again costs no signature check and no write. The key itself is authenticated on every request
(``Accounts.authenticate_key_id``: one indexed read), so a disabled person, a blocked key or a
suspended organisation is refused at once. A person refused at sign-in (disabled, or no
organisation pays for them) is remembered for ``REFUSAL_S`` so that a client retrying in a loop
doesn't write at each attempt. Concurrent requests with the same new token wait for the first
one's check instead of repeating it.

Every refusal is ``AuthenticationError`` (401) with a message that says which check failed and
nothing of the token; the IdP unreachable while its keys or discovery document are needed is
``OverloadedError`` (503, Anthropic 529) with a ``retry_after``, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet
from joserfc.jws import JWSRegistry

from ezat_compat.domain import IdentitySettings
from ezat_compat.errors import AuthenticationError, GatewayError, OverloadedError, PermissionDeniedError
from ezat_compat.idp.oidc import IdentityProviderError
from ezat_compat.store.accounts import Accounts, AuthContext
from ezat_compat.store.people import NoOrganisationError, People, PersonDisabledError

log = logging.getLogger("ezat_compat.idp")
T = TypeVar("T")

MAX_TOKEN_CHARS = 16 * 1024  # a JWT longer than this is refused before it is decoded
CACHE_ENTRIES = 10_000  # verified tokens remembered (least recently used forgotten first)
CACHE_S = 300.0  # a verified token is checked again after this (or at its exp, if sooner)
REFUSAL_S = 10.0  # a person refused at sign-in (disabled, no organisation) is remembered this long
REFETCH_EVERY_S = 10.0  # an unknown kid fetches the IdP's keys again at most this often
RETRY_AFTER_S = 10  # the IdP unreachable: retry after this
WAIT_S = 30.0  # the longest a request waits for another's check of the same token
DEFAULT_ALGORITHMS = ("RS256",)  # when the discovery document lists none (OpenID Connect's default)
TOKEN_TYPES = frozenset({"jwt", "application/jwt", "at+jwt", "application/at+jwt"})  # ``typ``, lowercased

MALFORMED = "The bearer token is not a well-formed signed JWT."
ALGORITHM = "The bearer token is signed with an algorithm this gateway does not accept."
EXTENSION = "The bearer token uses a JWS extension (crit) this gateway does not understand."
TOKEN_TYPE = "The bearer token is not an access token or an ID token (typ)."
ISSUER = "The bearer token was not issued by this gateway's identity provider."
UNKNOWN_KEY = "The bearer token is signed with a key the identity provider does not publish."
AMBIGUOUS_KEY = "The bearer token names no signing key (kid) and the identity provider publishes several."
SIGNATURE = "The bearer token's signature is not valid."
AUDIENCE = "The bearer token is not meant for this gateway (audience)."
AUTHORIZED_PARTY = "The bearer token names several audiences but not the party it was issued to (azp)."
NO_EXPIRY = "The bearer token has no expiry (exp)."
EXPIRED = "The bearer token has expired."
NOT_YET_VALID = "The bearer token is not valid yet (nbf or iat in the future)."
NO_SUBJECT = "The bearer token names no subject (sub)."
UNREACHABLE = "The identity provider can't be reached to check the bearer token; try again shortly."

# three base64url segments, the header a JSON object (``{"`` is ``eyJ``); the signature may be
# empty (``alg: none``), which is refused with its own message rather than as an unknown key
_JWT_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")

# the key type each family of JWS algorithms verifies with (RFC 7518, RFC 8037)
_KEY_TYPES = (("RS", "RSA"), ("PS", "RSA"), ("ES", "EC"), ("Ed", "OKP"))


def looks_like_jwt(value: str) -> bool:
    """Whether ``value`` has the shape of a compact JWS (what the pipeline routes here; an API
    key never has it)."""
    return value.startswith("eyJ") and _JWT_SHAPE.fullmatch(value) is not None


class KeySource(Protocol):
    """The IdP's discovery document and key set (``idp.oidc.OidcClient``)."""

    def metadata(self) -> dict[str, Any]: ...

    def key_set(self, *, force: bool = False) -> KeySet: ...


class _UnknownKeyId(Exception):
    """The header's ``kid`` names no key of the set (fetch the set again, once)."""


def _segment(value: str) -> dict[str, Any]:
    """A base64url segment holding a JSON object; ``AuthenticationError`` otherwise."""
    try:
        document = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        raise AuthenticationError(MALFORMED) from None
    if not isinstance(document, dict):
        raise AuthenticationError(MALFORMED)
    return document


def _number(value: Any) -> float | None:
    """A NumericDate (RFC 7519, section 2): a finite int or float, never a bool or a string."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _audiences(claims: Mapping[str, Any]) -> list[str]:
    """The token's audiences (``aud`` is one string or a list of them)."""
    aud = claims.get("aud")
    if isinstance(aud, str):
        return [aud]
    return [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []


def accepted_algorithms(metadata: Mapping[str, Any]) -> tuple[str, ...]:
    """The JWS algorithms a bearer may be signed with: those the discovery document lists for
    ID tokens (RS256 when none), without ``none``, the HMAC ones and any joserfc doesn't know."""
    listed = metadata.get("id_token_signing_alg_values_supported")
    names = [a for a in listed if isinstance(a, str)] if isinstance(listed, list) and listed else DEFAULT_ALGORITHMS
    known = JWSRegistry.algorithms
    return tuple(dict.fromkeys(a for a in names if a != "none" and not a.upper().startswith("HS") and a in known))


def check_claims(claims: Mapping[str, Any], *, issuer: str, audience: str, now: float, skew_s: float) -> None:
    """Check a verified token's claims (module docstring); ``AuthenticationError`` names the
    first that fails. ``now``: seconds since the epoch."""
    if claims.get("iss") != issuer or not isinstance(claims.get("iss"), str):
        raise AuthenticationError(ISSUER)
    audiences = _audiences(claims)
    if audience not in audiences:
        raise AuthenticationError(AUDIENCE)
    if len(set(audiences)) > 1:
        azp = claims.get("azp")
        if not isinstance(azp, str) or not azp:
            raise AuthenticationError(AUTHORIZED_PARTY)
    exp = _number(claims.get("exp"))
    if exp is None:
        raise AuthenticationError(NO_EXPIRY)
    if now >= exp + skew_s:
        raise AuthenticationError(EXPIRED)
    for name in ("nbf", "iat"):
        if name in claims:
            at = _number(claims[name])
            if at is None:
                raise AuthenticationError(MALFORMED)
            if at > now + skew_s:
                raise AuthenticationError(NOT_YET_VALID)
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise AuthenticationError(NO_SUBJECT)


def signing_key(keys: KeySet, header: Mapping[str, Any]) -> Key:
    """The key of ``keys`` the header names: its ``kid`` (``_UnknownKeyId`` when the set has no
    such key), else the one key of the algorithm's type; a key published for encryption
    (``use: enc``) or for another algorithm is never used. Keys the header carries are ignored."""
    alg = str(header["alg"])
    kty = next((kind for prefix, kind in _KEY_TYPES if alg.startswith(prefix)), "")
    kid = header.get("kid")
    if kid is not None and not any(k.kid == kid for k in keys.keys):
        raise _UnknownKeyId()
    usable = [
        k
        for k in keys.keys
        if k.key_type == kty
        and k.get("use") in (None, "sig")
        and k.get("alg") in (None, alg)
        and (kid is None or k.kid == kid)
    ]
    if not usable:
        raise AuthenticationError(SIGNATURE)
    if len(usable) > 1:  # OpenID Connect Core 1.0, section 10.1: several keys need a kid
        raise AuthenticationError(AMBIGUOUS_KEY)
    return usable[0]


@dataclass(frozen=True, slots=True)
class _Entry:
    """What a checked token gives until ``until`` (epoch seconds): the person's IdP-token key,
    or their refusal (``refusal``: the error's class and message)."""

    until: float
    key_id: int = 0
    refusal: tuple[type[GatewayError], str] | None = None


class BearerTokens:
    """The IdP's JWTs as bearers (module docstring), for one process. Thread-safe (and
    greenlet-safe: its locks are the monkey-patched ones under gevent)."""

    def __init__(
        self,
        keys: KeySource,
        people: People,
        accounts: Accounts,
        settings: IdentitySettings,
        *,
        cache_entries: int = CACHE_ENTRIES,
        cache_s: float = CACHE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keys = keys
        self._people = people
        self._accounts = accounts
        self._settings = settings
        self._cache_entries = cache_entries
        self._cache_s = cache_s
        self._monotonic = monotonic
        self._lock = threading.Lock()  # the cache and the checks in flight
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self._pending: dict[bytes, threading.Event] = {}
        self._keys_lock = threading.Lock()  # one fetch of the IdP's documents at a time
        self._refetch_after = 0.0  # monotonic: an unknown kid may fetch the key set again from then
        self._registry: tuple[tuple[str, ...], JWSRegistry] | None = None

    # ------------------------------------------------------------ the request's key

    @staticmethod
    def takes(secret: str) -> bool:
        """Whether ``secret`` is for this class: it has a JWT's shape (``looks_like_jwt``)."""
        return looks_like_jwt(secret)

    def authenticate(self, token: str, now: datetime) -> AuthContext:
        """The key that ``token`` (a JWT of the IdP) stands for, authenticated as of ``now``:
        ``AuthenticationError`` (401) for a token that fails a check, the person's refusal
        (401 disabled, 403 no organisation), ``OverloadedError`` (503) when the IdP can't be
        reached; and what ``Accounts.authenticate_key_id`` raises for the key."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        at = now.timestamp()
        entry = self._cached(digest, at)
        if entry is None:
            entry = self._check_once(token, digest, at, now)
        if entry.refusal is not None:
            kind, message = entry.refusal
            raise kind(message)
        return self._accounts.authenticate_key_id(entry.key_id, now)

    def _cached(self, digest: bytes, at: float) -> _Entry | None:
        with self._lock:
            entry = self._cache.get(digest)
            if entry is None:
                return None
            if at >= entry.until:
                del self._cache[digest]
                return None
            self._cache.move_to_end(digest)
            return entry

    def _remember(self, digest: bytes, entry: _Entry) -> None:
        with self._lock:
            self._cache[digest] = entry
            self._cache.move_to_end(digest)
            while len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)

    def _check_once(self, token: str, digest: bytes, at: float, now: datetime) -> _Entry:
        """Check the token, unless another request is checking the same one: then wait for it
        and take its result (or check it in turn, if it failed)."""
        while True:
            with self._lock:
                entry = self._cache.get(digest)
                if entry is not None and at < entry.until:
                    return entry
                waiter = self._pending.get(digest)
                if waiter is None:
                    mine = self._pending[digest] = threading.Event()
                    break
            waiter.wait(WAIT_S)
        try:
            entry = self._check(token, at, now)
            self._remember(digest, entry)
            return entry
        finally:
            with self._lock:
                self._pending.pop(digest, None)
            mine.set()

    def _check(self, token: str, at: float, now: datetime) -> _Entry:
        claims = self.verify(token, at)
        until = min(_number(claims["exp"]) or at, at + self._cache_s)
        try:
            person = self._people.sign_in(claims, self._settings, now=now)
            key_id = self._people.bearer_key(person, now=now)
        except PersonDisabledError as exc:
            return _Entry(until=min(until, at + REFUSAL_S), refusal=(AuthenticationError, exc.message))
        except NoOrganisationError as exc:
            return _Entry(until=min(until, at + REFUSAL_S), refusal=(PermissionDeniedError, exc.message))
        return _Entry(until=until, key_id=key_id)

    # ------------------------------------------------------------ the token's checks

    def verify(self, token: str, at: float) -> dict[str, Any]:
        """The claims of ``token`` once every check of the module docstring has passed (no
        database, no cache); ``at``: now, in seconds since the epoch."""
        if len(token) > MAX_TOKEN_CHARS or not looks_like_jwt(token):
            raise AuthenticationError(MALFORMED)
        header_part, payload_part, _ = token.split(".")
        header, payload = _segment(header_part), _segment(payload_part)
        if payload.get("iss") != self._settings.issuer:
            raise AuthenticationError(ISSUER)
        alg = header.get("alg")
        algorithms, registry = self._algorithms()
        if not isinstance(alg, str) or alg not in algorithms:
            raise AuthenticationError(ALGORITHM)
        if "crit" in header:
            raise AuthenticationError(EXTENSION)
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in TOKEN_TYPES):
            raise AuthenticationError(TOKEN_TYPE)
        key = self._signing_key(header)
        try:
            decoded = jwt.decode(token, key, algorithms=[alg], registry=registry)
        except JoseError:
            raise AuthenticationError(SIGNATURE) from None
        check_claims(
            decoded.claims,
            issuer=self._settings.issuer,
            audience=self._settings.bearer_audience,
            now=at,
            skew_s=self._settings.clock_skew_s,
        )
        return decoded.claims

    def _algorithms(self) -> tuple[tuple[str, ...], JWSRegistry]:
        with self._keys_lock:
            metadata = self._fetch(self._keys.metadata)
        algorithms = accepted_algorithms(metadata)
        cached = self._registry
        if cached is None or cached[0] != algorithms:
            cached = self._registry = (algorithms, JWSRegistry(algorithms=list(algorithms), strict_check_header=False))
        return cached

    def _signing_key(self, header: Mapping[str, Any]) -> Key:
        with self._keys_lock:
            keys = self._fetch(self._keys.key_set)
            try:
                return signing_key(keys, header)
            except _UnknownKeyId:
                pass
            if self._monotonic() < self._refetch_after:
                raise AuthenticationError(UNKNOWN_KEY) from None
            self._refetch_after = self._monotonic() + REFETCH_EVERY_S
            log.info("a bearer token names a key the IdP's cached key set lacks: fetching it again")
            keys = self._fetch(lambda: self._keys.key_set(force=True))
        try:
            return signing_key(keys, header)
        except _UnknownKeyId:
            raise AuthenticationError(UNKNOWN_KEY) from None

    @staticmethod
    def _fetch(get: Callable[[], T]) -> T:
        """``get()``, the IdP unreachable being a 503 (logged: the operator's problem)."""
        try:
            return get()
        except IdentityProviderError as exc:
            log.warning("the IdP can't be reached to check a bearer token: %s", exc)
            raise OverloadedError(UNREACHABLE, retry_after=RETRY_AFTER_S) from None
