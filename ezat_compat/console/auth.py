"""Signing in to the console and out of it: the blueprint "console" (``/console``).

- ``GET /console/sign-in``: the sign-in page (a link to the IdP; a message when a session ended).
- ``GET /console/auth/login``: a new sign-in at the IdP (``oidc.OidcClient``): the authorization
  code flow with PKCE (S256), a fresh ``state`` and ``nonce``, kept on the server
  (``ConsoleStore.begin_login``) and bound to this browser by a cookie of its own.
- ``GET /console/auth/callback``: the IdP's answer. The ``state`` must name a sign-in under way
  begun by this browser (taken once: a replayed callback finds nothing), the code is exchanged
  with the PKCE verifier, the ID token checked (signature, issuer, audience, expiry, nonce). The
  person's groups (``[identity] groups_claim``) give their role (``role_of``); none: 403. The
  person is created or brought up to date as every sign-in does (``People.sign_in``): a disabled
  person is refused (403) whatever their role; one whose groups name no organisation still signs
  in to the console (a console role needs none).
- ``GET /console/auth/link/<token>``: a break-glass link (``ezat-compat console-link``): signs in
  as a gateway admin once, whoever follows it first, before it expires.
- ``POST /console/sign-out``: ends the session on the server (its cookie opens nothing after).

Each of the first four counts as a sign-in attempt of the client's address (429 past the limit,
``security.sign_in_attempt``). Signing in, a refused sign-in, a link's use and signing out each
leave an audit row (``admin.service.record_change``: ``console.sign_in``,
``console.sign_in_refused``, ``console_link.use``, ``console.sign_out``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from flask import Blueprint, current_app, g, redirect, render_template, request, url_for
from werkzeug.exceptions import BadGateway, BadRequest, Forbidden
from werkzeug.routing import BuildError
from werkzeug.wrappers import Response

from ezat_compat.admin import service
from ezat_compat.admin.auth import AdminContext
from ezat_compat.console import security
from ezat_compat.console.access import BREAK_GLASS_PREFIX, Person, person
from ezat_compat.domain import IdentitySettings
from ezat_compat.idp.oidc import IdentityProviderError, InvalidSignInError, OidcClient
from ezat_compat.store.accounts import Accounts
from ezat_compat.store.console import LOGIN_TTL

log = logging.getLogger("ezat_compat.console")

OIDC = "ezat_console_oidc"  # app.extensions: the process's ``OidcClient`` (None without an IdP)
IDENTITY = "ezat_console_identity"  # app.extensions: the ``IdentitySettings``
BREAK_GLASS_NAME = "Break-glass admin"
HOME_ENDPOINT = "console_pages.overview"

# ?reason= of the sign-in page: why the person is there (never text from the URL itself).
SIGN_IN_MESSAGES = {
    "expired": "Your session has ended; sign in again.",
    "signed-out": "You have signed out.",
    "no-idp": "No identity provider is configured. An operator can print a one-time sign-in link "
    "with `ezat-compat console-link`.",
}


# ---------------------------------------------------------------- roles


def groups_of(claims: Mapping[str, Any], claim: str) -> frozenset[str]:
    """The groups the ID token's ``claim`` lists: a list of strings, or one string."""
    value = claims.get(claim)
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, list | tuple):
        return frozenset(str(v) for v in value if isinstance(v, str | int))
    return frozenset()


def role_of(groups: Iterable[str], identity: IdentitySettings) -> tuple[str | None, tuple[str, ...]]:
    """The widest role ``groups`` give, and for an organisation's admin the names of the
    organisations it administers (every one of its groups counts): ``(None, ())`` for none."""
    member = frozenset(groups)
    if member & frozenset(identity.admins):
        return "admin", ()
    orgs = tuple(dict.fromkeys(org for group, org in identity.org_admins if group in member))
    if orgs:
        return "org_admin", orgs
    if member & frozenset(identity.viewers):
        return "viewer", ()
    return None, ()


def org_ids_of(accounts: Accounts, names: Iterable[str]) -> frozenset[int]:
    """The ids of the organisations named (an unknown name gives nothing, with a warning)."""
    ids = set()
    for name in names:
        org = accounts.find_org(name)
        if org is None:
            log.warning("[identity] org_admins names the organisation %r, which doesn't exist", name)
        else:
            ids.add(org.id)
    return frozenset(ids)


# ---------------------------------------------------------------- helpers


