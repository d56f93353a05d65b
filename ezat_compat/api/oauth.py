"""Sign-in for command-line clients: the OAuth 2.0 device authorization grant (RFC 8628) backed
by the company's IdP, minting short-lived keys bound to a person (docs/people.md). The blueprint
"oauth" (``/oauth``), on the main listener, served when ``[identity] issuer`` is set.

- ``POST /oauth/device/code`` (section 3.1): a new device authorization: ``device_code``,
  ``user_code``, ``verification_uri`` (absolute: ``[server] public_url``, else the request's
  own root), ``verification_uri_complete``, ``expires_in``, ``interval`` (section 3.2).
- ``GET /oauth/device`` (section 3.3): the page where the person enters, or confirms, the code
  their terminal shows (prefilled from ``?user_code=``); its form carries a CSRF token (a random
  value of a cookie of its own, compared in constant time). ``POST /oauth/device`` checks the
  code and sends the browser to the IdP exactly as the console's sign-in does: the
  authorization code flow with PKCE (S256), a fresh ``state`` and ``nonce`` kept on the server
  (``ConsoleStore.begin_login``), bound to this browser by a cookie whose secret also names the
  user code (a changed cookie finds nothing).
- ``GET /oauth/device/callback``: the IdP's answer, checked as the console's is (the state
  taken once, the code exchanged with the verifier, the ID token's signature and claims); the
  person is signed in (``People.sign_in``: created or brought up to date from the claims) and
  the authorization approved with the IdP's refresh token sealed (``sealing.Sealer``, bound to
  the person). A disabled person, or one whose groups name no organisation, is refused: the
  authorization is denied (the client is told ``access_denied``).
- ``POST /oauth/token`` (RFC 6749 section 5): ``grant_type`` =
  ``urn:ietf:params:oauth:grant-type:device_code`` (RFC 8628 section 3.4; its errors section
  3.5) gives, once, ``access_token`` (an ``ezat_sk_…`` key of the person's organisation bound to
  them, living ``[identity] key_hours``), ``refresh_token`` and ``expires_in``;
  ``grant_type=refresh_token`` (RFC 6749 section 6) asks the IdP again with the sealed IdP
  refresh token (``OidcClient.refresh``) and signs the person in again with what it says now, so
  a person disabled, or removed from every mapped group, or whose IdP sessions were revoked, is
  refused (``invalid_grant``: the session ends and its last key is revoked); else our refresh
  token is rotated (the old one refused from then on) and a new key minted. An IdP that can't be
  reached answers 503 ``temporarily_unavailable`` and changes nothing: try again later.

Errors of the token endpoint are RFC 6749 section 5.2's JSON (``error``, ``error_description``,
400 but 401 for ``invalid_client``), with ``Cache-Control: no-store`` as every answer of it.
The pages are HTML (no script; the console's strict Content-Security-Policy, the code's page
letting its form lead to the IdP's origin, as browsers check a form's redirects). The code's entry
(the IdP redirect) and the IdP's callback count as sign-in attempts of the client's address
(``[console] sign_in_attempts_per_minute``; past it, 429); new device authorizations are limited
to ``CODES_PER_ATTEMPT`` times that number a minute per address (past it, 429).

Every change leaves an audit row (``admin.service.record_change``): ``device.approve``,
``device.deny``, ``session.open``, ``session.refresh``, ``session.refused``. No secret (a device
code, a refresh token, a key, the IdP's tokens) is ever logged or audited.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, Flask, current_app, g, make_response, redirect, render_template, request
from limits import RateLimitItemPerMinute
from limits.errors import StorageError
from limits.storage import MemoryStorage, Storage
from limits.strategies import FixedWindowRateLimiter
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from ezat_compat.admin import service
from ezat_compat.admin.auth import AdminContext
from ezat_compat.api.common import json_response
from ezat_compat.console.security import SECURITY_HEADERS
from ezat_compat.datafiles import data_folder
from ezat_compat.domain import Config, IdentitySettings
from ezat_compat.errors import GatewayError
from ezat_compat.idp.oidc import IdentityProviderError, InvalidSignInError, OidcClient
from ezat_compat.sealing import Sealer, SealError, load_sealer
from ezat_compat.store import device as grants
from ezat_compat.store.accounts import StoreError
from ezat_compat.store.console import LOGIN_TTL, ConsoleStore
from ezat_compat.store.device import DeviceStore
from ezat_compat.store.people import People, PersonInfo
from ezat_compat.store.store import Store

log = logging.getLogger("ezat_compat.oauth")

STATE = "ezat_oauth"  # app.extensions: the ``OAuthState``
DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
REFRESH_GRANT = "refresh_token"
CSRF_COOKIE = "ezat_device_csrf"  # the verification page's CSRF secret (double-submitted in its form)
LOGIN_COOKIE = "ezat_device_login"  # binds a sign-in under way at the IdP to this browser and user code
CSRF_FIELD = "csrf_token"
COOKIE_PATH = "/oauth/device"
MAX_CLIENT_ID = 128
MAX_SCOPE = 1024
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
CODES_PER_ATTEMPT = 5  # new device authorizations a minute, per sign-in attempt allowed


# ---------------------------------------------------------------- the process's state


class Attempts:
    """Sign-in attempts per client address and minute, in the store's counters (shared by every
    worker: Redis or the embedded SQLite file), else in the process."""

    def __init__(self, per_minute: int, store: Store, namespace: str) -> None:
        self._counters = store.counters
        self._storage: Storage | None = None if store.counters is not None else MemoryStorage()
        self._item = RateLimitItemPerMinute(per_minute, namespace=namespace)

    def hit(self, address: str) -> bool:
        """Count one attempt of ``address``: False when it is over the limit. A limit store that
        can't be reached lets the attempt through (the IdP has its own limits)."""
        storage = self._storage if self._counters is None else self._counters.storage()
        assert storage is not None
        try:
            return FixedWindowRateLimiter(storage).hit(self._item, address or "-")
        except StorageError:
            return True


