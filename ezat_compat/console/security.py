"""The console's guard: sessions, timeouts, CSRF, security headers, the sign-in rate limit.

``guard(bp)`` installs on a console blueprint, for every view but those marked ``public`` (the
sign-in page, the IdP's redirect and callback, break-glass links, static files):

- a signed-in person: the ``ezat_console`` cookie names a live session (``store/console.py``),
  else a redirect (303) to the sign-in page. A session unused for ``[console] idle_timeout_s``,
  or older than ``absolute_timeout_s``, is ended on the server and refused the same way;
- on every POST, the session's CSRF token in the form's ``csrf_token`` field (compared in constant
  time), else 400: a forged or stale form changes nothing;
- on every answer, the headers of a page that must not be framed, cached or fed other origins'
  scripts (``SECURITY_HEADERS``, with the strict ``CSP``).

The session cookie is ``HttpOnly``, ``SameSite=Lax``, ``Secure`` unless ``[console]
secure_cookies = false``, and its path is the console's (``script_root`` + ``/console``: right
behind a proxy's prefix too). ``sign_in_attempt()`` counts one sign-in attempt of the client's
address against ``[console] sign_in_attempts_per_minute`` (429 past it), in the store's counters
(shared by every worker: Redis or the embedded SQLite file), else in the process.

The clock is ``now()``: ``app.extensions[CLOCK]`` when a test sets one, else the wall clock.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from flask import Blueprint, Flask, current_app, g, redirect, request, url_for
from limits import RateLimitItemPerMinute
from limits.errors import StorageError
from limits.storage import MemoryStorage, Storage
from limits.strategies import FixedWindowRateLimiter
from werkzeug.exceptions import BadRequest, TooManyRequests
from werkzeug.wrappers import Response

from ezat_compat.console.access import PERSON_KEY, Person
from ezat_compat.domain import ConsoleSettings
from ezat_compat.store.console import ConsoleSession, ConsoleStore
from ezat_compat.store.store import Store

COOKIE_NAME = "ezat_console"
LOGIN_COOKIE_NAME = "ezat_console_login"  # binds a sign-in under way to the browser that began it
CSRF_FIELD = "csrf_token"
CLOCK = "ezat_console_clock"  # app.extensions: a test's clock (a callable returning an aware datetime)
STATE = "ezat_console"  # app.extensions: the console's ``ConsoleState``

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATIC_CACHE = "max-age=300"  # the console's own CSS and script: a page load refetches them soon

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R", bound=Response)
_PUBLIC_ATTR = "_ezat_console_public"


class ConsoleState:
    """What the console's views need of the process: the settings, the store, the sign-in rate
    limiter; ``app.extensions[STATE]``."""

    def __init__(self, settings: ConsoleSettings, store: Store) -> None:
        assert store.console is not None, "open_store makes the console's repository"
        self.settings = settings
        self.store = store
        self.sessions: ConsoleStore = store.console
        counters = store.counters
        self._storage: Storage | None = None if counters is not None else MemoryStorage()
        self._counters = counters
        self._item = RateLimitItemPerMinute(settings.sign_in_attempts_per_minute, namespace="console-sign-in")

    def _limiter(self) -> FixedWindowRateLimiter:
        storage = self._storage if self._counters is None else self._counters.storage()
        assert storage is not None
        return FixedWindowRateLimiter(storage)

    def attempt(self, address: str) -> bool:
        """Count one sign-in attempt of ``address``: False when it is over the limit. A limit
        store that can't be reached lets the attempt through (the IdP has its own limits)."""
        try:
            return self._limiter().hit(self._item, address or "-")
        except StorageError:
            return True


def state() -> ConsoleState:
    """The console's ``ConsoleState`` of this app."""
    found: ConsoleState = current_app.extensions[STATE]
    return found


def now() -> datetime:
    """The console's clock (module docstring)."""
    clock = current_app.extensions.get(CLOCK)
    return clock() if clock is not None else datetime.now(UTC)