def home_url() -> str:
    """The console's overview (the pages' blueprint), else its root under the script root."""
    try:
        return url_for(HOME_ENDPOINT)
    except BuildError:
        return request.script_root + "/console/"


def _context(actor: str) -> AdminContext:
    return AdminContext(
        actor=actor, read_only=False, address=request.remote_addr or "", request_id=str(g.get("request_id") or "")
    )


def _snapshot(who: Person) -> dict[str, Any]:
    return {
        "subject": who.subject,
        "name": who.name,
        "email": who.email,
        "role": who.role,
        "org_ids": sorted(who.org_ids),
    }


def _open_session(who: Person) -> Response:
    """Sign ``who`` in: end the browser's previous session (no session fixation), open a new
    one, leave the audit row, hand the cookie, go to the overview."""
    console = security.state()
    at = security.now()
    previous = security.current_session()
    if previous is not None:
        console.sessions.end_session(previous.public_id, at)
    cookie, public_id = console.sessions.open_session(
        subject=who.subject,
        name=who.name,
        email=who.email,
        role=who.role,
        org_ids=who.org_ids,
        address=request.remote_addr or "",
        now=at,
    )
    signed_in = Person(who.subject, who.name, who.email, who.role, who.org_ids, public_id)
    service.record_change(
        console.store,
        _context(signed_in.actor),
        "console.sign_in",
        "console_session",
        public_id,
        None,
        _snapshot(signed_in),
    )
    response = redirect(home_url(), 303)
    security.set_session_cookie(response, cookie)
    response.delete_cookie(
        security.LOGIN_COOKIE_NAME, path=_login_cookie_path(), secure=console.settings.secure_cookies, httponly=True
    )
    return response


def _login_cookie_path() -> str:
    return security.cookie_path() + "/auth"


def _client() -> OidcClient | None:
    found: OidcClient | None = current_app.extensions.get(OIDC)
    return found


def _callback_url() -> str:
    return url_for("console.callback", _external=True)


def _sign_in_failed(message: str) -> BadRequest:
    return BadRequest(f"The sign-in failed: {message} Start again from the sign-in page.")


# ---------------------------------------------------------------- views


@security.public
def sign_in() -> Response | str:
    if security.current_session() is not None:
        return redirect(home_url(), 303)
    message = SIGN_IN_MESSAGES.get(request.args.get("reason", ""), "")
    return render_template("console/sign_in.html", message=message, idp=_client() is not None)


@security.public
def login() -> Response:
    security.sign_in_attempt()
    client = _client()
    if client is None:
        return redirect(security.sign_in_url(reason="no-idp"), 303)
    try:
        auth = client.authorization_request(_callback_url())
    except IdentityProviderError as exc:
        log.warning("console sign-in: the identity provider is unusable: %s", exc)
        raise BadGateway("The identity provider can't be reached; try again in a moment.") from None
    console = security.state()
    binding = request.cookies.get(security.LOGIN_COOKIE_NAME) or secrets.token_urlsafe(32)
    console.sessions.begin_login(
        state=auth.state, binding=binding, nonce=auth.nonce, code_verifier=auth.code_verifier, now=security.now()
    )
    response = redirect(auth.url, 303)
    response.set_cookie(
        security.LOGIN_COOKIE_NAME,
        binding,
        max_age=int(LOGIN_TTL.total_seconds()),
        path=_login_cookie_path(),
        secure=console.settings.secure_cookies,
        httponly=True,
        samesite="Lax",
    )
    return response


