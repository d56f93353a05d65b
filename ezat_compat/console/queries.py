"""What the console's pages read: totals and charts from the usage rollup, the ledger's rows a page
at a time, the audit trail, the spend limits' periods, and the gateway's own view of its
deployments. Every change goes through the admin service layer instead (``console/pages.py``).

Reading stays fast on a ledger of millions of rows (bench/console.py):

- charts and totals sum the usage rollup (``store/rollup.py``): a month of days or a day of hours
  is a few thousand rows whatever the ledger holds; the rollup folds what is new first
  (``Rollup.catch_up``), as the admin API's reports do;
- the ledger's rows are read newest first by keyset (``created_at``, ``id``): a page is the next
  ``limit`` rows of an index (``ix_ledger_created``, whose status also answers the count of failed
  requests, or the organisation's or key's own), never an ``OFFSET``; the CSV export reads the
  same way in batches, so memory stays flat;
- a person's or a group's usage is their keys' (a key is one person's for life): the rollup and
  the ledger are filtered by those key ids (``IN``, through ``ix_ledger_key_created``);
- the organisations' and keys' names of a page are looked up by id afterwards (two small reads on
  the same connection), so that no join can make the database read the ledger in another order.

The filters' own parsing and the shaping of rows into charts are pure functions here too, tested
without a database.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, and_, case, func, or_, select

from ezat_compat.console.charts import BAR, COUNT, LINE, USD, Chart, Series, stack_top
from ezat_compat.pricing import micros_to_usd
from ezat_compat.store.accounts import api_key_id
from ezat_compat.store.admin import AuditEntry
from ezat_compat.store.rollup import DAY, HOUR, Rollup, Slice, Total
from ezat_compat.store.spend import SCOPE_GATEWAY, PeriodSpend, SpendLimitInfo, SpendLimits
from ezat_compat.store.tables import api_keys, audit_log, from_epoch_micros, ledger, orgs, to_epoch_micros, users

if TYPE_CHECKING:
    from ezat_compat.domain import Model
    from ezat_compat.server.metrics import Metrics

PAGE_ROWS = 50  # usage rows per page
AUDIT_ROWS = 50
CSV_BATCH = 5_000  # ledger rows per read of the CSV export
MAX_RANGE_DAYS = 400  # the usage page's longest range
DEFAULT_RANGE_DAYS = 7
CHART_DAYS = 30  # the overview's spend chart: this many days up to today
HOURLY_UP_TO_DAYS = 2  # a range this short is charted by the hour, longer ones by the day
NO_MODEL = "(none)"  # the rollup's model of a request that failed before a model was chosen
STATUSES = ("ok", "error")  # the usage filter's status values, besides a three-digit code
METRICS = ("spend", "requests", "tokens")
_TOKENS = ("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens", "reasoning_tokens")


class FilterError(ValueError):
    """A filter of the usage page can't be read; the message says which and how to write it."""


# ---------------------------------------------------------------- time


def day_start(moment: datetime) -> datetime:
    """Midnight UTC of ``moment``'s day (the rollup's days are UTC days)."""
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def month_start(moment: datetime) -> datetime:
    """Midnight UTC of the first day of ``moment``'s month."""
    return day_start(moment).replace(day=1)


