"""The error tree of the gateway and its two renderers.

Every failure is a ``GatewayError``: what a client can see, and what the upstream client
raises (``UpstreamError``, which the pipeline always maps to a client error through the one
table in ``failures.py`` before anyone renders it). Each client class carries its HTTP status
and how each dialect names it; ``render_openai`` and ``render_anthropic`` are the only places
that build error bodies.

    GatewayError (500, server_error / api_error)
    ├── InvalidRequestError        400  the client's request is wrong: fix it, don't retry
    │   ├── RouteNotFoundError     404  no such route
    │   ├── NotFoundError          404  a stored response or item the organisation doesn't have
    │   └── MethodNotAllowedError  405
    ├── AuthenticationError        401  missing, invalid, revoked or expired key
    ├── InsufficientQuotaError     402  balance or key spend limit exhausted
    ├── PermissionDeniedError      403  model not allowed for the key, organisation suspended
    ├── ModelNotFoundError         404  unknown model (param "model")
    ├── RequestTimeoutError        408  the body didn't arrive in time; the connection is closed
    ├── RequestTooLargeError       413  body over max_body_mb
    ├── RateLimitError             429  wait ``retry_after`` seconds
    ├── OverloadedError            503 (Anthropic: 529)  no capacity; wait ``retry_after``
    ├── GatewayTimeoutError        504  a non-streaming request took too long; stream instead
    └── UpstreamError              what the upstream client raises; ``failover`` says whether
        │                          another deployment may try
        ├── UpstreamConnectError   connection refused / reset before an answer: fail over
        ├── UpstreamTimeoutError   no answer within the deadline: fail over
        ├── UpstreamAuthError      no cloud credentials (or a call the provider doesn't offer):
        │                          the gateway's configuration: fail over
        ├── UpstreamStatusError    a non-2xx answer: ``status``, ``retry_after``, the parsed
        │                          Anthropic error (``error_type``, ``message``) and raw ``body``
        ├── UpstreamBodyError      an answer the gateway won't read: larger than
        │                          ``max_upstream_body_mb``, or in a Content-Encoding it didn't
        │                          ask for: fail over
        └── UpstreamStreamError    the stream broke after it started: never fail over

Chat Completions reference, "Errors".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar


class GatewayError(Exception):
    """An error on the gateway's or the provider's side (500). Safe to retry later."""

    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None
    anthropic_type: ClassVar[str] = "api_error"
    anthropic_status: ClassVar[int | None] = None  # when it differs from ``status``
    close_connection: ClassVar[bool] = False  # the server must close the connection after the answer
    details: ClassVar[dict[str, str] | None] = None  # Anthropic's ``error.details``, when the error has one

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        retry_after: int | None = None,
        upstream: UpstreamAnswer | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.upstream = upstream  # the upstream's own answer, which Anthropic clients get as it came

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r})"


class InvalidRequestError(GatewayError):
    """The request is invalid or uses a refused field. Fix the request; retrying won't help."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class ThreadUnsupportedError(InvalidRequestError):
    """A message-thread turn the gateway can't serve (it keeps no upstream thread): 400 with
    ``details.error_code`` ``thread_unsupported_request``, which clients read as "resend this
    turn with the whole history"."""

    details = {"error_code": "thread_unsupported_request"}


class RouteNotFoundError(InvalidRequestError):
    status = 404
    anthropic_type = "not_found_error"


class NotFoundError(InvalidRequestError):
    """A stored response (or one of its items) that doesn't exist for this organisation: never
    stored, expired, deleted or another organisation's, alike. Send what it held instead."""

    status = 404
    anthropic_type = "not_found_error"


class ThreadNotFoundError(NotFoundError):
    """A message-thread continue whose thread the gateway doesn't hold (unknown, expired or another
    organisation's): 404 with ``details.error_code`` ``thread_not_found``, which the SDKs read as
    "resend the whole history under a new thread"."""

    details = {"error_code": "thread_not_found"}


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