@dataclass
class OAuthState:
    """What the views need of the process (``app.extensions[STATE]``)."""

    identity: IdentitySettings
    store: Store  # for the audit trail
    device: DeviceStore
    people: People
    logins: ConsoleStore  # sign-ins under way at the IdP (the console's table)
    client: OidcClient
    sealer: Sealer
    attempts: Attempts  # the code's form and the IdP's callback
    codes: Attempts  # new device authorizations
    public_url: str  # [server] public_url, without its final slash ("": the request's root)
    secure_cookies: bool


def state() -> OAuthState:
    found: OAuthState = current_app.extensions[STATE]
    return found


def _now() -> datetime:
    return datetime.now(UTC)


def _base_url() -> str:
    """The gateway's address as clients reach it: ``[server] public_url``, else the request's
    own root (its ``Host``: behind a proxy, set ``public_url``)."""
    return state().public_url or request.url_root.rstrip("/")


def _callback_url() -> str:
    """The IdP redirect URI to register: ``<gateway>/oauth/device/callback``."""
    return _base_url() + "/oauth/device/callback"


def _context(actor: str) -> AdminContext:
    return AdminContext(
        actor=actor, read_only=False, address=request.remote_addr or "", request_id=str(g.get("request_id") or "")
    )


def _actor(person: PersonInfo | None, subject: str = "") -> str:
    """The audit trail's author: the person as the console names them (``sso:<subject>``)."""
    return f"sso:{person.subject if person is not None else subject}"


def _audit(actor: str, action: str, target_type: str, target_id: str, before: Any, after: Any) -> None:
    service.record_change(state().store, _context(actor), action, target_type, target_id, before, after)


def _person_snapshot(person: PersonInfo) -> dict[str, Any]:
    return {"user": person.public_id, "email": person.email, "org": person.org or None}


def _seal(person_id: int, refresh_token: str | None) -> str | None:
    if refresh_token is None:
        return None
    return state().sealer.seal(person_id, [{"idp_refresh_token": refresh_token}])


def _unseal(person_id: int, sealed: str | None) -> str | None:
    """The IdP's refresh token sealed for the person, or None (none kept, or sealed under a key
    the ring no longer holds, or not the person's)."""
    if not sealed:
        return None
    try:
        blocks = state().sealer.unseal(person_id, sealed)
    except SealError:
        return None
    if not blocks or not isinstance(blocks[0].get("idp_refresh_token"), str):
        return None
    token: str = blocks[0]["idp_refresh_token"]
    return token


# ---------------------------------------------------------------- the token endpoint's answers


def oauth_error(error: str, description: str, status: int = 400, **extra: Any) -> Response:
    """An RFC 6749 section 5.2 error (``Cache-Control: no-store``)."""
    return json_response({"error": error, "error_description": description, **extra}, status, dict(NO_STORE))