def next_hour(moment: datetime) -> datetime:
    """The start of the hour after the one that holds ``moment``."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def bucket_labels(start: datetime, end: datetime, width: str) -> list[tuple[datetime, str]]:
    """Each bucket of ``width`` ("1h" or "1d") from ``start`` to ``end`` (exclusive), with its
    label: ``14:00`` for hours (``07 Dec 14:00`` when the range spans several days), ``07 Dec``
    for days."""
    step = timedelta(microseconds=HOUR if width == "1h" else DAY)
    several_days = end - start > timedelta(days=1)
    found = []
    at = start
    while at < end:
        if width == "1h":
            label = at.strftime("%d %b %H:00") if several_days else at.strftime("%H:00")
        else:
            label = at.strftime("%d %b")
        found.append((at, label))
        at += step
    return found


# ---------------------------------------------------------------- sums and charts (pure)


@dataclass(frozen=True, slots=True)
class Sums:
    """Requests, tokens and cost (micro-USD) of some rollup rows."""

    requests: int = 0
    tokens: int = 0
    cost_micros: int = 0

    def __add__(self, other: Sums) -> Sums:
        return Sums(self.requests + other.requests, self.tokens + other.tokens, self.cost_micros + other.cost_micros)

    @classmethod
    def of(cls, total: Total) -> Sums:
        return cls(total.requests, total.total_tokens, total.cost_micros)


def metric_of(total: Total, metric: str) -> int:
    """``spend`` (micro-USD), ``requests`` or ``tokens`` of a rollup row."""
    if metric == "spend":
        return total.cost_micros
    if metric == "requests":
        return total.requests
    return total.total_tokens


def sums_by(rows: Iterable[Total], name_of: Mapping[int, str] | None, dimension: str) -> list[tuple[str, Sums]]:
    """The rows summed per organisation (``dimension`` "org", named by ``name_of``) or per model
    ("model"), largest spend first (then most requests, then by name)."""
    found: dict[str, list[int]] = {}
    for row in rows:
        name = _name(row, dimension, name_of)
        sums = found.get(name)
        if sums is None:
            sums = found[name] = [0, 0, 0]
        sums[0] += row.requests
        sums[1] += row.input_tokens + row.cache_write_tokens + row.cache_read_tokens + row.output_tokens
        sums[2] += row.cost_micros
    ranked = sorted(found.items(), key=lambda item: (-item[1][2], -item[1][0], item[0]))
    return [(name, Sums(*values)) for name, values in ranked]


def _name(row: Total, dimension: str, name_of: Mapping[int, str] | None) -> str:
    if dimension == "org":
        return (name_of or {}).get(int(row.org_id or 0), f"org {row.org_id}")
    if dimension == "key":
        return (name_of or {}).get(int(row.key_id or 0), f"key {row.key_id}")
    return row.model or NO_MODEL


def chart_of(
    rows: Iterable[Total],
    buckets: Sequence[tuple[datetime, str]],
    *,
    chart_id: str,
    title: str,
    metric: str,
    dimension: str,
    name_of: Mapping[int, str] | None = None,
    keep: int = 5,
    kind: str = BAR,
) -> Chart:
    """A chart of rollup rows (by bucket and ``dimension``) over ``buckets``: the ``keep`` largest
    series of ``metric`` and "Other"; rows outside the buckets are left out."""
    index = {at: i for i, (at, _label) in enumerate(buckets)}
    named: dict[str, list[int]] = {}
    for row in rows:
        at = index.get(row.bucket) if row.bucket is not None else None
        if at is None:
            continue
        values = named.setdefault(_name(row, dimension, name_of), [0] * len(buckets))
        values[at] += metric_of(row, metric)
    series = stack_top(named, keep) if named else (Series("Nothing yet", tuple(0 for _ in buckets)),)
    unit = USD if metric == "spend" else COUNT
    return Chart(chart_id, title, tuple(label for _at, label in buckets), series, unit, kind)


# ---------------------------------------------------------------- names


def org_names(engine: Engine, ids: Iterable[int] | None = None) -> dict[int, str]:
    """Organisations' names by row id (all of them, or those of ``ids``)."""
    with engine.connect() as conn:
        return _org_names_on(conn, ids)


def _org_names_on(conn: Connection, ids: Iterable[int] | None) -> dict[int, str]:
    query = select(orgs.c.id, orgs.c.name)
    if ids is not None:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        query = query.where(orgs.c.id.in_(wanted))
    return {int(r.id): str(r.name) for r in conn.execute(query)}


