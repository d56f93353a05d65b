"""The error tree of the gateway and its two renderers.

Every failure a client can see is a ``GatewayError``. Each class carries its HTTP status
and how each dialect names it; ``render_openai`` and ``render_anthropic`` are the only places
that build error bodies.

    GatewayError (500, server_error / api_error)
    ├── InvalidRequestError        400  the client's request is wrong: fix it, don't retry
    │   └── RouteNotFoundError     404  no such route
    │   └── MethodNotAllowedError  405
    ├── AuthenticationError        401  missing, invalid, revoked or expired key
    ├── InsufficientQuotaError     402  balance or key spend limit exhausted
    ├── PermissionDeniedError      403  model not allowed for the key, organisation suspended
    ├── ModelNotFoundError         404  unknown model (param "model")
    ├── RequestTooLargeError       413  body over max_body_mb
    ├── RateLimitError             429  wait ``retry_after`` seconds
    ├── OverloadedError            503 (Anthropic: 529)  no capacity; wait ``retry_after``
    └── UpstreamTimeoutError       504  a non-streaming request took too long; stream instead

Spec: chat-completions.md, "Errors".
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    """An error on the gateway's or the provider's side (500). Safe to retry later."""

    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None
    anthropic_type: ClassVar[str] = "api_error"
    anthropic_status: ClassVar[int | None] = None  # when it differs from ``status``

    def __init__(self, message: str, *, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r})"


class InvalidRequestError(GatewayError):
    """The request is invalid or uses a refused field. Fix the request; retrying won't help."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class RouteNotFoundError(InvalidRequestError):
    status = 404
    anthropic_type = "not_found_error"


class MethodNotAllowedError(InvalidRequestError):
    status = 405


class AuthenticationError(GatewayError):
    """No usable key: missing, unknown, revoked or expired."""

    status = 401
    openai_type = "invalid_request_error"
    code = "invalid_api_key"
    anthropic_type = "authentication_error"


class InsufficientQuotaError(GatewayError):
    """The organisation's balance or the key's spend limit can't cover the request."""

    status = 402
    openai_type = "insufficient_quota"
    code = "insufficient_quota"
    anthropic_type = "billing_error"


class PermissionDeniedError(GatewayError):
    """The key may not use this model, or its organisation is suspended."""

    status = 403
    openai_type = "permission_error"
    anthropic_type = "permission_error"


class ModelNotFoundError(GatewayError):
    status = 404
    openai_type = "invalid_request_error"
    code = "model_not_found"
    anthropic_type = "not_found_error"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist or you do not have access to it.", param="model")


class RequestTooLargeError(GatewayError):
    status = 413
    openai_type = "invalid_request_error"
    code = "request_too_large"
    anthropic_type = "request_too_large"


class RateLimitError(GatewayError):
    """Too many requests or tokens for now: wait ``retry_after`` seconds, then retry."""

    status = 429
    openai_type = "rate_limit_error"
    code = "rate_limit_exceeded"
    anthropic_type = "rate_limit_error"


class OverloadedError(GatewayError):
    """No deployment has capacity now: wait ``retry_after`` seconds, then retry."""

    status = 503
    openai_type = "server_error"
    code = "overloaded"
    anthropic_type = "overloaded_error"
    anthropic_status = 529


class UpstreamTimeoutError(GatewayError):
    """A non-streaming request outlived ``upstream_timeout_s``. Stream it instead."""

    status = 504
    openai_type = "server_error"
    code = "timeout"
    anthropic_type = "timeout_error"


_ANTHROPIC_TYPE_BY_STATUS: dict[int, str] = {
    cls.anthropic_status or cls.status: cls.anthropic_type
    for cls in (
        InvalidRequestError,
        AuthenticationError,
        InsufficientQuotaError,
        PermissionDeniedError,
        ModelNotFoundError,
        RequestTooLargeError,
        RateLimitError,
        GatewayError,
        OverloadedError,
        UpstreamTimeoutError,
    )
}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (for upstream answers that carry none)."""
    return _ANTHROPIC_TYPE_BY_STATUS.get(status) or ("invalid_request_error" if status < 500 else "api_error")


def error_headers(err: GatewayError) -> dict[str, str]:
    return {"retry-after": str(err.retry_after)} if err.retry_after is not None else {}


def render_openai(err: GatewayError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) in OpenAI's envelope."""
    body = {
        "error": {
            "message": err.message,
            "type": err.openai_type,
            "param": err.param,
            "code": err.code,
        }
    }
    return err.status, body, error_headers(err)


def render_anthropic(err: GatewayError, request_id: str | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) in Anthropic's envelope; 529 stays 529 in this dialect."""
    body: dict[str, Any] = {"type": "error", "error": {"type": err.anthropic_type, "message": err.message}}
    if request_id:
        body["request_id"] = request_id
    return err.anthropic_status or err.status, body, error_headers(err)


def openai_error_event(err: GatewayError) -> dict[str, Any]:
    """The ``data: {"error": …}`` payload of a stream that failed after it started."""
    return render_openai(err)[1]
