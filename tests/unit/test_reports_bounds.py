"""The reports' own logic (admin/reports.py), without a database: what a query may ask (and the 400s
for the rest), the time buckets of a page, the rows' shapes and money, and the page tokens. The
rollup is a stand-in that records the ``Slice`` asked and answers canned rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from werkzeug.datastructures import MultiDict

from ezat_compat.admin.errors import AdminInvalidRequestError
from ezat_compat.admin.pages import decode_cursor, encode_cursor
from ezat_compat.admin.reports import (
    COST,
    USAGE,
    ReportQuery,
    analytics_report,
    legacy_report,
    parse_query,
)
from ezat_compat.store.rollup import Rollup, Slice, Total

NOW = datetime(2027, 3, 10, 15, 42, 7, tzinfo=UTC)
DAY0 = datetime(2027, 3, 1, tzinfo=UTC)
REFRESHED = datetime(2027, 3, 10, 15, 42, 0, tzinfo=UTC)


def total(
    bucket: datetime | None = None,
    *,
    org: int | None = None,
    key: int | None = None,
    model: str | None = None,
    **sums: int,
) -> Total:
    values = {"requests": 1, "input_tokens": 0, "cache_write_tokens": 0, "cache_read_tokens": 0, "output_tokens": 0}
    values |= {"cost_micros": 0, **sums}
    return Total(bucket=bucket, org_id=org, key_id=key, model=model, **values)


@dataclass
class FakeRollup:
    """Answers ``totals`` with ``rows`` (cut by the slice's offset and limit), ids from the maps."""

    rows: list[Total] = field(default_factory=list)
    keys: dict[str, int] = field(default_factory=dict)  # key_… -> id
    orgs: dict[str, int] = field(default_factory=dict)  # wrkspc_… -> id
    asked: list[Slice] = field(default_factory=list)

    def key_ids(self, public_ids: Any) -> tuple[int, ...]:
        return tuple(sorted(self.keys[p] for p in public_ids if p in self.keys))

    def org_ids(self, refs: Any) -> tuple[int, ...]:
        return tuple(sorted(self.orgs[r] for r in refs if r in self.orgs))

    def public_ids(self, org_ids: Any, key_ids: Any) -> tuple[dict[int, str], dict[int, str]]:
        return ({v: k for k, v in self.orgs.items()}, {v: k for k, v in self.keys.items()})

    def totals(self, part: Slice) -> list[Total]:
        self.asked.append(part)
        rows = [r for r in self.rows if r.bucket is None or part.start <= r.bucket < part.end]
        end = None if part.limit is None else part.offset + part.limit
        return rows[part.offset : end]


def legacy(rollup: FakeRollup, query: ReportQuery) -> dict[str, Any]:
    return legacy_report(cast(Rollup, rollup), query, REFRESHED)


def analytics(rollup: FakeRollup, query: ReportQuery) -> dict[str, Any]:
    return analytics_report(cast(Rollup, rollup), query, REFRESHED)


def q(kind: str = USAGE, legacy: bool = False, /, **args: Any) -> ReportQuery:
    return parse_query(MultiDict(args), kind=kind, legacy=legacy, now=NOW)


def refused(message: str, kind: str = USAGE, legacy: bool = False, /, **args: Any) -> None:
    with pytest.raises(AdminInvalidRequestError, match=message):
        q(kind, legacy, **args)


# ---------------------------------------------------------------- the query


def test_a_legacy_report_defaults_to_day_buckets_and_31_days_or_now() -> None:
    query = q(USAGE, True, starting_at="2027-03-01T00:00:00Z")
    assert (query.width, query.limit, query.end) == ("1d", 7, NOW)  # 9 days ago: until now
    query = q(USAGE, True, starting_at="2027-01-01T00:00:00+00:00")
    assert query.end == datetime(2027, 2, 1, tzinfo=UTC)  # starting_at + 31 days
    assert q(USAGE, True, starting_at="2027-03-01T00:00:00Z", bucket_width="1h").limit == 24
    assert q(USAGE, True, starting_at="2027-03-01T00:00:00Z", bucket_width="1m").limit == 60


@pytest.mark.parametrize(("width", "most"), [("1d", 31), ("1h", 168), ("1m", 256)])
def test_a_legacy_page_holds_at_most_its_widths_buckets(width: str, most: int) -> None:
    assert q(USAGE, True, starting_at="2027-03-01T00:00:00Z", bucket_width=width, limit=str(most)).limit == most
    refused(
        f"between 1 and {most}", USAGE, True, starting_at="2027-03-01T00:00:00Z", bucket_width=width, limit=most + 1
    )


def test_the_newer_reports_rank_rows_by_tokens_or_amount_highest_first() -> None:
    usage = q(USAGE, starting_at="2027-03-01T00:00:00Z")
    assert (usage.width, usage.limit, usage.order_by, usage.descending) == (None, 20, "total_tokens", True)
    cost = q(COST, starting_at="2027-03-01T00:00:00Z", order="asc")
    assert (cost.order_by, cost.descending) == ("cost_micros", False)
    assert q(USAGE, starting_at="2027-03-01T00:00:00Z", order_by="uncached_input_tokens").order_by == "input_tokens"
    assert q(COST, starting_at="2027-03-01T00:00:00Z", order_by="list_amount").order_by == "cost_micros"


@pytest.mark.parametrize(
    ("message", "kind", "legacy", "args"),
    [
        ("starting_at: required", USAGE, True, {}),
        ("not an RFC 3339 time", USAGE, False, {"starting_at": "last week"}),
        ("no time zone", USAGE, False, {"starting_at": "2027-03-01T00:00:00"}),
        ("bucket_width: must be one of", USAGE, True, {"starting_at": "2027-03-01T00:00:00Z", "bucket_width": "1w"}),
        (
            "ending_at: required with time_bucket_width",
            COST,
            False,
            {"starting_at": "2027-03-01T00:00:00Z", "time_bucket_width": "1h"},
        ),
        (
            "after starting_at",
            USAGE,
            True,
            {"starting_at": "2027-03-01T00:00:00Z", "ending_at": "2027-03-01T00:00:00Z"},
        ),
        ("at most 31 days", COST, True, {"starting_at": "2027-01-01T00:00:00Z", "ending_at": "2027-02-01T00:00:01Z"}),
        (
            "at most 24 hours",
            USAGE,
            False,
            {"starting_at": "2027-03-01T00:00:00Z", "ending_at": "2027-03-02T00:01:00Z", "time_bucket_width": "1m"},
        ),
        ("doesn't track 'product'", USAGE, True, {"starting_at": "2027-03-01T00:00:00Z", "group_by[]": "product"}),
        ("doesn't track 'cost_type'", COST, True, {"starting_at": "2027-03-01T00:00:00Z", "group_by[]": "cost_type"}),
        (
            "doesn't track 'token_type'",
            COST,
            False,
            {"starting_at": "2027-03-01T00:00:00Z", "group_by[]": "token_type"},
        ),
        ("'colour' is not a dimension", USAGE, False, {"starting_at": "2027-03-01T00:00:00Z", "group_by[]": "colour"}),
        # actor exists in the newer reports only
        ("doesn't track|not a dimension", USAGE, True, {"starting_at": "2027-03-01T00:00:00Z", "group_by[]": "actor"}),
        (
            "speeds\\[\\]: the gateway doesn't track",
            USAGE,
            True,
            {"starting_at": "2027-03-01T00:00:00Z", "speeds[]": "fast"},
        ),
        ("session_ids", COST, False, {"starting_at": "2027-03-01T00:00:00Z", "session_ids[]": "sesn_1"}),
        ("order_by: must be one of", COST, False, {"starting_at": "2027-03-01T00:00:00Z", "order_by": "total_tokens"}),
        ("order: must be asc or desc", USAGE, False, {"starting_at": "2027-03-01T00:00:00Z", "order": "up"}),
        ("between 1 and 1000", USAGE, False, {"starting_at": "2027-03-01T00:00:00Z", "limit": "0"}),
        ("requires group_by", USAGE, False, {"starting_at": "2027-03-01T00:00:00Z", "exclude_deleted_users": "true"}),
    ],
)
def test_what_a_report_refuses(message: str, kind: str, legacy: bool, args: dict[str, Any]) -> None:
    refused(message, kind, legacy, **args)


def test_at_most_five_dimensions() -> None:
    dims = ["model", "api_key_id", "workspace_id", "actor", "actor_type"]
    assert q(starting_at="2027-03-01T00:00:00Z", **{"group_by[]": dims}).group == tuple(dims)
    refused("at most 5", starting_at="2027-03-01T00:00:00Z", **{"group_by[]": [*dims, "product"]})


def test_lists_come_bracketed_or_repeated_and_repeats_count_once() -> None:
    query = q(starting_at="2027-03-01T00:00:00Z", **{"models[]": ["a", "b", "a"], "api_key_ids": ["apikey_1"]})
    assert (query.models, query.api_key_ids) == (("a", "b"), ("apikey_1",))


def test_actors_are_keys() -> None:
    """The gateway's usage is attributed to its keys: ``actor_ids[]`` narrows to the ``apikey_``
    ones (a user's id matches nothing) and ``actor_types[]`` without ``api_actor`` matches nothing."""
    query = q(starting_at="2027-03-01T00:00:00Z", **{"actor_ids[]": ["apikey_1", "user_1"]})
    assert query.api_key_ids == ("apikey_1",)
    query = q(starting_at="2027-03-01T00:00:00Z", **{"actor_ids[]": ["user_1"], "api_key_ids[]": ["apikey_1"]})
    assert query.api_key_ids == ()
    assert not q(starting_at="2027-03-01T00:00:00Z", **{"actor_types[]": "user_actor"}).only_api_actors
    assert q(starting_at="2027-03-01T00:00:00Z", **{"actor_types[]": ["user_actor", "api_actor"]}).only_api_actors


# ---------------------------------------------------------------- legacy reports


def test_a_legacy_page_lists_every_bucket_empty_ones_too() -> None:
    rollup = FakeRollup(rows=[total(DAY0 + timedelta(days=1), input_tokens=5, cost_micros=12_345)])
    query = q(USAGE, True, starting_at="2027-03-01T09:30:00Z", limit="3")
    page = legacy(rollup, query)
    (asked,) = rollup.asked
    assert (asked.width, asked.start, asked.end, asked.group) == ("1d", DAY0, DAY0 + timedelta(days=3), ())
    assert [(b["starting_at"], b["ending_at"], len(b["results"])) for b in page["data"]] == [
        ("2027-03-01T00:00:00Z", "2027-03-02T00:00:00Z", 0),
        ("2027-03-02T00:00:00Z", "2027-03-03T00:00:00Z", 1),
        ("2027-03-03T00:00:00Z", "2027-03-04T00:00:00Z", 0),
    ]
    assert page["has_more"] is True and page["data_refreshed_at"] == "2027-03-10T15:42:00Z"
    result = page["data"][1]["results"][0]
    assert result["uncached_input_tokens"] == 5 and result["model"] is None and result["product"] is None

    second = legacy(rollup, q(USAGE, True, starting_at="2027-03-01T09:30:00Z", limit="3", page=page["next_page"]))
    assert rollup.asked[-1].start == DAY0 + timedelta(days=3)
    assert second["data"][0]["starting_at"] == "2027-03-04T00:00:00Z"
    # 2027-03-01 .. now (the 10th, 15:42): ten buckets, the last one today's
    last = legacy(rollup, q(USAGE, True, starting_at="2027-03-01T09:30:00Z", limit="31"))
    assert len(last["data"]) == 10 and last["has_more"] is False and last["next_page"] is None


def test_a_legacy_cost_result_is_in_fractional_cents() -> None:
    rows = [total(DAY0, cost_micros=1_234_567), total(DAY0 + timedelta(days=1), cost_micros=2_000_000)]
    page = legacy(FakeRollup(rows), q(COST, True, starting_at="2027-03-01T00:00:00Z", limit="2"))
    first, second = (b["results"][0] for b in page["data"])
    assert (first["amount"], first["list_amount"], first["currency"]) == ("123.4567", "123.4567", "USD")
    assert second["amount"] == "200"  # whole cents: no point
    assert (first["cost_type"], first["token_type"], first["requests"]) == (None, None, 1)


def test_a_legacy_bucket_keeps_its_top_100_groups() -> None:
    rows = [total(DAY0, key=k, output_tokens=1000 - k) for k in range(130)]
    rollup = FakeRollup(rows, keys={f"key_{k:012x}": k for k in range(130)})
    page = legacy(
        rollup,
        q(USAGE, True, starting_at="2027-03-01T00:00:00Z", limit="1", **{"group_by[]": "api_key_id"}),
    )
    results = page["data"][0]["results"]
    assert len(results) == 100
    assert results[0]["api_key_id"] == "apikey_000000000000" and results[0]["workspace_id"] is None
    assert rollup.asked[0].then_by == "total_tokens" and rollup.asked[0].group == ("key",)


def test_a_page_token_is_for_its_own_report_only() -> None:
    page = legacy(FakeRollup(), q(USAGE, True, starting_at="2027-03-01T00:00:00Z", limit="1"))
    token = page["next_page"]
    with pytest.raises(AdminInvalidRequestError, match="another report"):
        legacy(FakeRollup(), q(USAGE, True, starting_at="2027-03-02T00:00:00Z", limit="1", page=token))
    held = decode_cursor(token)
    forged = encode_cursor({**held, "bucket": held["bucket"] + 1})  # not a bucket's start
    with pytest.raises(AdminInvalidRequestError, match="another report"):
        legacy(FakeRollup(), q(USAGE, True, starting_at="2027-03-01T00:00:00Z", limit="1", page=forged))
    with pytest.raises(AdminInvalidRequestError, match="page token"):
        legacy(FakeRollup(), q(USAGE, True, starting_at="2027-03-01T00:00:00Z", page="nope"))


# ---------------------------------------------------------------- the newer reports


def test_rows_without_buckets_cover_the_range_rounded_down_to_hours() -> None:
    rollup = FakeRollup(rows=[total(cache_write_tokens=7, input_tokens=1, cache_read_tokens=2, output_tokens=3)])
    page = analytics(rollup, q(starting_at="2027-03-01T09:30:00Z"))
    (asked,) = rollup.asked
    assert (asked.width, asked.by_bucket, asked.start, asked.end) == (
        "1h",
        False,
        DAY0 + timedelta(hours=9),
        NOW.replace(minute=0, second=0),
    )
    (row,) = page["data"]
    assert (row["starting_at"], row["ending_at"]) == ("2027-03-01T09:00:00Z", "2027-03-10T15:00:00Z")
    assert row["usage"] == {
        "uncached_input_tokens": 1,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 7},
        "cache_read_input_tokens": 2,
        "output_tokens": 3,
        "server_tool_use": {"web_search_requests": 0},
        "requests": 1,
        "total_tokens": 13,
    }
    assert set(row["group"]) >= {"api_key_id", "workspace_id", "model", "actor", "product"}
    assert all(value is None for value in row["group"].values())