def _key_names_on(conn: Connection, ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """Keys' public ids (``key_…``) and names by row id."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    query = select(api_keys.c.id, api_keys.c.public_id, api_keys.c.name).where(api_keys.c.id.in_(wanted))
    return {int(r.id): (str(r.public_id), str(r.name or "")) for r in conn.execute(query)}


def key_row_id(engine: Engine, public_id: str) -> tuple[int, int] | None:
    """A key's row id and its organisation's, from its public id (``key_…``); None if unknown."""
    query = select(api_keys.c.id, api_keys.c.org_id).where(api_keys.c.public_id == public_id)
    with engine.connect() as conn:
        row = conn.execute(query).first()
    return None if row is None else (int(row.id), int(row.org_id))


def people_key_orgs(engine: Engine, user_ids: Iterable[int]) -> dict[int, int]:
    """Key row id -> its organisation's, for every key of these people (revoked ones too: they
    spent)."""
    wanted = sorted(set(user_ids))
    if not wanted:
        return {}
    query = select(api_keys.c.id, api_keys.c.org_id).where(api_keys.c.user_id.in_(wanted))
    with engine.connect() as conn:
        return {int(r.id): int(r.org_id) for r in conn.execute(query)}


def group_members(engine: Engine, group_id: int) -> list[int]:
    """The row ids of the people now in the mapped group ``group_id`` (``users.group_ids``)."""
    with engine.connect() as conn:
        rows = conn.execute(select(users.c.id, users.c.group_ids)).all()
    return [int(r.id) for r in rows if str(group_id) in str(r.group_ids or "").split(",")]


# ---------------------------------------------------------------- the overview


@dataclass(frozen=True, slots=True)
class Overview:
    """The overview's numbers: today (UTC) and this month, in all and by organisation and by
    model; the charts; the failed requests of today (status 4xx and 5xx, from the ledger)."""

    now: datetime
    period_start: datetime
    today: Sums
    period: Sums
    by_org: list[tuple[str, Sums, Sums]]  # name, today, this month
    by_model: list[tuple[str, Sums, Sums]]
    spend_chart: Chart
    requests_chart: Chart
    errors_4xx: int
    errors_5xx: int
    refreshed_at: datetime | None


def _merge(today: list[tuple[str, Sums]], period: list[tuple[str, Sums]]) -> list[tuple[str, Sums, Sums]]:
    of_today = dict(today)
    return [(name, of_today.get(name, Sums()), sums) for name, sums in period]


def overview(engine: Engine, rollup: Rollup, now: datetime, org_ids: tuple[int, ...] | None) -> Overview:
    """The overview for the organisations ``org_ids`` (None: every one): three reads of the
    rollup (the last ``CHART_DAYS`` days and this month by day and organisation, this month by
    model, today by hour, organisation and model) and one of today's ledger rows' statuses."""
    rollup.catch_up()
    start_today, start_month = day_start(now), month_start(now)
    tomorrow = start_today + timedelta(days=1)
    chart_start = start_today - timedelta(days=CHART_DAYS - 1)
    first = min(chart_start, start_month)
    # Three narrow reads rather than one wide one: every row read is one the page shows.
    days = rollup.totals(Slice("1d", first, tomorrow, group=("org",), org_ids=org_ids))
    month_models = rollup.totals(Slice("1d", start_month, tomorrow, by_bucket=False, group=("model",), org_ids=org_ids))
    hours = rollup.totals(Slice("1h", start_today, next_hour(now), group=("org", "model"), org_ids=org_ids))
    names = org_names(engine, {int(r.org_id or 0) for r in days} | {int(r.org_id or 0) for r in hours})
    month = [r for r in days if r.bucket is not None and r.bucket >= start_month]
    today_by_org, month_by_org = sums_by(hours, names, "org"), sums_by(month, names, "org")
    today_by_model, month_by_model = sums_by(hours, None, "model"), sums_by(month_models, None, "model")
    spend_chart = chart_of(
        days,
        bucket_labels(chart_start, tomorrow, "1d"),
        chart_id="spend-chart",
        title=f"Spend per day over the last {CHART_DAYS} days (UTC) by organisation",
        metric="spend",
        dimension="org",
        name_of=names,
    )
    requests_chart = chart_of(
        hours,
        bucket_labels(start_today, start_today + timedelta(days=1), "1h"),
        chart_id="requests-chart",
        title="Requests per hour today (UTC) by model",
        metric="requests",
        dimension="model",
    )
    errors_4xx, errors_5xx = failed_requests(engine, start_today, tomorrow, org_ids)
    return Overview(
        now=now,
        period_start=start_month,
        today=sum((s for _n, s in today_by_org), Sums()),
        period=sum((s for _n, s in month_by_org), Sums()),
        by_org=_merge(today_by_org, month_by_org),
        by_model=_merge(today_by_model, month_by_model),
        spend_chart=spend_chart,
        requests_chart=requests_chart,
        errors_4xx=errors_4xx,
        errors_5xx=errors_5xx,
        refreshed_at=rollup.refreshed_at(),
    )


def month_spend_by_org(rollup: Rollup, now: datetime, org_ids: tuple[int, ...]) -> dict[int, Sums]:
    """This month's sums (UTC) of each of ``org_ids``: one read of the rollup, no buckets."""
    if not org_ids:
        return {}
    rollup.catch_up()
    start = month_start(now)
    rows = rollup.totals(
        Slice("1d", start, day_start(now) + timedelta(days=1), by_bucket=False, group=("org",), org_ids=org_ids)
    )
    return {int(r.org_id or 0): Sums.of(r) for r in rows}