def _tokens(key_secret: str, expires_in: int, refresh_token: str) -> Response:
    return json_response(
        {
            "access_token": key_secret,
            "token_type": "Bearer",
            "expires_in": expires_in,
            "refresh_token": refresh_token,
        },
        200,
        dict(NO_STORE),
    )


POLL_ERRORS = {  # RFC 8628 section 3.5 (and RFC 6749 section 5.2's invalid_grant)
    grants.AUTHORIZATION_PENDING: "The person has not finished signing in yet; keep polling at the interval.",
    grants.SLOW_DOWN: "Polling too fast; the interval has grown by 5 seconds.",
    grants.ACCESS_DENIED: "The sign-in was refused.",
    grants.EXPIRED_TOKEN: "The device code has expired; start again with a new one.",
    grants.INVALID_GRANT: "The device code is unknown, was issued to another client, or was used already.",
}


# ---------------------------------------------------------------- pages


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") and parts.netloc else ""


def _idp_origins() -> str:
    """The origins the code's form may lead to: ours, and the IdP's authorization endpoint's
    (browsers hold a form's redirects to ``form-action`` too)."""
    origins = {_origin(state().identity.issuer)}
    with contextlib.suppress(IdentityProviderError):
        origins.add(_origin(str(state().client.metadata().get("authorization_endpoint", ""))))
    return " ".join(sorted(o for o in origins if o))


def _page(template: str, status: int = 200, *, form_to_idp: bool = False, **values: Any) -> Response:
    response = make_response(render_template(template, **values), status)
    response.headers["Content-Type"] = "text/html; charset=utf-8"
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    if form_to_idp:
        csp = SECURITY_HEADERS["Content-Security-Policy"]
        response.headers["Content-Security-Policy"] = csp.replace(
            "form-action 'self'", f"form-action 'self' {_idp_origins()}".rstrip()
        )
    return response


def _error_page(status: int, heading: str, message: str) -> Response:
    return _page("oauth/error.html", status, heading=heading, message=message)


def _too_many() -> Response | None:
    """Count this request as a sign-in attempt of its address: a 429 page past the limit."""
    if state().attempts.hit(request.remote_addr or ""):
        return None
    response = _error_page(
        429, "Too many attempts", "Too many sign-in attempts from your address; wait a minute and try again."
    )
    response.headers["Retry-After"] = "60"
    return response


def _entry_page(user_code: str, message: str = "", status: int = 200) -> Response:
    token = request.cookies.get(CSRF_COOKIE, "")
    if len(token) < 32 or len(token) > 128:
        token = secrets.token_urlsafe(32)
    response = _page(
        "oauth/device.html",
        status,
        form_to_idp=True,
        user_code=user_code,
        message=message,
        csrf_token=token,
        action=request.script_root + COOKIE_PATH,
    )
    response.set_cookie(
        CSRF_COOKIE,
        token,
        path=request.script_root + COOKIE_PATH,
        secure=state().secure_cookies,
        httponly=True,
        samesite="Lax",
    )
    return response


def verification_page() -> Response:
    """``GET /oauth/device``: enter or confirm the code."""
    code = request.args.get("user_code", "")
    normal = grants.normal_user_code(code)
    return _entry_page(grants.shown_user_code(normal) if normal else code[:16])


def begin_sign_in() -> Response:
    """``POST /oauth/device``: check the form and the code, then go to the IdP."""
    sent = request.form.get(CSRF_FIELD, "")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not sent or not cookie or not hmac.compare_digest(sent.encode(), cookie.encode()):
        return _entry_page("", "This form is out of date; enter the code again.", 400)
    refused = _too_many()
    if refused is not None:
        return refused
    typed = request.form.get("user_code", "")[:64]
    grant = state().device.pending(typed, now=_now())
    if grant is None:
        return _entry_page(
            typed, "That code is unknown or has expired. Check it against your terminal, or run the sign-in again.", 400
        )
    try:
        auth = state().client.authorization_request(_callback_url())
    except IdentityProviderError as exc:
        log.warning("device sign-in: the identity provider is unusable: %s", exc)
        return _error_page(502, "The identity provider can't be reached", "Try again in a moment.")
    binding = secrets.token_urlsafe(32) + "." + grant.user_code
    state().logins.begin_login(
        state=auth.state, binding=binding, nonce=auth.nonce, code_verifier=auth.code_verifier, now=_now()
    )
    response = redirect(auth.url, 303)
    response.set_cookie(
        LOGIN_COOKIE,
        binding,
        max_age=int(LOGIN_TTL.total_seconds()),
        path=request.script_root + COOKIE_PATH,
        secure=state().secure_cookies,
        httponly=True,
        samesite="Lax",
    )
    return response