@security.public
def callback() -> Response:
    security.sign_in_attempt()
    client = _client()
    if client is None:
        return redirect(security.sign_in_url(reason="no-idp"), 303)
    console = security.state()
    pending = console.sessions.take_login(
        state=request.args.get("state", ""),
        binding=request.cookies.get(security.LOGIN_COOKIE_NAME, ""),
        now=security.now(),
    )
    if pending is None:
        raise _sign_in_failed("this sign-in is unknown to this browser, has expired or was used already.")
    if request.args.get("error"):
        log.info("console sign-in refused by the identity provider: %s", request.args.get("error"))
        raise _sign_in_failed("the identity provider refused it.")
    code = request.args.get("code", "")
    if not code:
        raise _sign_in_failed("the identity provider sent no code.")
    try:
        claims = client.finish(
            code=code, redirect_uri=_callback_url(), code_verifier=pending.code_verifier, nonce=pending.nonce
        )
    except InvalidSignInError as exc:
        log.warning("console sign-in refused: %s", exc)
        raise _sign_in_failed("the identity provider's answer did not pass the checks.") from None
    except IdentityProviderError as exc:
        log.warning("console sign-in: the identity provider is unusable: %s", exc)
        raise BadGateway("The identity provider can't be reached; try again in a moment.") from None
    identity = client.settings
    subject = str(claims.get("sub") or "")
    name = str(claims.get("name") or claims.get("preferred_username") or "")
    email = str(claims.get("email") or "")
    if _person_disabled(console.store, claims, identity):
        refused = Person(subject, name, email, "viewer", frozenset(), "")
        service.record_change(
            console.store,
            _context(refused.actor),
            "console.sign_in_refused",
            "person",
            subject[:64],
            None,
            {"subject": subject, "name": name, "email": email, "reason": "disabled"},
        )
        raise Forbidden(f"{email or name or subject} is disabled on this gateway; ask a gateway admin.")
    role, org_names = role_of(groups_of(claims, identity.groups_claim), identity)
    org_ids = org_ids_of(console.store.accounts, org_names) if role == "org_admin" else frozenset()
    if role == "org_admin" and not org_ids:  # its organisations don't exist (yet): the next role down
        role, org_ids = ("viewer", frozenset()) if role_of_viewer(claims, identity) else (None, frozenset())
    if role is None:
        refused = Person(subject, name, email, "viewer", frozenset(), "")
        service.record_change(
            console.store,
            _context(refused.actor),
            "console.sign_in_refused",
            "person",
            subject[:64],
            None,
            {"subject": subject, "name": name, "email": email},
        )
        raise Forbidden(
            "Your identity provider's groups give you no role in this console. Ask a gateway admin to "
            "add one of your groups to [identity] admins, org_admins or viewers."
        )
    return _open_session(Person(subject, name, email, role, org_ids, ""))


def _person_disabled(store: Any, claims: Mapping[str, Any], identity: IdentitySettings) -> bool:
    """Create or bring up to date the person of these (checked) claims (``People.sign_in``);
    whether they are disabled. In no group that names an organisation is no matter here (a
    console role needs none); a person the store can't record (no subject) signs in as before."""
    from ezat_compat.store.accounts import StoreError
    from ezat_compat.store.people import NoOrganisationError, PersonDisabledError

    people = getattr(store, "people", None)
    if people is None:
        return False
    try:
        people.sign_in(claims, identity)
    except PersonDisabledError:
        return True
    except NoOrganisationError:
        return False
    except StoreError as exc:
        log.warning("console sign-in: the person could not be recorded: %s", exc)
    return False


def role_of_viewer(claims: Mapping[str, Any], identity: IdentitySettings) -> bool:
    """Whether the person's groups include a viewers' group."""
    return bool(groups_of(claims, identity.groups_claim) & frozenset(identity.viewers))


@security.public
def link(token: str) -> Response:
    security.sign_in_attempt()
    console = security.state()
    link_id = console.sessions.use_link(token, security.now())
    if link_id is None:
        raise _sign_in_failed("this sign-in link is unknown, has expired or was used already.")
    subject = BREAK_GLASS_PREFIX + link_id
    service.record_change(
        console.store, _context(subject), "console_link.use", "console_link", link_id, {"used": False}, {"used": True}
    )
    return _open_session(Person(subject, BREAK_GLASS_NAME, "", "admin", frozenset(), ""))


def sign_out() -> Response:
    who = person()
    console = security.state()
    if console.sessions.end_session(who.session_id, security.now()):
        service.record_change(
            console.store, _context(who.actor), "console.sign_out", "console_session", who.session_id, None, None
        )
    response = redirect(security.sign_in_url(reason="signed-out"), 303)
    security.clear_session_cookie(response)
    return response


def blueprint() -> Blueprint:
    """A new blueprint "console" (``/console``): the views above and the console's static files
    and templates (``console/…``); ``register`` guards it (``security.guard``)."""
    bp = Blueprint(
        "console",
        __name__,
        url_prefix="/console",
        static_folder="static",
        template_folder="templates",
    )
    bp.add_url_rule("/sign-in", "sign_in", sign_in, methods=["GET"])
    bp.add_url_rule("/auth/login", "login", login, methods=["GET"])
    bp.add_url_rule("/auth/callback", "callback", callback, methods=["GET"])
    bp.add_url_rule("/auth/link/<token>", "link", link, methods=["GET"])
    bp.add_url_rule("/sign-out", "sign_out", sign_out, methods=["POST"])
    return bp