def month_spend_by_person(rollup: Rollup, engine: Engine, now: datetime) -> dict[int, int]:
    """This month's spend (UTC, micro-USD) of each person, by their row id: their keys' days in
    the rollup (a key is one person's for life)."""
    from ezat_compat.store.people_queries import spend_since

    rollup.catch_up()
    return spend_since(engine, month_start(now))


def month_spend_by_group(
    groups: Iterable[int], members: Mapping[int, Iterable[int]], spend: Mapping[int, int]
) -> dict[int, int]:
    """This month's spend (micro-USD) of each group of ``groups``: the sum of its current members'
    (``members``: person row id -> their mapped groups' row ids; ``spend``: what
    ``month_spend_by_person`` read)."""
    found = dict.fromkeys(groups, 0)
    for user_id, group_ids in members.items():
        for group_id in set(group_ids):
            if group_id in found:
                found[group_id] += spend.get(user_id, 0)
    return found


def failed_requests(engine: Engine, start: datetime, end: datetime, org_ids: tuple[int, ...] | None) -> tuple[int, int]:
    """How many ledger rows from ``start`` to ``end`` have a 4xx and a 5xx status (read through
    ``ix_ledger_created``, or the organisation's index)."""
    query = select(
        func.coalesce(func.sum(case((and_(ledger.c.status >= 400, ledger.c.status < 500), 1), else_=0)), 0),
        func.coalesce(func.sum(case((ledger.c.status >= 500, 1), else_=0)), 0),
    ).where(ledger.c.created_at >= start, ledger.c.created_at < end)
    if org_ids is not None:
        query = query.where(ledger.c.org_id.in_(org_ids))
    with engine.connect() as conn:
        four, five = conn.execute(query).one()
    return int(four or 0), int(five or 0)


# ---------------------------------------------------------------- usage: the filter


@dataclass(frozen=True, slots=True)
class UsageFilter:
    """The usage page's filter, resolved: organisations' and a key's row ids (None: any), the
    keys of a person or a group (``key_ids``: None for any, empty for none), a canonical model, a
    status (``ok``: 2xx, ``error``: anything else, or a code), the range ``[start, end)`` (whole
    UTC days), and the chart's metric."""

    start: datetime
    end: datetime
    org_ids: tuple[int, ...] | None = None
    key_id: int | None = None
    model: str | None = None
    status: str | None = None
    metric: str = "spend"
    key_ids: tuple[int, ...] | None = None

    @property
    def keys(self) -> tuple[int, ...] | None:
        """The key row ids the filter keeps (the key's, within the person's or group's when both
        are given), sorted; None for any key."""
        if self.key_ids is None:
            return None if self.key_id is None else (self.key_id,)
        if self.key_id is not None:
            return (self.key_id,) if self.key_id in self.key_ids else ()
        return tuple(sorted(set(self.key_ids)))

    @property
    def width(self) -> str:
        """The chart's buckets: hours for a range of up to two days, else days."""
        return "1h" if self.end - self.start <= timedelta(days=HOURLY_UP_TO_DAYS) else "1d"


def parse_day(text: str, name: str) -> date:
    """A ``YYYY-MM-DD`` date; ``FilterError`` naming ``name`` for anything else."""
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise FilterError(f"{name}: {text!r} is not a date; write it like 2026-12-31") from None


def parse_range(given_from: str, given_to: str, now: datetime) -> tuple[datetime, datetime]:
    """The range of ``from`` and ``to`` (dates, both included; defaults: the last
    ``DEFAULT_RANGE_DAYS`` days up to today) as ``[start, end)`` at UTC midnights."""
    today = day_start(now).date()
    last = parse_day(given_to, "to") if given_to else today
    first = parse_day(given_from, "from") if given_from else last - timedelta(days=DEFAULT_RANGE_DAYS - 1)
    if first > last:
        raise FilterError("from: must be on or before to")
    if (last - first).days + 1 > MAX_RANGE_DAYS:
        raise FilterError(f"from: the range may span at most {MAX_RANGE_DAYS} days")
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    return start, end


def parse_status(text: str) -> str | None:
    """``""`` (any), ``ok``, ``error`` or a three-digit status code."""
    text = text.strip().lower()
    if not text:
        return None
    if text in STATUSES or (len(text) == 3 and text.isdigit() and text[0] in "12345"):
        return text
    raise FilterError(f"status: {text!r} is not ok, error or a status code like 429")


