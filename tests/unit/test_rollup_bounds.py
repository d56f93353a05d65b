"""The rollup's pure parts (store/rollup.py): buckets, the holes of a range of ids, the tiling of a
range over the three tables, and what a ``Slice`` refuses."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from ezat_compat.store.rollup import DAY, HOUR, MINUTE, WIDTHS, Slice, Total, bucket_start, floor_to, missing_ids, tiles
from ezat_compat.store.tables import to_epoch_micros

T0 = datetime(2027, 1, 5, tzinfo=UTC)


def micros(moment: datetime) -> int:
    return to_epoch_micros(moment)


@pytest.mark.parametrize(
    ("moment", "width", "start"),
    [
        (T0 + timedelta(hours=13, minutes=7, seconds=59), MINUTE, T0 + timedelta(hours=13, minutes=7)),
        (T0 + timedelta(hours=13, minutes=7, seconds=59), HOUR, T0 + timedelta(hours=13)),
        (T0 + timedelta(hours=23, minutes=59, seconds=59, microseconds=999_999), DAY, T0),
        (T0, DAY, T0),  # a bucket's start is its own
    ],
)
def test_buckets_are_utc_minutes_hours_and_days(moment: datetime, width: int, start: datetime) -> None:
    assert bucket_start(micros(moment), width) == micros(start)
    assert floor_to(moment, width) == start


def test_a_day_bucket_is_the_utc_day_whatever_the_offset_given() -> None:
    late_evening_in_new_york = datetime.fromisoformat("2027-01-05T22:30:00-05:00")  # 03:30 UTC on the 6th
    assert floor_to(late_evening_in_new_york, DAY) == T0 + timedelta(days=1)


@pytest.mark.parametrize(
    ("lo", "hi", "present", "missing"),
    [
        (0, 5, [1, 2, 3, 4, 5], []),
        (0, 5, [2, 5], [1, 3, 4]),
        (10, 12, [12], [11]),
        (0, 3, [3], [1, 2]),
    ],
)
def test_missing_ids_are_the_ids_of_the_range_not_seen(
    lo: int, hi: int, present: list[int], missing: list[int]
) -> None:
    assert missing_ids(lo, hi, present) == missing


def test_missing_ids_keep_only_the_highest_of_a_long_gap() -> None:
    """A sequence that jumped by a million records the ids just below the row after the gap (the
    last handed out: the ones a transaction in flight may still hold), not a million holes."""
    assert missing_ids(0, 1_000_002, [1, 1_000_002], per_gap=3) == [999_999, 1_000_000, 1_000_001]


def test_tiles_take_whole_days_then_hours_then_minutes() -> None:
    start = micros(T0 + timedelta(hours=22, minutes=50))
    end = micros(T0 + timedelta(days=3, hours=2, minutes=5))
    assert tiles(start, end) == [
        ("1m", start, micros(T0 + timedelta(hours=23))),
        ("1h", micros(T0 + timedelta(hours=23)), micros(T0 + timedelta(days=1))),
        ("1d", micros(T0 + timedelta(days=1)), micros(T0 + timedelta(days=3))),
        ("1h", micros(T0 + timedelta(days=3)), micros(T0 + timedelta(days=3, hours=2))),
        ("1m", micros(T0 + timedelta(days=3, hours=2)), end),
    ]


@pytest.mark.parametrize(
    ("start", "end", "widths"),
    [
        (T0, T0 + timedelta(days=31), ["1d"]),
        (T0 + timedelta(hours=1), T0 + timedelta(hours=5), ["1h"]),
        (T0 + timedelta(minutes=1), T0 + timedelta(minutes=2), ["1m"]),
        (T0, T0, []),
    ],
)
def test_aligned_ranges_are_one_tile(start: datetime, end: datetime, widths: list[str]) -> None:
    assert [width for width, _, _ in tiles(micros(start), micros(end))] == widths


def test_tiles_cover_the_range_exactly_without_overlap() -> None:
    for start_min, end_min in [(7, 7 + 3 * 1440 + 95), (0, 59), (61, 1439), (1441, 2 * 1440 + 1)]:
        start, end = start_min * MINUTE, end_min * MINUTE
        pieces = tiles(start, end)
        assert pieces[0][1] == start
        assert pieces[-1][2] == end
        for (_, _, hi), (_, lo, _) in itertools.pairwise(pieces):
            assert hi == lo
        for width, lo, hi in pieces:
            assert lo % WIDTHS[width] == 0
            assert hi % WIDTHS[width] == 0


def test_tiles_refuse_a_range_that_is_not_whole_minutes() -> None:
    with pytest.raises(ValueError, match="whole minutes"):
        tiles(1, MINUTE)


def test_a_slice_refuses_what_the_rollup_cannot_answer() -> None:
    with pytest.raises(ValueError, match="width"):
        Slice("2h", T0, T0)
    with pytest.raises(ValueError, match="group"):
        Slice("1d", T0, T0, group=("product",))
    with pytest.raises(ValueError, match="order_by"):
        Slice("1d", T0, T0, order_by="amount")
    with pytest.raises(ValueError, match="multiple"):
        Slice("1d", T0 + timedelta(hours=1), T0 + timedelta(days=1))
    with pytest.raises(ValueError, match="before"):
        Slice("1d", T0 + timedelta(days=1), T0)
    # Without buckets, whole minutes are enough.
    Slice("1d", T0 + timedelta(minutes=3), T0 + timedelta(days=2), by_bucket=False)


def test_total_tokens_are_the_four_token_counts() -> None:
    row = Total(None, None, None, None, 1, 10, 20, 30, 40, 5)
    assert row.total_tokens == 100
