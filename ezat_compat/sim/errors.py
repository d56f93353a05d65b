"""The simulator's errors: ``SimError`` and Anthropic's error envelope and status table.

Raise ``SimError(status)`` (or ``InvalidRequestError(message)`` for a 400) anywhere in the
simulator; ``app.py`` renders it with ``error_body`` and its ``status``.
"""

from __future__ import annotations

from typing import Any

STATUS_TO_ERROR_TYPE: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

STATUS_TO_MESSAGE: dict[int, str] = {
    400: "Invalid request",
    401: "invalid x-api-key",
    402: "Your credit balance is too low to access the Anthropic API.",
    403: "Your API key does not have permission to use the specified resource.",
    404: "Not found",
    405: "Method not allowed",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "Number of request tokens has exceeded your per-minute rate limit",
    500: "Internal server error",
    502: "Overloaded",
    503: "Service unavailable",
    504: "Request timed out",
    529: "Overloaded",
}


def error_type_for(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status (unlisted 4xx: invalid_request_error, 5xx: api_error)."""
    known = STATUS_TO_ERROR_TYPE.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if status < 500 else "api_error"


class SimError(Exception):
    """An answer in Anthropic's error envelope. Render it with ``error_body`` and ``status``."""

    def __init__(self, status: int, message: str | None = None, *, retry_after: float | None = None) -> None:
        self.status = status
        self.error_type = error_type_for(status)
        self.message = message if message is not None else STATUS_TO_MESSAGE.get(status, "Error")
        self.retry_after = retry_after
        super().__init__(f"{status} {self.error_type}: {self.message}")


class InvalidRequestError(SimError):
    """400 invalid_request_error: the request is wrong; the client must fix it, not retry."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


def error_body(error: SimError, request_id: str) -> dict[str, Any]:
    """The JSON body Anthropic sends with an error status."""
    return {
        "type": "error",
        "error": {"type": error.error_type, "message": error.message},
        "request_id": request_id,
    }
