"""Spend limits' calendar periods and money formats (store/spend.py), without a database: days,
ISO weeks and months in UTC and in other zones, month ends, leap years, daylight saving time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo

import pytest

from ezat_compat.periods import cents, cents_to_micros, fractional_cents, period_bounds, rfc3339, time_zone
from ezat_compat.store.accounts import StoreError
from ezat_compat.store.hotpath import SpendHold, decode_holds, encode_holds
from ezat_compat.store.spend import check_thresholds
from tests.support.property_budget import dev_profile_loaded


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


PERIODS = [
    # id, period, zone, at (any offset), start, end (RFC 3339, any offset)
    ("daily-utc", "daily", "UTC", "2026-03-10T15:00Z", "2026-03-10T00:00Z", "2026-03-11T00:00Z"),
    ("daily-utc-first-instant", "daily", "UTC", "2026-03-10T00:00Z", "2026-03-10T00:00Z", "2026-03-11T00:00Z"),
    (
        "daily-utc-last-micro",
        "daily",
        "UTC",
        "2026-03-10T23:59:59.999999+00:00",
        "2026-03-10T00:00Z",
        "2026-03-11T00:00Z",
    ),
    (
        "daily-paris-is-its-own-day",
        "daily",
        "Europe/Paris",
        "2026-03-10T23:30Z",
        "2026-03-10T23:00Z",
        "2026-03-11T23:00Z",
    ),
    ("daily-tokyo", "daily", "Asia/Tokyo", "2026-03-10T14:59:59+00:00", "2026-03-09T15:00Z", "2026-03-10T15:00Z"),
    (
        "daily-new-york-spring-forward-is-23h",
        "daily",
        "America/New_York",
        "2026-03-08T12:00-04:00",
        "2026-03-08T00:00-05:00",
        "2026-03-09T00:00-04:00",
    ),
    (
        "daily-new-york-fall-back-is-25h",
        "daily",
        "America/New_York",
        "2026-11-01T12:00-05:00",
        "2026-11-01T00:00-04:00",
        "2026-11-02T00:00-05:00",
    ),
    # Santiago skips midnight at its spring change: the day starts at the clock's 01:00.
    (
        "daily-santiago-midnight-skipped",
        "daily",
        "America/Santiago",
        "2026-09-06T12:00-03:00",
        "2026-09-06T01:00-03:00",
        "2026-09-07T00:00-03:00",
    ),
    ("weekly-monday-starts", "weekly", "UTC", "2026-03-09T00:00Z", "2026-03-09T00:00Z", "2026-03-16T00:00Z"),
    ("weekly-sunday-ends", "weekly", "UTC", "2026-03-15T23:59:59+00:00", "2026-03-09T00:00Z", "2026-03-16T00:00Z"),
    ("weekly-across-new-year", "weekly", "UTC", "2027-01-01T10:00Z", "2026-12-28T00:00Z", "2027-01-04T00:00Z"),
    (
        "weekly-paris-across-dst",
        "weekly",
        "Europe/Paris",
        "2026-03-29T12:00+02:00",
        "2026-03-23T00:00+01:00",
        "2026-03-30T00:00+02:00",
    ),
    (
        "weekly-local-monday-is-utc-sunday",
        "weekly",
        "Asia/Tokyo",
        "2026-03-08T16:00Z",
        "2026-03-08T15:00Z",
        "2026-03-15T15:00Z",
    ),
    ("monthly-utc", "monthly", "UTC", "2026-01-31T23:59:59+00:00", "2026-01-01T00:00Z", "2026-02-01T00:00Z"),
    ("monthly-february", "monthly", "UTC", "2026-02-14T00:00Z", "2026-02-01T00:00Z", "2026-03-01T00:00Z"),
    ("monthly-leap-february", "monthly", "UTC", "2028-02-29T12:00Z", "2028-02-01T00:00Z", "2028-03-01T00:00Z"),
    ("monthly-december", "monthly", "UTC", "2026-12-31T12:00Z", "2026-12-01T00:00Z", "2027-01-01T00:00Z"),
    ("monthly-30-day-month", "monthly", "UTC", "2026-04-30T12:00Z", "2026-04-01T00:00Z", "2026-05-01T00:00Z"),
    (
        "monthly-new-york-utc-is-next-month",
        "monthly",
        "America/New_York",
        "2026-04-01T02:00Z",
        "2026-03-01T00:00-05:00",
        "2026-04-01T00:00-04:00",
    ),
    (
        "monthly-paris-across-dst",
        "monthly",
        "Europe/Paris",
        "2026-10-15T12:00+02:00",
        "2026-10-01T00:00+02:00",
        "2026-11-01T00:00+01:00",
    ),
]


@pytest.mark.parametrize(
    ("period", "zone", "at", "start", "end"), [p[1:] for p in PERIODS], ids=[p[0] for p in PERIODS]
)
def test_period_bounds(period: str, zone: str, at: str, start: str, end: str) -> None:
    found = period_bounds(period, utc(at), time_zone(zone))
    assert found == (utc(start), utc(end))
    assert found[0] <= utc(at) < found[1]
    assert found[0].tzinfo is UTC and found[1].tzinfo is UTC


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/New_York", "America/Santiago", "Australia/Lord_Howe"])
@pytest.mark.parametrize("period", ["daily", "weekly", "monthly"])
def test_periods_tile_time_without_gaps(period: str, zone: str) -> None:
    """Every hour of two years falls in exactly one period, each period following the last (between
    two edits: every fifth hour, and every hour of the days around a change of the zone's offset)."""
    tz = time_zone(zone)
    first = datetime(2026, 1, 1, tzinfo=UTC)
    start, end = period_bounds(period, first, tz)
    for at in _hours_to_check(first, datetime(2028, 1, 1, tzinfo=UTC), tz):
        found = period_bounds(period, at, tz)
        if found != (start, end):
            assert found[0] == end, (at, found, end)  # the next one starts where the last ended
            start, end = found
        assert start <= at < end


def _hours_to_check(first: datetime, last: datetime, tz: tzinfo) -> Iterator[datetime]:
    """Each hour from ``first`` to ``last`` under CI (or ``--hypothesis-profile=ci``). Between two
    edits (the ``dev`` profile): every fifth hour, which reaches each hour of the day and each
    period (none is shorter than 23 hours), and each hour of the three days around each change of
    the zone's UTC offset (daylight saving time)."""
    every = 5 if dev_profile_loaded() else 1
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    offsets = [day.astimezone(tz).utcoffset() for day in days]
    changes = {n for n in range(len(days) - 1) if offsets[n] != offsets[n + 1]}
    near_a_change = {n + step for n in changes for step in (-1, 0, 1)}
    hours = [timedelta(hours=h) for h in range(24)]
    for n, day in enumerate(days[:-1]):
        checked = hours if n in near_a_change else hours[(-n * 24) % every :: every]
        yield from (day + hour for hour in checked)


def test_period_bounds_refuses_naive_times_and_unknown_periods() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        period_bounds("daily", datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="daily, weekly, monthly"):
        period_bounds("yearly", datetime(2026, 1, 1, tzinfo=UTC))


def test_time_zone_names() -> None:
    assert time_zone("UTC") is UTC and time_zone("utc") is UTC
    assert str(time_zone("Europe/Paris")) == "Europe/Paris"
    for bad in ("Mars/Olympus", "", "../etc/passwd"):
        with pytest.raises(ValueError, match="not a time zone name"):
            time_zone(bad)


def test_rfc3339_in_the_periods_zone() -> None:
    moment = utc("2026-02-01T00:00Z")
    assert rfc3339(moment) == "2026-02-01T00:00:00Z"
    assert rfc3339(moment, time_zone("Europe/Paris")) == "2026-02-01T01:00:00+01:00"


MONEY = [
    # micro-USD, cents (Anthropic's amount), fractional cents (period_to_date_spend)
    (0, "0", "0"),
    (10_000, "1", "1"),
    (500_000_000, "50000", "50000"),
    (120_500_000, "12050", "12050"),
]


@pytest.mark.parametrize(("micros", "whole", "fraction"), MONEY)
def test_money_in_cents(micros: int, whole: str, fraction: str) -> None:
    assert cents(micros) == whole
    assert cents_to_micros(whole) == micros
    assert fractional_cents(micros) == fraction


def test_fractional_cents_keep_three_decimals_rounded_down() -> None:
    assert fractional_cents(1) == "0"  # 0.0001 cent
    assert fractional_cents(19) == "0.001"
    assert fractional_cents(123_456_789) == "12345.678"
    assert fractional_cents(120_505_000) == "12050.5"


@pytest.mark.parametrize("bad", ["-1", "1.5", "", "1e3", " 1", "١"])
def test_amounts_in_cents_are_non_negative_integers(bad: str) -> None:
    with pytest.raises(ValueError, match="integer number of cents"):
        cents_to_micros(bad)


def test_cents_refuse_fractions_of_a_cent() -> None:
    with pytest.raises(ValueError, match="whole number of cents"):
        cents(10_001)


def test_thresholds_are_whole_percentages() -> None:
    assert check_thresholds([100, 80, 80]) == (80, 100)
    for bad in (0, 1001, True, 50.0):
        with pytest.raises(StoreError, match="percentage"):
            check_thresholds([bad])  # type: ignore[list-item]


def test_holds_round_trip_through_the_reservation_column() -> None:
    holds = [SpendHold(3, 1_700_000_000_000_000, 1_700_086_400_000_000, 10), SpendHold(12, 5, 6, 7)]
    assert encode_holds(holds) == "3:1700000000000000,12:5"
    assert decode_holds(encode_holds(holds)) == [(3, 1_700_000_000_000_000), (12, 5)]
    assert encode_holds([]) is None and decode_holds(None) == []