def parse_metric(text: str) -> str:
    text = text.strip().lower() or "spend"
    if text not in METRICS:
        raise FilterError(f"metric: must be one of {', '.join(METRICS)}")
    return text


def _status_condition(status: str) -> Any:
    if status == "ok":
        return and_(ledger.c.status >= 200, ledger.c.status < 300)
    if status == "error":
        return or_(ledger.c.status < 200, ledger.c.status >= 300)
    return ledger.c.status == int(status)


def _ledger_conditions(flt: UsageFilter) -> list[Any]:
    conditions: list[Any] = [ledger.c.created_at >= flt.start, ledger.c.created_at < flt.end]
    keys = flt.keys
    if flt.org_ids is not None and keys is not None:
        # Keys narrow more than organisations: read the keys' index, keep the organisations' rows.
        conditions.append((ledger.c.org_id + 0).in_(flt.org_ids))
    elif flt.org_ids is not None and len(flt.org_ids) == 1:
        conditions.append(ledger.c.org_id == flt.org_ids[0])  # read through the organisation's index
    elif flt.org_ids is not None:
        # Several organisations: read by time (ix_ledger_created) and keep theirs, rather than merge
        # their indexes' rows into one order (a sort of every row in the range).
        conditions.append((ledger.c.org_id + 0).in_(flt.org_ids))
    if keys is not None and len(keys) == 1:
        conditions.append(ledger.c.key_id == keys[0])
    elif keys is not None:
        # A person's or a group's keys: each key's rows through ix_ledger_key_created.
        conditions.append(ledger.c.key_id.in_(keys))
    if flt.model is not None:
        conditions.append(ledger.c.canonical_model == flt.model)
    if flt.status is not None:
        conditions.append(_status_condition(flt.status))
    return conditions


# ---------------------------------------------------------------- usage: the rows


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One ledger row as the usage page and its CSV show it."""

    id: int
    request_id: str
    created_at: datetime
    org: str
    key_id: str
    key_name: str
    endpoint: str
    model: str
    canonical_model: str
    deployment: str
    input_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cost_micros: int
    status: int
    estimated: bool

    @property
    def cursor(self) -> str:
        """Where the page after this row starts (``Cursor.parse`` reads it)."""
        return f"{to_epoch_micros(self.created_at)}.{self.id}"


def parse_cursor(text: str) -> tuple[int, int] | None:
    """A page cursor ``<created_at micros>.<id>``; None for "" or anything malformed (the first
    page)."""
    at, _, row = text.partition(".")
    if not (at.isdigit() and row.isdigit()) or len(at) > 20 or len(row) > 20:
        return None
    return int(at), int(row)


_LEDGER_COLUMNS = (
    ledger.c.id,
    ledger.c.request_id,
    ledger.c.created_at,
    ledger.c.org_id,
    ledger.c.key_id,
    ledger.c.endpoint,
    ledger.c.model,
    ledger.c.canonical_model,
    ledger.c.deployment,
    *(ledger.c[name] for name in _TOKENS),
    ledger.c.cost_micros,
    ledger.c.status,
    ledger.c.estimated,
)


def _rows_query(flt: UsageFilter, after: tuple[int, int] | None, limit: int) -> Any:
    conditions = _ledger_conditions(flt)
    if after is not None:
        at = from_epoch_micros(after[0])
        conditions += [ledger.c.created_at <= at, or_(ledger.c.created_at < at, ledger.c.id < after[1])]
    return (
        select(*_LEDGER_COLUMNS)
        .where(and_(*conditions))
        .order_by(ledger.c.created_at.desc(), ledger.c.id.desc())
        .limit(limit)
    )


def _named(conn: Connection, rows: Sequence[Any]) -> list[UsageRow]:
    orgs_by_id = _org_names_on(conn, {int(r.org_id) for r in rows})
    keys_by_id = _key_names_on(conn, {int(r.key_id) for r in rows})
    found = []
    for r in rows:
        key_public, key_name = keys_by_id.get(int(r.key_id), (f"key {r.key_id}", ""))
        found.append(
            UsageRow(
                id=int(r.id),
                request_id=r.request_id,
                created_at=r.created_at,
                org=orgs_by_id.get(int(r.org_id), f"org {r.org_id}"),
                key_id=key_public,
                key_name=key_name,
                endpoint=r.endpoint,
                model=r.model,
                canonical_model=r.canonical_model,
                deployment=r.deployment,
                **{name: int(r._mapping[name]) for name in _TOKENS},
                cost_micros=int(r.cost_micros),
                status=int(r.status),
                estimated=bool(r.estimated),
            )
        )
    return found


def usage_page(
    engine: Engine, flt: UsageFilter, after: tuple[int, int] | None, limit: int = PAGE_ROWS
) -> tuple[list[UsageRow], str | None]:
    """A page of the filtered ledger rows, newest first, after the cursor ``after``; and the
    cursor of the next page (None on the last)."""
    if flt.keys == ():
        return [], None
    with engine.connect() as conn:
        raw = conn.execute(_rows_query(flt, after, limit + 1)).all()
        rows = _named(conn, raw[:limit])
    return rows, (rows[-1].cursor if len(raw) > limit and rows else None)


def usage_batches(engine: Engine, flt: UsageFilter, batch: int = CSV_BATCH) -> Iterator[list[UsageRow]]:
    """Every filtered ledger row, newest first, in batches of ``batch`` (each its own read, so a
    long export holds no transaction open)."""
    after: tuple[int, int] | None = None
    if flt.keys == ():
        return
    while True:
        with engine.connect() as conn:
            raw = conn.execute(_rows_query(flt, after, batch)).all()
            rows = _named(conn, raw)
        if not raw:
            return
        yield rows
        if len(raw) < batch:
            return
        after = (to_epoch_micros(rows[-1].created_at), rows[-1].id)


CSV_COLUMNS = (
    "request_id",
    "created_at",
    "org",
    "key_id",
    "key_name",
    "endpoint",
    "model",
    "canonical_model",
    "deployment",
    *_TOKENS,
    "cost_usd",
    "status",
    "estimated",
)


def csv_cell(value: object) -> str:
    """A value for a spreadsheet: text that a spreadsheet would run as a formula (starting with
    ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) gets a leading ``'``."""
    text = "" if value is None else str(value)
    if text and text[0] in "=+-@\t\r":
        return "'" + text
    return text


