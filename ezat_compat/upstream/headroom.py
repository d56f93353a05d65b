"""A deployment's own rate limits, read from its answers, as a routing preference.

Anthropic's API answers every request with the state of the organisation's limits (Anthropic,
"Rate limits", response headers): for each of ``requests``, ``tokens``, ``input-tokens`` and
``output-tokens``, ``anthropic-ratelimit-<limit>-limit``, ``-remaining`` and ``-reset`` (an RFC
3339 time). Foundry serves the same API. Amazon Bedrock and Google Vertex AI send no such headers
(their throttling is only told by a 429 or a ``ThrottlingException``).

A deployment with less than ``LOW_SHARE`` of one of its limits left (or none, when the limit
isn't given) will most likely refuse its next request with a 429. The gateway marks it *low*
until that limit's reset (at most ``LOW_FOR_MAX_S`` ahead; ``LOW_FOR_S`` when the reset isn't
readable) and tries it after the model's other deployments, whatever their tiers: they take the
traffic it would have refused, and it is still tried when they fail or cool down, so a model with
one deployment is served exactly as before. It is a preference, not a cooldown: a 429 that does
come still cools the deployment as any failure does (``cooldowns.py``).

The marks are this worker's (each learns from the answers it gets): a soft, short-lived hint
that costs a dictionary look-up per request; the cooldowns, which refuse, are the shared state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

LIMITS = ("requests", "tokens", "input-tokens", "output-tokens")
_HEADERS = tuple(
    (
        limit,
        f"anthropic-ratelimit-{limit}-remaining",
        f"anthropic-ratelimit-{limit}-limit",
        f"anthropic-ratelimit-{limit}-reset",
    )
    for limit in LIMITS
)
_REQUESTS_LEFT = _HEADERS[0][1]
_TOKENS_LEFT = _HEADERS[1][1]
LOW_SHARE = 0.05  # under 5 % of a limit left: the next requests are likely to be refused
LOW_FOR_S = 1.0  # how long a low deployment waits its turn when its reset can't be read
LOW_FOR_MAX_S = 60.0  # the limits are per minute: a reset further ahead is not believed

T = TypeVar("T")


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def reset_at(value: str | None) -> float | None:
    """An RFC 3339 time (``2026-12-06T21:30:00Z``) as epoch seconds; None when unreadable."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:  # RFC 3339 always has an offset; without one it isn't this header
        return None
    return moment.timestamp()


def read(headers: Mapping[str, str], now: float) -> tuple[list[tuple[str, int]], float | None]:
    """What ``headers`` (an answer's) say of the deployment's limits: ``(limit, remaining)`` for
    each one reported, and until when it is low on one of them (the latest such reset,
    bounded; None when none is low). Anthropic's API sends every limit's fields together: an
    answer with neither the requests nor the tokens one is read as reporting none."""
    if _REQUESTS_LEFT not in headers and _TOKENS_LEFT not in headers:
        return [], None  # not Anthropic's API (or none of its limits): two look-ups, not twelve
    seen: list[tuple[str, int]] = []
    until: float | None = None
    for limit, left, total, reset in _HEADERS:
        value = _int(headers.get(left))
        if value is None:
            continue
        seen.append((limit, value))
        most = _int(headers.get(total))
        if value > 0 and (most is None or value >= most * LOW_SHARE):
            continue
        at = reset_at(headers.get(reset))
        end = now + LOW_FOR_S if at is None or at <= now else min(at, now + LOW_FOR_MAX_S)
        until = end if until is None else max(until, end)
    return seen, until


class Headroom:
    """Which deployments are low on their own limits, and until when (this process's view)."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __bool__(self) -> bool:
        """Whether any deployment is (or was lately) marked low: ``last`` has work to do."""
        return bool(self._until)

    def learn(self, name: str, headers: Mapping[str, str], now: float) -> list[tuple[str, int]]:
        """Note what an answer of deployment ``name`` says of its limits; ``(limit, remaining)``
        of each it reports."""
        seen, until = read(headers, now)
        if until is not None:
            self._until[name] = until
        elif seen and name in self._until:
            del self._until[name]  # it has room again
        return seen

    def last(self, order: Sequence[T], name: Callable[[T], str], now: float) -> Sequence[T]:
        """``order`` with the deployments low now moved to its end (their own order kept)."""
        marks = self._until
        if not marks:
            return order
        low = [d for d in order if marks.get(name(d), 0.0) > now]
        if not low:
            for key in [k for k, until in marks.items() if until <= now]:
                del marks[key]
            return order
        return [d for d in order if marks.get(name(d), 0.0) <= now] + low
