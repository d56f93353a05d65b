"""The admin API's errors, always in Anthropic's envelope (Admin API reference, "Errors").

Every path under ``/v1/organizations`` answers an error as Anthropic's Admin API does::

    {"type": "error", "error": {"type": "not_found_error", "message": "…"}, "request_id": "req_…"}

with the ``request-id`` header (the app's hook) and ``x-should-retry: false`` on a 4xx, so the
``anthropic`` SDK doesn't retry a 409 that will conflict again. Raise an ``AdminError`` subclass
from a view or from ``admin.service``; routing 404/405 and the parser's 422 become them through
``from_http_exception`` (the app's handler asks ``is_admin_path`` first: Flask's blueprint
handlers never see routing errors).

    AdminError (500, api_error)
    ├── AdminInvalidRequestError   400 invalid_request_error  a bad value or field: fix the request
    ├── AdminAuthenticationError   401 authentication_error   no admin key, or an unknown, revoked or expired one
    ├── AdminPermissionError       403 permission_error       an inference key, or a read-only admin key writing
    ├── AdminNotFoundError         404 not_found_error        no such workspace, key, route…
    ├── AdminMethodNotAllowedError 405 invalid_request_error
    └── AdminConflictError         409 conflict_error         the change conflicts with the state (don't retry)
"""

from __future__ import annotations

from typing import Any, ClassVar

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, UnprocessableEntity

from ezat_compat.errors import GatewayError, render_anthropic
from ezat_compat.wire.paths import flatten_errors, format_error

ADMIN_PREFIX = "/v1/organizations"


def is_admin_path(path: str) -> bool:
    """Whether ``path`` is the admin API's (``/v1/organizations`` and below)."""
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


class AdminError(GatewayError):
    """An admin API failure on the gateway's side (500 ``api_error``): retry later."""

    status: ClassVar[int] = 500
    anthropic_type: ClassVar[str] = "api_error"


class AdminInvalidRequestError(AdminError):
    """The request is wrong (a bad value, an unknown field, an unusable cursor): fix it."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class AdminAuthenticationError(AdminError):
    """No admin key, or an unknown, revoked or expired one: send a valid ``ezat_admin_…`` key."""

    status = 401
    openai_type = "invalid_request_error"
    anthropic_type = "authentication_error"


class AdminPermissionError(AdminError):
    """The key may not do this: an inference key on the admin API, or a read-only admin key
    asking for a change."""

    status = 403
    openai_type = "permission_error"
    anthropic_type = "permission_error"


class AdminNotFoundError(AdminError):
    """No such workspace, key, admin key or route."""

    status = 404
    openai_type = "invalid_request_error"
    anthropic_type = "not_found_error"


class AdminMethodNotAllowedError(AdminError):
    """The route exists but not with this method (Anthropic has no error type of its own for
    405: ``invalid_request_error``)."""

    status = 405
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class AdminConflictError(AdminError):
    """The change conflicts with the current state (e.g. an archived key made active again):
    retrying the same request won't help."""

    status = 409
    openai_type = "invalid_request_error"
    anthropic_type = "conflict_error"


def render_admin_error(err: GatewayError, request_id: str | None) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) of ``err`` on an admin path: Anthropic's envelope with the request
    id, and ``x-should-retry: false`` for a 4xx (the SDK would retry a 409 otherwise)."""
    status, body, headers = render_anthropic(err, request_id)
    if 400 <= status < 500 and status not in (408, 429):
        headers = {**headers, "x-should-retry": "false"}
    return status, body, headers


def _validation_message(data: Any) -> str:
    """The parser's messages (``{"json": {"name": ["…"]}}``, keyed by where they were read) as
    ``path: message`` lines joined by ``; ``, without the location."""
    messages = data.get("messages") if isinstance(data, dict) else None
    if isinstance(messages, dict):
        parts = []
        for where in messages.values():
            parts += [format_error(path, message) for path, message in flatten_errors(where)]
        if parts:
            return "; ".join(parts)
    return "The request is not valid."


def from_http_exception(exc: HTTPException, method: str, path: str) -> AdminError:
    """The admin error a werkzeug exception stands for on an admin path: routing 404/405, the
    parser's 422 (a 400 naming each field), anything else by its status."""
    if isinstance(exc, NotFound):
        return AdminNotFoundError(f"Not found: {method} {path}.")
    if isinstance(exc, MethodNotAllowed):
        allowed = ", ".join(sorted(m for m in (exc.valid_methods or []) if m not in ("HEAD", "OPTIONS")))
        return AdminMethodNotAllowedError(
            f"Method {method} is not allowed for {path}" + (f"; use {allowed}." if allowed else ".")
        )
    if isinstance(exc, UnprocessableEntity) or (exc.code == 400 and getattr(exc, "data", None)):
        return AdminInvalidRequestError(_validation_message(getattr(exc, "data", None)))
    if exc.code and 400 <= exc.code < 500:
        return AdminInvalidRequestError(exc.description or exc.name)
    return AdminError(exc.description or "Internal error.")