def csv_values(row: UsageRow) -> list[str]:
    """A row's cells in ``CSV_COLUMNS`` order (times ISO 8601 UTC, dollars with 6 decimals)."""
    values: list[object] = [
        row.request_id,
        row.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        row.org,
        row.key_id,
        row.key_name,
        row.endpoint,
        row.model,
        row.canonical_model,
        row.deployment,
        row.input_tokens,
        row.cache_write_tokens,
        row.cache_read_tokens,
        row.output_tokens,
        row.reasoning_tokens,
        micros_to_usd(row.cost_micros),
        row.status,
        "true" if row.estimated else "false",
    ]
    return [csv_cell(v) for v in values]


# ---------------------------------------------------------------- usage: the chart and totals


@dataclass(frozen=True, slots=True)
class UsageSummary:
    """The usage page's chart and the range's totals (from the rollup: every status)."""

    chart: Chart
    totals: Sums
    by_model: list[tuple[str, Sums]]


def usage_summary(rollup: Rollup, flt: UsageFilter) -> UsageSummary:
    """The chart of ``flt``'s range by model, in ``flt.metric``, and its totals: one read of the
    rollup (its status filter doesn't apply: the rollup counts every status)."""
    rollup.catch_up()
    rows = rollup.totals(
        Slice(
            flt.width,
            flt.start,
            flt.end,
            group=("model",),
            org_ids=flt.org_ids,
            key_ids=flt.keys,
            models=None if flt.model is None else (flt.model,),
        )
    )
    word = {"spend": "Spend", "requests": "Requests", "tokens": "Tokens"}[flt.metric]
    per = "hour" if flt.width == "1h" else "day"
    chart = chart_of(
        rows,
        bucket_labels(flt.start, flt.end, flt.width),
        chart_id="usage-chart",
        title=f"{word} per {per} by model, {flt.start:%d %b %Y} to {(flt.end - timedelta(days=1)):%d %b %Y} (UTC)",
        metric=flt.metric,
        dimension="model",
        kind=LINE if flt.width == "1h" and len(rows) > 0 and flt.metric != "spend" else BAR,
    )
    by_model = sums_by(rows, None, "model")
    return UsageSummary(chart, sum((s for _n, s in by_model), Sums()), by_model)


# ---------------------------------------------------------------- spend limits