def test_a_range_shorter_than_an_hour_has_no_row() -> None:
    rollup = FakeRollup(rows=[total()])
    page = analytics(rollup, q(starting_at="2027-03-10T15:05:00Z", ending_at="2027-03-10T15:40:00Z"))
    assert (page["data"], rollup.asked) == ([], [])


def test_rows_page_by_offset_with_one_row_more_asked() -> None:
    rows = [total(DAY0 + timedelta(hours=h), org=1, key=2) for h in range(5)]
    rollup = FakeRollup(rows, keys={"key_00000000abcd": 2}, orgs={"wrkspc_01x": 1})
    args: dict[str, Any] = {
        "starting_at": "2027-03-01T00:00:00Z",
        "ending_at": "2027-03-01T05:00:00Z",
        "time_bucket_width": "1h",
    }
    args |= {"limit": "2", "group_by[]": ["workspace_id", "actor", "actor_type"], "order": "asc"}
    first = analytics(rollup, q(COST, **args))
    asked = rollup.asked[0]
    assert (asked.limit, asked.offset, asked.order_by, asked.descending) == (3, 0, "cost_micros", False)
    assert (asked.start, asked.end, asked.group) == (DAY0, DAY0 + timedelta(hours=5), ("org", "key"))
    assert first["has_more"] is True and len(first["data"]) == 2
    group = first["data"][0]["group"]
    assert group["workspace_id"] == "wrkspc_01x"
    assert group["actor"] == {"type": "api_actor", "api_key_id": "apikey_00000000abcd"}
    assert (group["actor_type"], group["api_key_id"], group["cost_type"], group["token_type"]) == (
        "api_actor",
        None,
        None,
        None,
    )
    assert (first["data"][0]["starting_at"], first["data"][0]["ending_at"]) == (
        "2027-03-01T00:00:00Z",
        "2027-03-01T01:00:00Z",
    )
    second = analytics(rollup, q(COST, **args, page=first["next_page"]))
    assert rollup.asked[1].offset == 2
    third = analytics(rollup, q(COST, **args, page=second["next_page"]))
    assert len(third["data"]) == 1 and third["has_more"] is False and third["next_page"] is None