def _signed_out(response: Response) -> Response:
    response.delete_cookie(
        LOGIN_COOKIE, path=request.script_root + COOKIE_PATH, secure=state().secure_cookies, httponly=True
    )
    return response


def callback() -> Response:
    """``GET /oauth/device/callback``: the IdP's answer; approve or deny the authorization."""
    refused = _too_many()
    if refused is not None:
        return refused
    oauth = state()
    binding = request.cookies.get(LOGIN_COOKIE, "")
    pending = oauth.logins.take_login(state=request.args.get("state", ""), binding=binding, now=_now())
    if pending is None:
        return _error_page(
            400,
            "The sign-in failed",
            "This sign-in is unknown to this browser, has expired or was used already. "
            "Enter the code from your terminal again.",
        )
    user_code = binding.rpartition(".")[2]
    if request.args.get("error"):
        log.info("device sign-in refused by the identity provider: %s", request.args.get("error", "")[:64])
        if oauth.device.deny(user_code, now=_now()):
            _audit("anonymous", "device.deny", "device_grant", grants.shown_user_code(user_code), None, {"by": "idp"})
        return _signed_out(
            _error_page(403, "Not signed in", "The identity provider refused the sign-in. Your terminal is told so.")
        )
    code = request.args.get("code", "")
    if not code:
        return _signed_out(_error_page(400, "The sign-in failed", "The identity provider sent no code."))
    try:
        signed = oauth.client.sign_in(
            code=code, redirect_uri=_callback_url(), code_verifier=pending.code_verifier, nonce=pending.nonce
        )
    except InvalidSignInError as exc:
        log.warning("device sign-in refused: %s", exc)
        return _signed_out(
            _error_page(
                400, "The sign-in failed", "The identity provider's answer did not pass the checks; start again."
            )
        )
    except IdentityProviderError as exc:
        log.warning("device sign-in: the identity provider is unusable: %s", exc)
        return _signed_out(_error_page(502, "The identity provider can't be reached", "Try again in a moment."))
    subject = str(signed.claims.get("sub") or "")
    try:
        person = oauth.people.sign_in(signed.claims, oauth.identity, now=_now())
    except (GatewayError, StoreError) as exc:  # PersonDisabledError, NoOrganisationError
        if oauth.device.deny(user_code, now=_now()):
            email = str(signed.claims.get("email") or "")
            _audit(
                _actor(None, subject),
                "device.deny",
                "device_grant",
                grants.shown_user_code(user_code),
                None,
                {"subject": subject, "email": email, "reason": type(exc).__name__},
            )
        return _signed_out(_error_page(403, "Not allowed", str(exc)))
    if not oauth.device.approve(
        user_code, user_id=person.id, idp_refresh=_seal(person.id, signed.refresh_token), now=_now()
    ):
        return _signed_out(
            _error_page(
                400,
                "The code has expired",
                "This code is no longer waiting for a sign-in; run the sign-in from your terminal again.",
            )
        )
    _audit(
        _actor(person),
        "device.approve",
        "device_grant",
        grants.shown_user_code(user_code),
        None,
        {**_person_snapshot(person), "refreshable": signed.refresh_token is not None},
    )
    return _signed_out(_page("oauth/done.html", person=person))


# ---------------------------------------------------------------- the token endpoint


def _client_id() -> tuple[str, Response | None]:
    client_id = request.form.get("client_id", "")
    if not client_id:
        return "", oauth_error("invalid_request", "client_id is required.")
    if len(client_id) > MAX_CLIENT_ID or not client_id.isprintable():
        return "", oauth_error("invalid_request", f"client_id: at most {MAX_CLIENT_ID} printable characters.")
    return client_id, None