class RequestTimeoutError(GatewayError):
    """The request body didn't arrive within its deadline (``[server] body_grace_s`` plus the
    time its size takes at ``body_min_rate_kbps``). Send the body promptly, then retry. The
    connection is closed after this answer (``close_connection``).

    OpenAI's envelope: ``invalid_request_error`` / ``request_timeout``. Anthropic's error types
    have no 408; ``timeout_error`` is its one timeout type, so that is the name used."""

    status = 408
    openai_type = "invalid_request_error"
    code = "request_timeout"
    anthropic_type = "timeout_error"
    close_connection = True


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


class GatewayTimeoutError(GatewayError):
    """A non-streaming request outlived ``upstream_timeout_s``. Stream it instead."""

    status = 504
    openai_type = "server_error"
    code = "timeout"
    anthropic_type = "timeout_error"


@dataclass(frozen=True, slots=True)
class UpstreamAnswer:
    """An upstream error answer as it came: its status, Anthropic's ``error`` object (None when
    the body wasn't Anthropic's envelope, e.g. a proxy's HTML page) and its ``retry-after``."""

    status: int
    error: Mapping[str, Any] | None
    message: str
    retry_after: str | None


# Anthropic's error types and their statuses (Anthropic's errors page), both directions.
ANTHROPIC_TYPE_TO_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_ANTHROPIC_STATUS_TO_TYPE = {status: kind for kind, status in ANTHROPIC_TYPE_TO_STATUS.items()}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (for upstream answers that carry none)."""
    return _ANTHROPIC_STATUS_TO_TYPE.get(status) or ("invalid_request_error" if status < 500 else "api_error")


# ---------------------------------------------------------------- what the upstream client raises


class UpstreamError(GatewayError):
    """Base of upstream failures. ``failover``: another deployment may be tried."""

    failover = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.upstream_retry_after = retry_after


class UpstreamConnectError(UpstreamError):
    """The deployment could not be reached (refused, reset, DNS). Safe to fail over."""


class UpstreamTLSError(UpstreamConnectError):
    """The TLS connection to the deployment failed (``certificate``: its certificate could not
    be verified). The gateway's configuration (``ca_file``, the client certificate) or the
    upstream's; safe to fail over."""

    def __init__(self, message: str, *, certificate: bool) -> None:
        super().__init__(message)
        self.certificate = certificate


class UpstreamTimeoutError(UpstreamError):
    """No complete answer before the deadline. Fail over if nothing reached the client."""


class UpstreamBodyError(UpstreamError):
    """The deployment's answer can't be taken: a body larger than ``[gateway]
    max_upstream_body_mb``, or a ``Content-Encoding`` the gateway didn't ask for (it asks for
    ``identity``: a compressed body could expand without bound). The deployment's fault, never
    the client's: fail over."""


class UpstreamAuthError(UpstreamError):
    """The gateway could not authenticate to the deployment's cloud (no credentials found, a
    refresh that failed) or the deployment's provider doesn't offer the call. The gateway's
    configuration, never the client's: fail over."""


class UpstreamStreamError(UpstreamError):
    """The upstream stream broke after it started. The client must be told mid-stream."""

    failover = False


# Statuses after which another deployment may be tried (the request was not the client's fault).
FAILOVER_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
# The deployment's own key or model is wrong: the gateway's fault, also worth another deployment.
DEPLOYMENT_FAULT_STATUSES = frozenset({401, 402, 403, 404})