def _hours(rows: list[Total]) -> list[tuple[datetime | None, int | None]]:
    return [(row.bucket, row.key_id) for row in rows]


@pytest.mark.parametrize("descending", [True, False])
def test_rows_in_time_order_read_only_the_buckets_of_their_page(descending: bool) -> None:
    """Pages of rows in time order, walked with ``next_page``, are every row once, in order; each
    page reads a window of a few buckets from where the last one ended, not the whole range."""
    hours = range(30) if not descending else range(29, -1, -1)
    rows = [total(DAY0 + timedelta(hours=h), org=1, key=k) for h in hours for k in (3, 2, 1)]
    rollup = FakeRollup(rows, keys={f"key_{k:012x}": k for k in (1, 2, 3)}, orgs={"wrkspc_01x": 1})
    args: dict[str, Any] = {
        "starting_at": "2027-03-01T00:00:00Z",
        "ending_at": "2027-03-02T06:00:00Z",
        "time_bucket_width": "1h",
        "group_by[]": "api_key_id",
        "order_by": "time",
        "order": "desc" if descending else "asc",
        "limit": "7",
    }
    seen: list[tuple[datetime | None, int | None]] = []
    page: dict[str, Any] = {"next_page": None}
    while True:
        page = analytics(rollup, q(USAGE, **args, page=page["next_page"]))
        seen += [(datetime.fromisoformat(r["starting_at"]), int(r["group"]["api_key_id"][-1])) for r in page["data"]]
        if not page["has_more"]:
            break
    assert seen == _hours(rows)
    assert len(rollup.asked) == 13  # 90 rows, 7 a page
    assert all(part.end - part.start <= timedelta(hours=8) for part in rollup.asked)
    assert all((part.order_by, part.descending, part.offset) == ("time", descending, 0) for part in rollup.asked)