def device_code() -> Response:
    """``POST /oauth/device/code`` (RFC 8628 sections 3.1 and 3.2)."""
    client_id, refused = _client_id()
    if refused is not None:
        return refused
    if len(request.form.get("scope", "")) > MAX_SCOPE:
        return oauth_error("invalid_scope", f"scope: at most {MAX_SCOPE} characters.")
    if not state().codes.hit(request.remote_addr or ""):
        answer = oauth_error("slow_down", "Too many sign-ins from this address; wait a minute.", 429)
        answer.headers["Retry-After"] = "60"
        return answer
    device_code_value, grant = state().device.start(client_id, now=_now())
    verification = _base_url() + COOKIE_PATH
    shown = grant.shown_code
    return json_response(
        {
            "device_code": device_code_value,
            "user_code": shown,
            "verification_uri": verification,
            "verification_uri_complete": f"{verification}?user_code={shown}",
            "expires_in": int((grant.expires_at - grant.created_at).total_seconds()),
            "interval": grant.interval_s,
        },
        200,
        dict(NO_STORE),
    )


def token() -> Response:
    """``POST /oauth/token``: the device code grant and the refresh token grant."""
    grant_type = request.form.get("grant_type", "")
    if not grant_type:
        return oauth_error("invalid_request", "grant_type is required.")
    if grant_type == DEVICE_CODE_GRANT:
        return _device_code_grant()
    if grant_type == REFRESH_GRANT:
        return _refresh_grant()
    return oauth_error("unsupported_grant_type", f"grant_type must be {DEVICE_CODE_GRANT} or {REFRESH_GRANT}.")


def _mint(person: PersonInfo, client_id: str) -> tuple[str, str, int]:
    """A key for ``person``: its secret, public id and life in seconds."""
    oauth = state()
    hours = oauth.identity.key_hours
    info, secret = oauth.people.mint_key(person, hours=hours, client=client_id, now=_now())
    return secret, info.id, int(hours * 3600)


def _device_code_grant() -> Response:
    client_id, refused = _client_id()
    if refused is not None:
        return refused
    code = request.form.get("device_code", "")
    if not code:
        return oauth_error("invalid_request", "device_code is required.")
    oauth = state()
    poll = oauth.device.poll(code, client_id=client_id, now=_now())
    if poll.outcome != grants.GRANTED:
        extra = {"interval": poll.interval_s} if poll.outcome == grants.SLOW_DOWN else {}
        return oauth_error(poll.outcome, POLL_ERRORS[poll.outcome], **extra)
    person = oauth.people.get_by_id(poll.user_id) if poll.user_id is not None else None
    if person is None:
        return oauth_error("access_denied", "The person of this sign-in no longer exists.")
    try:
        secret, key_id, life = _mint(person, client_id)
    except (GatewayError, StoreError) as exc:  # their organisation is gone meanwhile
        return oauth_error("access_denied", str(exc))
    idp_refresh = _unseal(person.id, poll.idp_refresh)
    refresh, session = oauth.device.open_session(
        user_id=person.id,
        client_id=client_id,
        idp_refresh=_seal(person.id, idp_refresh),
        key_public_id=key_id,
        days=oauth.identity.session_days,
        now=_now(),
    )
    _audit(
        _actor(person),
        "session.open",
        "user_session",
        session.public_id,
        None,
        {
            **_person_snapshot(person),
            "client_id": client_id,
            "key": key_id,
            "expires_at": session.expires_at.isoformat(),
        },
    )
    return _tokens(secret, life, refresh)


def _refused(session: grants.UserSession, person: PersonInfo | None, reason: str, description: str) -> Response:
    """End ``session`` (its last key revoked), leave ``session.refused``, answer invalid_grant."""
    oauth = state()
    key = oauth.device.end(session.id, now=_now())
    if key is not None:
        with contextlib.suppress(StoreError):
            oauth.store.accounts.revoke_key(key, now=_now())
    who = person or oauth.people.get_by_id(session.user_id)  # the audit names their IdP subject
    _audit(
        _actor(who) if who is not None else "system",
        "session.refused",
        "user_session",
        session.public_id,
        {"ended": False},
        {"ended": True, "reason": reason, "revoked_key": key},
    )
    return oauth_error("invalid_grant", description)


