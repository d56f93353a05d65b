"""Calendar periods and Anthropic's money formats for spend limits (store/spend.py, the admin
API): pure functions, no I/O but the time zone database's files.

A period is a calendar day, ISO week (Monday to Sunday) or month of one time zone; its bounds
are UTC instants, the first one the period's and the second the next period's first
(``period_bounds``). Anthropic's Admin API writes a limit as an integer string of cents
(``cents``) and a period's spend with up to three decimals of a cent (``fractional_cents``);
the gateway counts integer micro-USD (pricing.py).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, tzinfo
from decimal import ROUND_DOWN, Decimal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

PERIODS = ("daily", "weekly", "monthly")
PERIOD_NOUNS = {"daily": "day", "weekly": "week", "monthly": "month"}
MICROS_PER_CENT = 10_000
MAX_MICROS = 2**62  # amounts at or above this are refused (the hot path's "no cap" is 2**62)


def time_zone(name: str) -> tzinfo:
    """The zone of the periods: ``UTC`` or an IANA name (``Europe/Paris``); ``ValueError``
    naming it otherwise."""
    if name.upper() in ("UTC", "Z", "ETC/UTC"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not a time zone name (IANA, like UTC or Europe/Paris)") from None


def _local_midnight(day: date, zone: tzinfo) -> datetime:
    """The first instant of ``day`` in ``zone``, in UTC. A midnight that a clock change skips
    (``fold`` 0 of a gap takes the offset before it) is the instant the day's clock starts at."""
    return datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)


def _first_day(period: str, day: date) -> date:
    if period == "daily":
        return day
    if period == "weekly":
        return day - timedelta(days=day.weekday())  # ISO 8601: weeks start on Monday
    if period == "monthly":
        return day.replace(day=1)
    raise ValueError(f"period must be one of {', '.join(PERIODS)}, got {period!r}")


def _next_first_day(period: str, first: date) -> date:
    if period == "daily":
        return first + timedelta(days=1)
    if period == "weekly":
        return first + timedelta(days=7)
    return (first + timedelta(days=32)).replace(day=1)


def period_bounds(period: str, at: datetime, zone: tzinfo = UTC) -> tuple[datetime, datetime]:
    """The calendar ``period`` (daily, weekly, monthly) of ``zone`` that ``at`` (aware) falls
    in: its first instant and the next period's, both in UTC (``start <= at < end``)."""
    if at.tzinfo is None:
        raise ValueError(f"{at!r} has no time zone; pass an aware datetime")
    first = _first_day(period, at.astimezone(zone).date())
    return _local_midnight(first, zone), _local_midnight(_next_first_day(period, first), zone)


def rfc3339(moment: datetime, zone: tzinfo = UTC) -> str:
    """``moment`` in ``zone`` as RFC 3339 (``Z`` for UTC): ``2026-02-01T00:00:00+01:00``."""
    local = moment.astimezone(zone)
    text = local.isoformat(timespec="seconds" if local.microsecond == 0 else "microseconds")
    return text.replace("+00:00", "Z") if local.utcoffset() == timedelta(0) and zone is UTC else text


def cents(micros: int) -> str:
    """Micro-USD as Anthropic's integer cents string (``"50000"`` is $500.00); whole cents only."""
    whole, rest = divmod(micros, MICROS_PER_CENT)
    if rest:
        raise ValueError(f"{micros} micro-USD is not a whole number of cents")
    return str(whole)


def fractional_cents(micros: int) -> str:
    """Micro-USD as cents with up to three decimals (``"12050.5"``), rounded down, ``"0"`` for 0."""
    value = (Decimal(micros) / MICROS_PER_CENT).quantize(Decimal("0.001"), rounding=ROUND_DOWN)
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def cents_to_micros(text: str) -> int:
    """Anthropic's amount (a non-negative integer decimal string of cents) in micro-USD;
    ``ValueError`` saying what is wrong otherwise."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit():
        raise ValueError(f'{text!r} is not a non-negative integer number of cents, like "50000" for $500.00')
    micros = int(text) * MICROS_PER_CENT
    if micros >= MAX_MICROS:
        raise ValueError(f"{text!r} is too large")
    return micros