def test_a_time_window_grows_until_it_holds_the_page() -> None:
    rows = [total(DAY0 + timedelta(hours=h), key=1) for h in (300, 2)]  # two busy hours, days apart
    rollup = FakeRollup(rows, keys={"key_000000000001": 1})
    args = {"starting_at": "2027-03-01T00:00:00Z", "ending_at": "2027-03-14T00:00:00Z", "time_bucket_width": "1h"}
    page = analytics(rollup, q(USAGE, **args, order_by="time", limit="2"))
    assert [r["starting_at"] for r in page["data"]] == ["2027-03-13T12:00:00Z", "2027-03-01T02:00:00Z"]
    assert page["has_more"] is False
    assert [part.end - part.start for part in rollup.asked] == [timedelta(hours=n) for n in (8, 32, 128, 312)]


def test_a_bucketed_range_ends_with_the_bucket_that_holds_its_end() -> None:
    rollup = FakeRollup()
    args = {"starting_at": "2027-03-01T10:10:00Z", "ending_at": "2027-03-03T00:00:01Z", "time_bucket_width": "1d"}
    analytics(rollup, q(**args))
    assert (rollup.asked[0].start, rollup.asked[0].end) == (DAY0, DAY0 + timedelta(days=3))


def test_a_filter_that_matches_nothing_reads_nothing() -> None:
    rollup = FakeRollup(rows=[total()], keys={"key_000000000001": 1})
    page = analytics(rollup, q(starting_at="2027-03-01T00:00:00Z", **{"api_key_ids[]": "apikey_ffffffffffff"}))
    assert (page["data"], rollup.asked) == ([], [])
    analytics(rollup, q(starting_at="2027-03-01T00:00:00Z", **{"api_key_ids[]": "apikey_000000000001"}))
    assert rollup.asked[0].key_ids == (1,)
    page = analytics(rollup, q(starting_at="2027-03-01T00:00:00Z", **{"actor_types[]": "user_actor"}))
    assert page["data"] == []