def public(view: F) -> F:
    """Mark ``view`` as open without a session (and without CSRF: it must take no POST)."""
    setattr(view, _PUBLIC_ATTR, True)
    return view


def cookie_path() -> str:
    """The cookies' path: the console's, under the proxy's prefix if any."""
    return request.script_root + "/console"


def sign_in_url(**args: Any) -> str:
    return url_for("console.sign_in", **args)


def set_session_cookie(response: Response, value: str) -> None:
    """Hand the browser its session cookie (a session cookie of the browser: no ``Max-Age``)."""
    response.set_cookie(
        COOKIE_NAME,
        value,
        path=cookie_path(),
        secure=state().settings.secure_cookies,
        httponly=True,
        samesite="Lax",
    )


def clear_session_cookie(response: Response) -> None:
    response.delete_cookie(
        COOKIE_NAME, path=cookie_path(), secure=state().settings.secure_cookies, httponly=True, samesite="Lax"
    )


def alive(session: ConsoleSession | None, at: datetime, settings: ConsoleSettings) -> bool:
    """Whether ``session`` may still be used at ``at``: not ended, used within the idle timeout,
    begun within the absolute one."""
    if session is None or session.ended_at is not None:
        return False
    if at - session.last_seen_at >= timedelta(seconds=settings.idle_timeout_s):
        return False
    return at - session.created_at < timedelta(seconds=settings.absolute_timeout_s)


def current_session() -> ConsoleSession | None:
    """The live session this request's cookie names (ending one that has timed out, noting the
    use of a live one), or None."""
    if "console_session" in g:
        found: ConsoleSession | None = g.console_session
        return found
    console = state()
    session = console.sessions.find_session(request.cookies.get(COOKIE_NAME, ""))
    at = now()
    if session is not None and session.ended_at is None and not alive(session, at, console.settings):
        console.sessions.end_session(session.public_id, at)
        session = None
    elif session is not None and session.ended_at is not None:
        session = None
    if session is not None:
        console.sessions.touch(session, at)  # any request of a live session counts as its use
    g.console_session = session
    return session


def person_of(session: ConsoleSession) -> Person:
    return Person(
        subject=session.subject,
        name=session.name,
        email=session.email,
        role=session.role,
        org_ids=session.org_ids,
        session_id=session.public_id,
    )


def _check() -> Response | None:
    if request.endpoint == "console.static":
        return None
    view = current_app.view_functions.get(request.endpoint or "")
    if view is None or getattr(view, _PUBLIC_ATTR, False):
        return None
    session = current_session()
    if session is None:
        if request.cookies.get(COOKIE_NAME):
            target = sign_in_url(reason="expired")
        else:
            target = sign_in_url()
        response = redirect(target, 303)
        if request.cookies.get(COOKIE_NAME):
            clear_session_cookie(response)
        return response
    g.setdefault(PERSON_KEY, person_of(session))
    g.console_csrf = session.csrf_token
    if request.method == "POST":
        sent = request.form.get(CSRF_FIELD, "")
        if not sent or not hmac.compare_digest(sent.encode(), session.csrf_token.encode()):
            raise BadRequest("This form is out of date or was not sent by the console; reload the page and try again.")
    return None


def security_headers(response: R) -> R:
    """The console's headers on ``response`` (static files may be cached a little)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    if request.endpoint == "console.static" and response.status_code == 200:
        response.headers["Cache-Control"] = STATIC_CACHE
    return response


def guard(bp: Blueprint) -> Blueprint:
    """Install the guard (module docstring) on ``bp``; returns it."""
    bp.before_request(_check)
    bp.after_request(security_headers)
    return bp


def sign_in_attempt() -> None:
    """Count this request as a sign-in attempt of its client's address; 429 past the limit."""
    if not state().attempt(request.remote_addr or ""):
        raise TooManyRequests("Too many sign-in attempts from your address; wait a minute and try again.")


def install(app: Flask, settings: ConsoleSettings, store: Store) -> ConsoleState:
    """Keep the console's ``ConsoleState`` on ``app``."""
    found = ConsoleState(settings, store)
    app.extensions[STATE] = found
    return found
