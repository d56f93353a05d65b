"""The organisation's request limit, as Anthropic's API keeps and reports it.

Anthropic, "Rate limits": limits are measured with the token bucket algorithm, "your capacity is
continuously replenished up to your maximum limit, rather than being reset at fixed intervals",
and every answer says where the organisation stands in ``anthropic-ratelimit-requests-limit``,
``-remaining`` and ``-reset`` ("the time when the rate limit will be fully replenished", RFC
3339). A request over the limit is a 429 ``rate_limit_error`` with ``retry-after`` (seconds);
its words are the API's: "This request would exceed your account's rate limit. Please try again
later." (quoted in anthropics/claude-code#71669).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from ezat_compat.sim.errors import SimError

OVER_LIMIT = "This request would exceed your account's rate limit. Please try again later."

Headers = tuple[tuple[str, str], ...]


class RateLimitedError(SimError):
    """429 ``rate_limit_error`` with the limit's header fields."""

    def __init__(self, retry_after: float, headers: Headers) -> None:
        super().__init__(429, OVER_LIMIT, retry_after=retry_after)
        self.headers = headers


def rfc3339(moment: float) -> str:
    """Epoch seconds as the API writes its resets (``2026-12-06T21:30:00Z``)."""
    return datetime.fromtimestamp(math.ceil(moment), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RequestBucket:
    """``per_minute`` requests, continuously replenished (``per_minute / 60`` a second), on the
    ``clock`` the caller gives (the app: ``time.time``)."""

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        if per_minute < 1:
            raise ValueError(f"a request limit must be at least 1 a minute, not {per_minute}")
        self.per_minute = per_minute
        self._rate = per_minute / 60.0
        self._clock = clock
        self._level = float(per_minute)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> Headers:
        """One request's place: its header fields, or ``RateLimitedError`` when none is left."""
        with self._lock:
            now = self._clock()
            self._level = min(float(self.per_minute), self._level + (now - self._at) * self._rate)
            self._at = now
            if self._level < 1.0:
                wait = (1.0 - self._level) / self._rate
                raise RateLimitedError(float(max(1, math.ceil(wait))), self._headers(now))
            self._level -= 1.0
            return self._headers(now)

    def _headers(self, now: float) -> Headers:
        full_at = now + (self.per_minute - self._level) / self._rate
        return (
            ("anthropic-ratelimit-requests-limit", str(self.per_minute)),
            ("anthropic-ratelimit-requests-remaining", str(math.floor(self._level))),
            ("anthropic-ratelimit-requests-reset", rfc3339(full_at)),
        )
