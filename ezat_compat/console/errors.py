"""The console's error pages: HTML, never the JSON envelopes of the APIs.

Flask's blueprint handlers never see routing errors (a 404 under ``/console``), so the app's
handlers ask ``is_console_path`` first (app.py ``_register_errors``) and answer with
``render_console_error``: the page ``console/error.html`` with the status, a heading
(``HEADINGS``: 403 is "Not allowed") and what to do, and the console's security headers. A 500
quotes the request id and nothing internal.
"""

from __future__ import annotations

from flask import Response, g, make_response, render_template, request
from werkzeug.exceptions import HTTPException

from ezat_compat.console.security import security_headers
from ezat_compat.errors import GatewayError

CONSOLE_PREFIX = "/console"
HEADINGS = {
    400: "Bad request",
    401: "Sign in first",
    403: "Not allowed",
    404: "Not found",
    405: "Method not allowed",
    413: "Too large",
    429: "Too many attempts",
    502: "The identity provider can't be reached",
}
GENERIC = "Something went wrong"


def is_console_path(path: str) -> bool:
    """Whether ``path`` is the console's (``/console`` and below)."""
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


def _page(status: int, message: str) -> Response:
    heading = HEADINGS.get(status, GENERIC)
    body = render_template("console/error.html", status=status, heading=heading, message=message)
    response = make_response(body, status)
    response.headers["Content-Type"] = "text/html; charset=utf-8"
    return security_headers(response)


def render_console_error(exc: BaseException) -> Response:
    """The error page for ``exc`` on a console path: an ``HTTPException`` by its status and
    description, a ``GatewayError`` by its status and message, anything else as a 500."""
    request_id = str(g.get("request_id") or "?")
    if isinstance(exc, HTTPException):
        status = exc.code or 500
        message = exc.description or "" if status < 500 or status == 502 else ""
        response = _page(status, message or _fallback(status, request_id))
        allowed = getattr(exc, "valid_methods", None)
        if exc.code == 405 and allowed:
            response.headers["Allow"] = ", ".join(allowed)
        if status == 429:
            response.headers["Retry-After"] = "60"
        return response
    if isinstance(exc, GatewayError) and exc.status < 500:
        return _page(exc.status, str(exc))
    return _page(500, _fallback(500, request_id))


def _fallback(status: int, request_id: str) -> str:
    if status >= 500:
        return f"The console failed to answer; quote request id {request_id} to the gateway's operators."
    return f"The console can't answer {request.method} {request.path}."