@dataclass(frozen=True, slots=True)
class LimitRow:
    """A spend limit and its current period: what was spent and held, and how close that is to
    the cap (``used``: spent + held over the amount, None without an amount)."""

    limit: SpendLimitInfo
    spend: PeriodSpend
    thresholds: tuple[int, ...]

    @property
    def used(self) -> float | None:
        amount = self.limit.amount_micros
        if amount is None:
            return None
        if amount == 0:
            return 1.0 if self.spend.spent_micros + self.spend.reserved_micros else 0.0
        return (self.spend.spent_micros + self.spend.reserved_micros) / amount

    @property
    def percent(self) -> int | None:
        used = self.used
        return None if used is None else round(used * 100)

    @property
    def level(self) -> str:
        """``ok``, ``warn`` (past the lowest threshold) or ``over`` (at or past the highest, or
        100 %) for the page's colours."""
        percent = self.percent
        if percent is None:
            return "ok"
        if percent >= min(100, max(self.thresholds, default=100)):
            return "over"
        if self.thresholds and percent >= min(self.thresholds):
            return "warn"
        return "ok"


def limit_rows(
    spend: SpendLimits, now: datetime, org_ids: tuple[int, ...] | None, default_thresholds: Sequence[int]
) -> list[LimitRow]:
    """Every spend limit the viewer may see (``org_ids`` None: all; else those of the
    organisations and of their keys, not the gateway's), with its current period, in scope order."""
    limits = spend.list_limits()
    if org_ids is not None:
        limits = [s for s in limits if s.scope_type != SCOPE_GATEWAY and s.org_id in org_ids]
    periods = spend.current(limits, now)
    return [LimitRow(s, periods[s.id], tuple(s.thresholds or default_thresholds)) for s in limits]


# ---------------------------------------------------------------- the audit trail


def audit_page(
    engine: Engine, target_ids: Sequence[str] | None, before_id: int | None, limit: int = AUDIT_ROWS
) -> tuple[list[AuditEntry], int | None]:
    """The audit trail newest first (on the targets ``target_ids`` only when given), below
    ``before_id``; and the id the next page starts below (None on the last)."""
    query = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit + 1)
    if target_ids is not None:
        if not target_ids:
            return [], None
        query = query.where(audit_log.c.target_id.in_(sorted(set(target_ids))))
    if before_id is not None:
        query = query.where(audit_log.c.id < before_id)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    entries = [
        AuditEntry(
            id=int(r.id),
            at=r.at,
            actor=r.actor,
            action=r.action,
            target_type=r.target_type,
            target_id=r.target_id,
            before=None if r.before is None else json.loads(r.before),
            after=None if r.after is None else json.loads(r.after),
            address=r.address,
            request_id=r.request_id,
        )
        for r in rows[:limit]
    ]
    return entries, (entries[-1].id if len(rows) > limit and entries else None)


def org_targets(engine: Engine, spend: SpendLimits, org_ids: Sequence[int]) -> list[str]:
    """The audit trail's target ids that belong to the organisations ``org_ids``: their
    workspace ids, their keys' (``apikey_…``) and the spend limits on them or their keys."""
    wanted = sorted(set(org_ids))
    if not wanted:
        return []
    with engine.connect() as conn:
        workspaces = [str(r[0]) for r in conn.execute(select(orgs.c.public_id).where(orgs.c.id.in_(wanted))) if r[0]]
        keys = [
            api_key_id(str(r[0]))
            for r in conn.execute(select(api_keys.c.public_id).where(api_keys.c.org_id.in_(wanted)))
        ]
    limits = [s.public_id for s in spend.list_limits() if s.scope_type != SCOPE_GATEWAY and s.org_id in wanted]
    return workspaces + keys + limits


def changes(before: Any, after: Any) -> list[str]:
    """What an audit row changed, for people: ``created``/``deleted``, or one ``field: old → new``
    per top-level field that differs (nested values as compact JSON)."""
    if before is None and after is None:
        return []
    if before is None:
        return ["created"]
    if after is None:
        return ["deleted"]
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return [f"{_compact(before)} → {_compact(after)}"] if before != after else []
    found = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old != new:
            found.append(f"{name}: {_compact(old)} → {_compact(new)}")
    return found