class UpstreamStatusError(UpstreamError):
    """A non-2xx answer. Fail over on 429/5xx/529 and on the deployment's own 401-404."""

    def __init__(
        self, status: int, body: bytes, headers: Mapping[str, str], *, retry_after: float | None = None
    ) -> None:
        """``retry_after``: a delay the answer's body asks for (a provider's own form), used when
        its headers ask none."""
        self.status_code = status
        self.body = body
        self.headers = {name.lower(): value for name, value in headers.items()}  # names in lower case
        self.error, message = _parse_error(body)
        self.error_type = self.error.get("type") if self.error is not None else None
        asked = parse_retry_after(self.headers)
        super().__init__(
            message or f"upstream answered HTTP {status}", retry_after=retry_after if asked is None else asked
        )
        self.failover = status in FAILOVER_STATUSES or status in DEPLOYMENT_FAULT_STATUSES or self.from_between

    @property
    def from_between(self) -> bool:
        """A 3xx or 4xx that isn't Anthropic's envelope: something in between answered (a proxy,
        a load balancer). The route's fault, never the client's: another deployment may serve."""
        return self.error is None and self.status_code < 500

    @classmethod
    def from_event(cls, error: Mapping[str, Any]) -> UpstreamStatusError:
        """An ``error`` event of a stream, as the HTTP answer its type stands for."""
        status = ANTHROPIC_TYPE_TO_STATUS.get(str(error.get("type")), 500)
        return cls(status, json.dumps({"type": "error", "error": dict(error)}).encode(), {})

    def answer(self) -> UpstreamAnswer:
        error = self.error if self.error is not None and isinstance(self.error.get("type"), str) else None
        return UpstreamAnswer(self.status_code, error, self.message, self.headers.get("retry-after"))


def _parse_error(body: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        data = json.loads(body)
    except ValueError:
        return None, ""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err: dict[str, Any] = data["error"]
        message = err.get("message")
        return err, message if isinstance(message, str) else ""
    return None, ""


# Headers that give the delay in milliseconds, more precise than retry-after's seconds, read
# first: Azure's (Microsoft Foundry: "retry-after-ms", "x-ms-retry-after-ms"; microsoft/kernel-
# memory#795 honours all three) and OpenAI's SDKs' order (openai-python's
# ``_parse_retry_after_header``: retry-after-ms, then retry-after).
RETRY_AFTER_MS_HEADERS = ("retry-after-ms", "x-ms-retry-after-ms")


def _seconds(value: str | None, scale: float = 1.0) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value) / scale
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """The delay an upstream asks for, in seconds: ``retry-after-ms`` or ``x-ms-retry-after-ms``
    when given, else ``retry-after`` (numeric form; HTTP dates are ignored). ``headers`` must
    look names up case-insensitively or have them in lower case."""
    for name in RETRY_AFTER_MS_HEADERS:
        seconds = _seconds(headers.get(name), 1000.0)
        if seconds is not None:
            return seconds
    return _seconds(headers.get("retry-after"))


# ---------------------------------------------------------------- renderers


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


def anthropic_status(err: GatewayError) -> int:
    """The status an Anthropic client gets for ``err``: the upstream's own when it is passed on."""
    if err.upstream is not None:
        return err.upstream.status
    return err.anthropic_status or err.status


def render_anthropic(err: GatewayError, request_id: str | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) in Anthropic's envelope; 529 stays 529 in this dialect. An
    upstream answer carried by ``err`` is passed on as it came (its status, error object and
    ``retry-after``; an envelope is made for a body that wasn't Anthropic's)."""
    answer = err.upstream
    if answer is not None:
        error = answer.error or {"type": anthropic_error_type(answer.status), "message": answer.message}
        body: dict[str, Any] = {"type": "error", "error": error}
        headers = {"retry-after": answer.retry_after} if answer.retry_after else {}
    else:
        body = {"type": "error", "error": {"type": err.anthropic_type, "message": err.message}}
        if err.details:
            body["error"]["details"] = dict(err.details)
        headers = error_headers(err)
    if request_id:
        body["request_id"] = request_id
    return anthropic_status(err), body, headers


def openai_error_event(err: GatewayError) -> dict[str, Any]:
    """The ``data: {"error": …}`` payload of a stream that failed after it started."""
    return render_openai(err)[1]
