"""Upstream failure -> the client's error: the one table, for JSON answers and streams alike.

Chat Completions reference, "Errors" (the Anthropic statuses, 529 -> 503 for OpenAI clients;
failed requests aren't billed). An upstream ``error`` event mid-stream is first turned into
the HTTP answer its type stands for (``UpstreamStatusError.from_event``), so one table serves
both paths.

The error returned carries the upstream's own answer (``GatewayError.upstream``) when there is
one that is the client's business — its request refused, or no capacity — so Anthropic
clients get it as it came; the deployment's own 401-404 (the gateway's key or model is wrong)
and failures without an answer never are.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ezat_compat.errors import (
    DEPLOYMENT_FAULT_STATUSES,
    GatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    OverloadedError,
    RateLimitError,
    RequestTooLargeError,
    UpstreamAuthError,
    UpstreamBodyError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamStreamError,
    UpstreamTimeoutError,
    UpstreamTLSError,
)

# The upstream's 400 text -> (message, param) in the client's terms (a dialect's rewrite).
Rewrite = Callable[[str], tuple[str, "str | None"]]

STREAM_BROKE = "The upstream stream broke off before the reply was complete."
STREAM_ENDED_EARLY = "The upstream stream ended before the reply was complete."
_CLIENT_FAULT_PASSED = frozenset({401, 402, 403, 404, 413, 429})


def _retry_after(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, math.ceil(seconds))


def _no_rewrite(message: str) -> tuple[str, str | None]:
    return message, None


def _by_status(exc: UpstreamStatusError, rewrite: Rewrite) -> GatewayError:
    """The row of the status table for an upstream answer."""
    status = exc.status_code
    retry = _retry_after(exc.upstream_retry_after)
    if status in DEPLOYMENT_FAULT_STATUSES:
        return GatewayError(
            f"The upstream deployment refused the gateway's request (HTTP {status}); "
            "this is a gateway configuration problem, not yours.",
            retry_after=retry,
        )
    if exc.from_between and status >= 400:
        return GatewayError(
            f"Something between the gateway and the upstream provider refused the request (HTTP {status}); "
            "this is a gateway configuration problem, not yours.",
            retry_after=retry,
        )
    answer = exc.answer()
    if status == 400 or (400 <= status < 500 and status not in _CLIENT_FAULT_PASSED):
        message, param = rewrite(exc.message or "invalid request")
        return InvalidRequestError(message, param=param, upstream=answer)
    if status == 413:
        return RequestTooLargeError(
            exc.message or "The request is too large for the upstream provider.", upstream=answer
        )
    if status == 429:
        return RateLimitError(
            exc.message or "The upstream provider is rate limiting; retry later.",
            retry_after=retry or 1,
            upstream=answer,
        )
    if status in (503, 529):
        return OverloadedError(
            exc.message or "The upstream provider is overloaded; retry later.", retry_after=retry or 1, upstream=answer
        )
    if status == 504:
        return GatewayTimeoutError(exc.message or "The upstream provider timed out.", upstream=answer)
    return GatewayError(
        exc.message or f"The upstream provider failed (HTTP {status}).", retry_after=retry, upstream=answer
    )


def client_error(
    exc: UpstreamError, *, rewrite: Rewrite | None = None, timeout_s: float = 590, streaming: bool = False
) -> GatewayError:
    """What the client gets for an upstream failure. ``rewrite`` maps an upstream 400's text to
    the client's terms; ``timeout_s`` is named by the 504 of a non-streaming request."""
    if isinstance(exc, UpstreamStatusError):
        return _by_status(exc, rewrite or _no_rewrite)
    retry = _retry_after(exc.upstream_retry_after)
    if isinstance(exc, UpstreamTimeoutError):
        if streaming:
            return GatewayTimeoutError("The upstream provider did not start the stream in time; retry shortly.")
        return GatewayTimeoutError(
            f'The request took longer than {timeout_s:g} seconds; stream it instead ("stream": true).'
        )
    if isinstance(exc, UpstreamTLSError):
        if exc.certificate:
            return GatewayError(
                "The upstream provider's certificate could not be verified; "
                "this is a gateway configuration problem (its trusted CAs), not yours."
            )
        return GatewayError(
            "The TLS connection to the upstream provider failed; this is a gateway configuration problem, not yours."
        )
    if isinstance(exc, UpstreamAuthError):
        return GatewayError(
            "The gateway could not authenticate to the upstream provider; this is a gateway configuration problem, "
            "not yours."
        )
    if isinstance(exc, UpstreamBodyError):
        return GatewayError("The upstream provider sent an answer the gateway can't take; try again shortly.")
    if isinstance(exc, UpstreamConnectError):
        return GatewayError("The upstream provider could not be reached; try again shortly.", retry_after=retry)
    if isinstance(exc, UpstreamStreamError):
        return GatewayError(STREAM_BROKE)
    return GatewayError("The upstream provider failed.")