def _compact(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------- the gateway's own view


@dataclass(frozen=True, slots=True)
class Signals:
    """What this process's metrics say since it started (every worker's under gunicorn):
    inference answers by status class, failovers (by model, deployment and reason), and the
    gateway-side latency's median and 95th percentile (from the histogram's buckets)."""

    answers: int = 0
    client_errors: int = 0
    server_errors: int = 0
    failovers: int = 0
    failovers_by: tuple[tuple[str, str, str, int], ...] = ()
    p50_s: float | None = None
    p95_s: float | None = None
    by_deployment: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # answers, 5xx


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram (``(upper bound, count up to it)`` sorted by
    bound, ``+Inf`` last), interpolated linearly within its bucket as Prometheus'
    ``histogram_quantile`` does; None when it counted nothing."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def signals_of(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> Signals:
    """``Signals`` from metric samples ``(name, labels, value)`` (what a Prometheus registry's
    ``collect`` yields). Only inference answers count: those with a model (``-`` is a request
    no model applies to: the console's, the admin API's, probes)."""
    answers = client = server = 0
    failovers: dict[tuple[str, str, str], int] = defaultdict(int)
    latency: dict[float, float] = defaultdict(float)
    per_deployment: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for name, labels, value in samples:
        if name == "ezat_requests_total" and labels.get("model", "-") != "-":
            count = int(value)
            answers += count
            status = str(labels.get("status", ""))
            if status.startswith("4"):
                client += count
            elif status.startswith("5"):
                server += count
            deployment = labels.get("deployment", "-")
            if deployment not in ("", "-"):
                pair = per_deployment[(labels["model"], deployment)]
                pair[0] += count
                pair[1] += count if status.startswith("5") else 0
        elif name == "ezat_failovers_total":
            failovers[(labels.get("model", ""), labels.get("deployment", ""), labels.get("reason", ""))] += int(value)
        elif name == "gen_ai_server_request_duration_seconds_bucket" and not str(labels.get("route", "")).startswith(
            ("console", "admin", "spend_limits")
        ):
            latency[float(labels.get("le", "inf"))] += value
    buckets = sorted(latency.items())
    return Signals(
        answers=answers,
        client_errors=client,
        server_errors=server,
        failovers=sum(failovers.values()),
        failovers_by=tuple(sorted(((*k, v) for k, v in failovers.items() if v), key=lambda r: (-r[3], r[:3]))),
        p50_s=quantile(buckets, 0.5),
        p95_s=quantile(buckets, 0.95),
        by_deployment={k: (v[0], v[1]) for k, v in per_deployment.items()},
    )


def read_signals(metrics: Metrics | None) -> Signals:
    """``Signals`` of the process's metrics (summed over every worker's files in gunicorn's
    multiprocess mode); empty ones when there are none."""
    if metrics is None:
        return Signals()
    if metrics.multiprocess:
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = metrics.registry
    return signals_of((s.name, s.labels, s.value) for family in registry.collect() for s in family.samples)


@dataclass(frozen=True, slots=True)
class DeploymentState:
    """One deployment as the gateway sees it now: ``state`` is ``healthy``, ``cooling`` (refused
    for ``wait_s`` more seconds, or until a probe answers) or ``no key`` (its key's variable is
    unset: routing skips it)."""

    model: str
    name: str
    provider: str
    host: str
    priority: int
    weight: float
    state: str
    wait_s: float
    answers: int
    server_errors: int
    failovers: int


def deployment_states(
    models: Sequence[Model],
    cooling: Iterable[str],
    wait_s: Mapping[str, float],
    signals: Signals,
    environ: Mapping[str, str] | None = None,
) -> list[DeploymentState]:
    """Each configured deployment, in the configuration's order, with its state (``cooling``:
    the cooldown store's names ``model/deployment``), what its cooldown has left, and this
    process's counts of it."""
    env = os.environ if environ is None else environ
    cooling_now = set(cooling)
    failovers: dict[tuple[str, str], int] = defaultdict(int)
    for model_id, deployment, _reason, count in signals.failovers_by:
        failovers[(model_id, deployment)] += count
    found = []
    for model in models:
        for d in model.deployments:
            key = f"{model.id}/{d.name}"
            if key in cooling_now:
                state = "cooling"
            elif d.needs_key and not d.api_key and not env.get(d.api_key_env):
                state = "no key"
            else:
                state = "healthy"
            answers, errors = signals.by_deployment.get((model.id, d.name), (0, 0))
            found.append(
                DeploymentState(
                    model=model.id,
                    name=d.name,
                    provider=d.provider,
                    host=_host(d.base_url),
                    priority=d.priority,
                    weight=d.weight,
                    state=state,
                    wait_s=round(wait_s.get(key, 0.0), 1),
                    answers=answers,
                    server_errors=errors,
                    failovers=failovers[(model.id, d.name)],
                )
            )
    return found


def _host(url: str) -> str:
    """A base URL without its path, query or credentials (what the page may show of it)."""
    rest = url.split("://", 1)[-1]
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    return host or url