def _refresh_grant() -> Response:
    old = request.form.get("refresh_token", "")
    if not old:
        return oauth_error("invalid_request", "refresh_token is required.")
    oauth = state()
    claimed = oauth.device.claim(old, now=_now())
    if claimed is None:
        return oauth_error(
            "invalid_grant", "The refresh token is unknown, was used already, or its session is over; sign in again."
        )
    new, session = claimed
    client_id = request.form.get("client_id", "") or session.client_id
    if client_id != session.client_id:
        oauth.device.unclaim(session, new, old)
        return oauth_error("invalid_grant", "The refresh token was issued to another client.")
    person = oauth.people.get_by_id(session.user_id)
    if person is None:
        return _refused(session, None, "person deleted", "The person of this session no longer exists.")
    idp_refresh = _unseal(person.id, session.idp_refresh)
    if idp_refresh is None:
        return _refused(
            session, person, "no IdP refresh token", "The identity provider can't be asked again; sign in again."
        )
    try:
        signed = oauth.client.refresh(idp_refresh, subject=person.subject)
    except InvalidSignInError as exc:
        log.info("device session %s: the identity provider refused the refresh: %s", session.public_id, exc)
        return _refused(session, person, "identity provider refused", "The identity provider refused; sign in again.")
    except IdentityProviderError as exc:
        log.warning("device session refresh: the identity provider is unusable: %s", exc)
        oauth.device.unclaim(session, new, old)
        return oauth_error(
            "temporarily_unavailable", "The identity provider can't be reached; try again in a moment.", 503
        )
    try:
        person = oauth.people.sign_in(signed.claims, oauth.identity, now=_now())
    except (GatewayError, StoreError) as exc:  # PersonDisabledError, NoOrganisationError
        return _refused(session, person, type(exc).__name__, str(exc))
    try:
        secret, key_id, life = _mint(person, session.client_id)
    except (GatewayError, StoreError) as exc:
        return _refused(session, person, type(exc).__name__, str(exc))
    oauth.device.complete(
        session,
        idp_refresh=_seal(person.id, signed.refresh_token),
        key_public_id=key_id,
        days=oauth.identity.session_days,
        now=_now(),
    )
    _audit(
        _actor(person),
        "session.refresh",
        "user_session",
        session.public_id,
        None,
        {**_person_snapshot(person), "client_id": session.client_id, "key": key_id},
    )
    return _tokens(secret, life, new)


# ---------------------------------------------------------------- the blueprint


def _http_error(exc: HTTPException) -> Response:
    """An HTTP error raised in a view (a body too large, a malformed form): the token
    endpoints' JSON, the pages' HTML."""
    status = exc.code or 500
    if request.endpoint in ("oauth.token", "oauth.device_code"):
        return oauth_error("invalid_request", exc.description or exc.name, status if status < 500 else 400)
    return _error_page(status, exc.name, exc.description or "")


def blueprint() -> Blueprint:
    """A new blueprint "oauth" (``/oauth``): the views above, their templates (``oauth/…``) and
    their style sheet (``/oauth/device/static/device.css``)."""
    bp = Blueprint(
        "oauth",
        __name__,
        url_prefix="/oauth",
        template_folder="templates",
        static_folder="static/oauth",
        static_url_path="/device/static",
    )
    bp.add_url_rule("/device/code", "device_code", device_code, methods=["POST"])
    bp.add_url_rule("/device", "verification", verification_page, methods=["GET"])
    bp.add_url_rule("/device", "begin", begin_sign_in, methods=["POST"])
    bp.add_url_rule("/device/callback", "callback", callback, methods=["GET"])
    bp.add_url_rule("/token", "token", token, methods=["POST"])
    bp.register_error_handler(HTTPException, _http_error)
    return bp


def register(app: Flask, config: Config, store: Store) -> None:
    """Serve the device grant on ``app`` when ``[identity] issuer`` is set (else ``/oauth/…``
    answers 404, as any unknown path)."""
    if not config.identity.enabled:
        return
    assert store.device is not None and store.people is not None and store.console is not None, "every kind of store"
    app.extensions[STATE] = OAuthState(
        identity=config.identity,
        store=store,
        device=store.device,
        people=store.people,
        logins=store.console,
        client=OidcClient(config.identity),
        sealer=load_sealer(data_folder(config)),
        attempts=Attempts(config.console.sign_in_attempts_per_minute, store, "device-sign-in"),
        codes=Attempts(config.console.sign_in_attempts_per_minute * CODES_PER_ATTEMPT, store, "device-code"),
        public_url=config.server.public_url.rstrip("/"),
        secure_cookies=config.console.secure_cookies,
    )
    app.register_blueprint(blueprint())
