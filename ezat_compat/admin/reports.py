"""Usage and cost reports in the wire shapes of Anthropic's Admin API (the ``anthropic`` SDK's
``client.beta.organization.analytics``), read from the usage rollup (``store/rollup.py``).

    GET /v1/organizations/analytics/usage_report   legacy: time buckets, each with its results
    GET /v1/organizations/analytics/cost_report    legacy: the same, in money
    GET /v1/organizations/analytics/usage          rows per (time bucket?, group), ranked
    GET /v1/organizations/analytics/cost           the same, in money

Every page is ``SyncReportPageCursor``'s: ``{"data", "has_more", "next_page", "data_refreshed_at"}``.
Before reading, a report folds the ledger rows settled since the rollup's last fold (at most
``store/rollup.py`` ``REPORT_FOLD_MAX``), so its sums are those of ``ezat-compat usage --json``
for the same rows: tokens exactly, money in US cents with up to four decimals (one micro-dollar is
a ten-thousandth of a cent); ``data_refreshed_at`` is the time up to which the rollup holds every
settled request (the report's own time when its fold reached the ledger's end).

What maps (docs/admin-api.md, "Usage and cost reports"):

- ``workspace_id`` is the organisation's workspace id (``wrkspc_…``), ``api_key_id`` the key's
  (``apikey_…``), ``model`` the canonical model that served the request (null for a request that
  failed before a model was chosen). ``actor`` is the person a key belongs to (``user_actor``:
  a person's keys are theirs for life, ``api_keys.user_id``), else the key (``api_actor``);
  ``rbac_group_id`` the person's groups as they are now (``users.group_ids``: a person in two
  groups counts in both; a key of nobody, or of a person in none, in a null group). The legacy
  reports take ``api_key_id`` and ``workspace_id`` too (an extension). People are resolved from
  the rollup's keys (``_people_rows``), so grouping by them sums the range in the process.
- ``requests`` counts every request the gateway admitted (failed ones too, at no cost), as
  ``ezat-compat usage`` does. ``uncached_input_tokens``, ``cache_read_input_tokens`` and
  ``output_tokens`` (thinking included) are Anthropic's; every cache write is counted as
  ``cache_creation.ephemeral_5m_input_tokens`` (the ledger doesn't keep 5-minute and 1-hour
  writes apart: ``ephemeral_1h_input_tokens`` is 0), and ``server_tool_use.web_search_requests`` is
  0 (the ledger keeps the searches' cost, not their count).
- ``amount`` and ``list_amount`` are equal (the gateway has no discounts), currency ``USD``.
- Buckets are UTC minutes, hours and days; a range starts at the start of the bucket that holds
  ``starting_at``. A dimension or filter the gateway doesn't track (product, speed, cost type…) is
  refused with a 400 naming the ones it has, never answered with rows that would mislead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Response, current_app, request
from flask_smorest import Blueprint
from marshmallow import EXCLUDE, Schema, fields

from ezat_compat.admin.auth import admin_context
from ezat_compat.admin.errors import AdminInvalidRequestError
from ezat_compat.admin.money import micros_to_cents
from ezat_compat.admin.pages import decode_cursor, encode_cursor, parse_limit, parse_list, parse_time, rfc3339
from ezat_compat.jsonfast import encode_json
from ezat_compat.store.accounts import api_key_id, key_public_id
from ezat_compat.store.people_queries import KeyOwner, all_key_ids, find_group_ids, group_public_ids, key_owners
from ezat_compat.store.rollup import HOUR, WIDTHS, Rollup, Slice, Total, floor_to
from ezat_compat.store.store import Store
from ezat_compat.store.tables import from_epoch_micros, to_epoch_micros

blp = Blueprint(
    "admin_reports",
    __name__,
    url_prefix="/v1/organizations",
    description="Usage and cost reports over the gateway's ledger, in time buckets (1m, 1h, 1d).",
)

USAGE, COST = "usage", "cost"
CURRENCY = "USD"
RANGE_MAX = timedelta(days=31)  # Admin API: "The range may span at most 31 days"
MINUTES_RANGE_MAX = timedelta(hours=24)  # the newer reports with 1-minute buckets
LEGACY_LIMITS = {"1d": (7, 31), "1h": (24, 168), "1m": (60, 256)}  # buckets per page: default, most
LEGACY_WIDTH = "1d"
TOP_GROUPS = 100  # the legacy reports' results per bucket (no remainder row)
MAX_GROUP_BY = 5
API_ACTOR = "api_actor"

# What a report may group by -> the rollup's dimension ("" for actor_type: always api_actor).
LEGACY_GROUPS = {"model": "model", "api_key_id": "key", "workspace_id": "org", "rbac_group_id": "key"}
GROUPS = {**LEGACY_GROUPS, "actor": "key", "actor_type": ""}
USER_ACTOR = "user_actor"
PEOPLE_GROUPS = ("actor", "actor_type", "rbac_group_id")  # resolved through the keys' people
# Dimensions of Anthropic's reports the gateway doesn't track: refused, by name.
UNTRACKED_LEGACY = (
    "claude_tag_category",
    "claude_tag_user_id",
    "context_window",
    "inference_geo",
    "product",
    "slack_channel_id",
    "speed",
)
UNTRACKED = (
    *UNTRACKED_LEGACY,
    "agent_id",
    "deployment_id",
    "environment_id",
    "organization_id",
    "service_tier",
    "session_id",
    "user_profile_id",
)
UNTRACKED_COST = ("cost_type", "token_type")  # one cost per request: never split
# Filters (``name[]``) the gateway can't apply.
UNTRACKED_FILTERS_LEGACY = (
    "products",
    "context_windows",
    "inference_geos",
    "speeds",
    "claude_tag_categories",
    "claude_tag_user_ids",
    "slack_channel_ids",
)
UNTRACKED_FILTERS = (
    *UNTRACKED_FILTERS_LEGACY,
    "agent_ids",
    "deployment_ids",
    "environment_ids",
    "organization_ids",
    "service_tiers",
    "session_ids",
    "user_profile_ids",
)
# order_by -> the rollup's metric
USAGE_ORDERS = {
    "total_tokens": "total_tokens",
    "output_tokens": "output_tokens",
    "requests": "requests",
    "uncached_input_tokens": "input_tokens",
    "time": "time",
}
COST_ORDERS = {"amount": "cost_micros", "list_amount": "cost_micros", "time": "time"}

# The group fields of a row of the newer reports (each null unless grouped by it).
GROUP_FIELDS = (
    "actor",
    "actor_type",
    "agent_id",
    "api_key_id",
    "claude_tag_category",
    "claude_tag_user_id",
    "context_window",
    "deployment_id",
    "environment_id",
    "inference_geo",
    "model",
    "organization_id",
    "product",
    "rbac_group_id",
    "service_tier",
    "session_id",
    "slack_channel_id",
    "speed",
    "user_profile_id",
    "workspace_id",
)
# The dimension fields of a legacy result (null unless grouped by it), ours last.
LEGACY_FIELDS = (*UNTRACKED_LEGACY, "model", "rbac_group_id", "api_key_id", "workspace_id")


# ---------------------------------------------------------------- the query


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """One report request, checked (``parse_query``).

    ``start``/``end``: the range as asked (``end`` defaulted: the earlier of now and ``start`` +
    31 days); ``width``: the buckets (None: the whole range in one, the newer reports only);
    ``group``: the dimensions asked (API names, in order, without repeats); filters as given (None:
    not filtering); ``limit``: buckets per page (legacy) or rows per page; ``order_by`` the
    rollup's metric or "time"."""

    kind: str
    legacy: bool
    start: datetime
    end: datetime
    width: str | None
    group: tuple[str, ...] = ()
    models: tuple[str, ...] | None = None
    api_key_ids: tuple[str, ...] | None = None
    workspace_ids: tuple[str, ...] | None = None
    only_api_actors: bool = True
    # As asked, for the people (``resolve_people``): api_key_ids[] alone, actor_ids[] and
    # actor_types[] (the newer reports), rbac_group_ids[], user_ids[] (the legacy reports).
    asked_api_key_ids: tuple[str, ...] | None = None
    actor_ids: tuple[str, ...] | None = None
    actor_types: tuple[str, ...] | None = None
    rbac_group_ids: tuple[str, ...] | None = None
    user_ids: tuple[str, ...] | None = None
    key_rows: tuple[int, ...] | None = None  # the keys the people's filters leave (row ids)
    people: bool = False  # rows resolved through the keys' people (``_people_rows``)
    limit: int = 20
    page: str | None = None
    order_by: str = "time"
    descending: bool = True

    def fingerprint(self) -> str:
        """What a page token is bound to: the same report asked again (page excluded)."""
        parts = [
            self.kind,
            self.legacy,
            to_epoch_micros(self.start),
            to_epoch_micros(self.end),
            self.width,
            self.group,
            self.models,
            self.api_key_ids,
            self.workspace_ids,
            self.only_api_actors,
            self.actor_ids,
            self.actor_types,
            self.rbac_group_ids,
            self.user_ids,
            self.order_by,
            self.descending,
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    @property
    def metric(self) -> str:
        """What ranks the rows of one bucket: total tokens or cost."""
        return "total_tokens" if self.kind == USAGE else "cost_micros"


def _values(args: Any, name: str) -> tuple[str, ...] | None:
    values = parse_list(args, name)
    return tuple(dict.fromkeys(values)) if values else None


def _refuse_untracked_filters(args: Any, names: Sequence[str]) -> None:
    given = [name for name in names if parse_list(args, name)]
    if given:
        raise AdminInvalidRequestError(
            f"{given[0]}[]: the gateway doesn't track this; filter by models[], api_key_ids[], workspace_ids[], "
            "rbac_group_ids[] or the actors"
        )


def _group(args: Any, kind: str, legacy: bool) -> tuple[str, ...]:
    asked = tuple(dict.fromkeys(parse_list(args, "group_by")))
    if not legacy and len(asked) > MAX_GROUP_BY:
        raise AdminInvalidRequestError(f"group_by[]: at most {MAX_GROUP_BY} dimensions, got {len(asked)}")
    allowed = LEGACY_GROUPS if legacy else GROUPS
    for name in asked:
        if name in allowed:
            continue
        untracked = (UNTRACKED_LEGACY if legacy else UNTRACKED) + (UNTRACKED_COST if kind == COST else ())
        supported = ", ".join(allowed)
        if name in untracked:
            raise AdminInvalidRequestError(
                f"group_by[]: the gateway doesn't track {name!r} (one cost per request, no products); "
                f"group by {supported}"
            )
        raise AdminInvalidRequestError(f"group_by[]: {name!r} is not a dimension; group by {supported}")
    return asked


def parse_query(args: Any, *, kind: str, legacy: bool, now: datetime) -> ReportQuery:
    """A report's query parameters (a werkzeug ``MultiDict`` or a mapping), checked: a 400 naming
    the parameter for anything the report can't answer as asked (never clamped)."""
    raw_start = args.get("starting_at")
    if not raw_start:
        raise AdminInvalidRequestError("starting_at: required (an RFC 3339 time such as 2026-01-01T00:00:00Z)")
    start = parse_time(raw_start, "starting_at")
    raw_end = args.get("ending_at")
    end = parse_time(raw_end, "ending_at") if raw_end else None
    width_name = "bucket_width" if legacy else "time_bucket_width"
    width = args.get(width_name) or (LEGACY_WIDTH if legacy else None)
    if width is not None and width not in WIDTHS:
        raise AdminInvalidRequestError(f"{width_name}: must be one of 1d, 1h, 1m, got {width!r}")
    if width is not None and not legacy and end is None:
        raise AdminInvalidRequestError("ending_at: required with time_bucket_width")
    if end is not None and end <= start:
        raise AdminInvalidRequestError("ending_at: must be after starting_at")
    if end is None:
        end = max(start, min(now, start + RANGE_MAX))
    if end - start > RANGE_MAX:
        raise AdminInvalidRequestError("ending_at: the range may span at most 31 days")
    if not legacy and width == "1m" and end - start > MINUTES_RANGE_MAX:
        raise AdminInvalidRequestError('ending_at: with time_bucket_width "1m" the range may span at most 24 hours')
    group = _group(args, kind, legacy)
    _refuse_untracked_filters(args, UNTRACKED_FILTERS_LEGACY if legacy else UNTRACKED_FILTERS)
    only_api_actors = True
    api_key_ids = asked_api_key_ids = _values(args, "api_key_ids")
    actor_ids = actor_types = user_ids = None
    if legacy:
        user_ids = _values(args, "user_ids")
    if not legacy:
        actor_types = _values(args, "actor_types")
        unknown = [
            t for t in actor_types or () if t not in (API_ACTOR, USER_ACTOR, "service_account_actor", "federated_actor")
        ]
        if unknown:
            raise AdminInvalidRequestError(f"actor_types[]: {unknown[0]!r} is not an actor type")
        only_api_actors = actor_types is None or API_ACTOR in actor_types
        actor_ids = _values(args, "actor_ids")
        if actor_ids is not None:  # an actor is a key here: only apikey_ ids can match
            keys = tuple(i for i in actor_ids if i.startswith("apikey_"))
            api_key_ids = keys if api_key_ids is None else tuple(i for i in api_key_ids if i in keys)
        if args.get("exclude_deleted_users") in ("true", "1") and "actor" not in group:
            raise AdminInvalidRequestError("exclude_deleted_users: requires group_by[]=actor")
    if legacy:
        assert width is not None
        default, most = LEGACY_LIMITS[width]
        limit = parse_limit(args.get("limit"), default=default, most=most)
        order_by, descending = "time", False
    else:
        limit = parse_limit(args.get("limit"))
        orders = USAGE_ORDERS if kind == USAGE else COST_ORDERS
        order_name = args.get("order_by") or ("total_tokens" if kind == USAGE else "amount")
        if order_name not in orders:
            raise AdminInvalidRequestError(f"order_by: must be one of {', '.join(orders)}, got {order_name!r}")
        order_by = orders[order_name]
        direction = args.get("order") or "desc"
        if direction not in ("asc", "desc"):
            raise AdminInvalidRequestError(f"order: must be asc or desc, got {direction!r}")
        descending = direction == "desc"
    return ReportQuery(
        kind=kind,
        legacy=legacy,
        start=start,
        end=end,
        width=width,
        group=group,
        models=_values(args, "models"),
        api_key_ids=api_key_ids,
        workspace_ids=_values(args, "workspace_ids"),
        only_api_actors=only_api_actors,
        asked_api_key_ids=asked_api_key_ids,
        actor_ids=actor_ids,
        actor_types=actor_types,
        rbac_group_ids=_values(args, "rbac_group_ids"),
        user_ids=user_ids,
        limit=limit,
        page=args.get("page") or None,
        order_by=order_by,
        descending=descending,
    )


def _page_token(query: ReportQuery, name: str) -> Any:
    """What ``query.page`` holds for this very report (a 400 for another report's token)."""
    if query.page is None:
        return None
    held = decode_cursor(query.page)
    if not isinstance(held, dict) or held.get("query") != query.fingerprint() or not isinstance(held.get(name), int):
        raise AdminInvalidRequestError("page: this token belongs to another report; ask again without page")
    return held[name]


# ---------------------------------------------------------------- reading


@dataclass(slots=True)
class _Names:
    """The public ids of the organisations and keys of some rows (``key_…``, and ``apikey_…``)."""

    orgs: dict[int, str]
    keys: dict[int, str]
    api_keys: dict[int, str] = field(default_factory=dict)  # the keys' ids as the admin API writes them

    def workspace(self, org_id: int | None) -> str | None:
        return None if org_id is None else self.orgs.get(org_id)

    def key(self, key_id: int | None) -> str | None:
        return None if key_id is None else self.api_keys.get(key_id)

    def __post_init__(self) -> None:
        self.api_keys = {key_id: api_key_id(public_id) for key_id, public_id in self.keys.items()}


def _slice(rollup: Rollup, query: ReportQuery, **where: Any) -> Slice | None:
    """The rollup's ``Slice`` for ``query`` (filters resolved to the tables' ids); None when a
    filter matches nothing."""
    dims = tuple(dict.fromkeys(dim for name in query.group if (dim := GROUPS[name])))
    if query.people and "key" not in dims:  # the people are found through the keys
        dims += ("key",)
    key_ids = None if query.api_key_ids is None else rollup.key_ids(key_public_id(i) for i in query.api_key_ids)
    if query.key_rows is not None:
        key_ids = query.key_rows if key_ids is None else tuple(k for k in key_ids if k in set(query.key_rows))
    org_ids = None if query.workspace_ids is None else rollup.org_ids(query.workspace_ids)
    if key_ids == () or org_ids == () or not query.only_api_actors:
        return None
    return Slice(
        group=dims,
        org_ids=org_ids,
        key_ids=key_ids,
        models=query.models,
        then_by=query.metric,
        **where,
    )


def _names(rollup: Rollup, rows: Sequence[Total]) -> _Names:
    orgs, keys = rollup.public_ids(
        (r.org_id for r in rows if r.org_id is not None), (r.key_id for r in rows if r.key_id is not None)
    )
    return _Names(orgs, keys)


def _usage(row: Total) -> dict[str, Any]:
    """The token counts of ``row`` as Anthropic's reports write them."""
    return {
        "uncached_input_tokens": row.input_tokens,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": row.cache_write_tokens},
        "cache_read_input_tokens": row.cache_read_tokens,
        "output_tokens": row.output_tokens,
        "server_tool_use": {"web_search_requests": 0},
        "requests": row.requests,
    }


def _cost(row: Total) -> dict[str, Any]:
    amount = micros_to_cents(row.cost_micros)
    return {"amount": amount, "list_amount": amount, "currency": CURRENCY, "requests": row.requests}


def _dimensions(
    query: ReportQuery, row: Total, names: _Names, people: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The grouped dimensions' values of ``row`` (API names); ``people``: the values of
    ``PEOPLE_GROUPS`` of a row resolved through the keys' people (``_people_rows``)."""
    values: dict[str, Any] = {}
    for name in query.group:
        if people is not None and name in PEOPLE_GROUPS:
            values[name] = people.get(name)
        elif name == "model":
            values[name] = row.model or None
        elif name == "api_key_id":
            values[name] = names.key(row.key_id)
        elif name == "workspace_id":
            values[name] = names.workspace(row.org_id)
        elif name == "actor":
            key = names.key(row.key_id)
            values[name] = None if key is None else {"type": API_ACTOR, "api_key_id": key}
        elif name == "actor_type":
            values[name] = API_ACTOR
    return values


@dataclass(frozen=True, slots=True)
class People:
    """Who the keys of a report belong to (``resolve_people``): key row id -> its person, and the
    groups' public ids."""

    owners: Mapping[int, KeyOwner]
    groups: Mapping[int, str]


def resolve_people(store: Store, query: ReportQuery) -> tuple[ReportQuery, People | None]:
    """``query`` with the people's filters turned into keys (``key_rows``) and, when it groups by
    an actor or a group and the keys have people, marked ``people`` (rows resolved through them).
    Without people, and without filters or groups of theirs, the query is left as it was."""
    engine = store.engine
    owners = key_owners(engine)
    by_people = "rbac_group_id" in query.group or (
        bool(owners) and any(name in query.group for name in ("actor", "actor_type"))
    )
    filtering = any(v is not None for v in (query.rbac_group_ids, query.user_ids)) or (
        bool(owners) and (query.actor_ids is not None or query.actor_types is not None)
    )
    if not by_people and not filtering:
        return query, None
    people = People(owners, group_public_ids(engine))
    if not filtering:
        return replace(query, people=by_people), people
    every = all_key_ids(engine)
    allowed = set(every)
    if query.actor_ids is not None:  # apikey_: usage of a key of nobody; user_: a person's
        wanted_users = {i for i in query.actor_ids if not i.startswith("apikey_")}
        wanted_keys = {key_public_id(i) for i in query.actor_ids if i.startswith("apikey_")}
        key_rows = set(store.rollup.key_ids(wanted_keys)) if wanted_keys and store.rollup else set()
        allowed &= {k for k in key_rows if k not in owners} | {
            k for k, o in owners.items() if o.public_id in wanted_users or o.email in wanted_users
        }
    if query.actor_types is not None:
        kinds = set(query.actor_types)
        allowed &= {k for k in every if (API_ACTOR if k not in owners else USER_ACTOR) in kinds}
    if query.user_ids is not None:
        wanted = set(query.user_ids)
        allowed &= {k for k, o in owners.items() if o.public_id in wanted or o.email in wanted}
    if query.rbac_group_ids is not None:
        groups = find_group_ids(engine, query.rbac_group_ids)
        allowed &= {k for k, o in owners.items() if groups.intersection(o.group_ids)}
    changed = replace(
        query,
        api_key_ids=query.asked_api_key_ids,
        only_api_actors=True,
        key_rows=tuple(sorted(allowed)),
        people=by_people,
    )
    return changed, people


def _people_rows(rows: Sequence[Total], query: ReportQuery, people: People) -> list[tuple[Total, dict[str, Any]]]:
    """``rows`` (read by key) summed again by the report's groups, the key's person in place of
    the key for ``actor``/``actor_type``, and once per group of theirs for ``rbac_group_id``."""
    merged: dict[tuple[Any, ...], list[Any]] = {}
    for row in rows:
        owner = None if row.key_id is None else people.owners.get(row.key_id)
        actor: dict[str, Any] | None
        if owner is None:
            actor = None if row.key_id is None else {"type": API_ACTOR, "api_key_id": f"@{row.key_id}"}
            groups: list[str | None] = [None]
        else:
            actor = {
                "type": USER_ACTOR,
                "user_id": owner.public_id,
                "email_address": owner.email or None,
                "name": owner.name or None,
                "deleted": False,
            }
            groups = [people.groups[g] for g in owner.group_ids if g in people.groups] or [None]
        for group in groups if "rbac_group_id" in query.group else [None]:
            extra = {
                "actor": actor if "actor" in query.group else None,
                "actor_type": (actor or {}).get("type", API_ACTOR) if "actor_type" in query.group else None,
                "rbac_group_id": group,
            }
            key = (
                row.bucket,
                row.org_id if "workspace_id" in query.group else None,
                row.key_id if "api_key_id" in query.group else None,
                row.model,
                json.dumps(extra, sort_keys=True),
            )
            held = merged.get(key)
            if held is None:
                merged[key] = [replace(row, org_id=key[1], key_id=key[2]), extra]
            else:
                total = held[0]
                held[0] = replace(
                    total,
                    requests=total.requests + row.requests,
                    input_tokens=total.input_tokens + row.input_tokens,
                    cache_write_tokens=total.cache_write_tokens + row.cache_write_tokens,
                    cache_read_tokens=total.cache_read_tokens + row.cache_read_tokens,
                    output_tokens=total.output_tokens + row.output_tokens,
                    cost_micros=total.cost_micros + row.cost_micros,
                )
    return [(total, extra) for total, extra in merged.values()]


def _metric(row: Total, name: str) -> int:
    return int(getattr(row, name))


def _tie(item: tuple[Total, dict[str, Any]]) -> tuple[Any, ...]:
    row, extra = item
    return (row.org_id or 0, row.key_id or 0, row.model or "", json.dumps(extra, sort_keys=True))


def _ranked(items: list[tuple[Total, dict[str, Any]]], query: ReportQuery) -> list[tuple[Total, dict[str, Any]]]:
    """``items`` in the order ``query`` asks: by its metric, or by time then the report's metric
    (highest first), ties broken by the dimensions so pages never skip nor repeat a row."""
    epoch = datetime.min.replace(tzinfo=UTC)
    if query.order_by == "time":
        within = sorted(items, key=_tie)
        within.sort(key=lambda item: _metric(item[0], query.metric), reverse=True)
        within.sort(key=lambda item: item[0].bucket or epoch, reverse=query.descending)
        return within
    ordered = sorted(items, key=_tie)
    ordered.sort(key=lambda item: (_metric(item[0], query.order_by), item[0].bucket or epoch), reverse=query.descending)
    return ordered


def _actor_keys(items: Sequence[tuple[Total, dict[str, Any]]], names: _Names) -> None:
    """Write the ``api_actor``'s key id of each row as the admin API does (``_people_rows`` holds
    the row id, ``@<id>``; ``names`` those of the rows read)."""
    for _row, extra in items:
        actor = extra.get("actor")
        if actor and actor.get("type") == API_ACTOR:
            extra["actor"] = {"type": API_ACTOR, "api_key_id": names.key(int(actor["api_key_id"][1:]))}


def legacy_report(
    rollup: Rollup, query: ReportQuery, refreshed: datetime | None, people: People | None = None
) -> dict[str, Any]:
    """A page of ``usage_report`` / ``cost_report``: ``query.limit`` time buckets from the page
    token's (else the first), each with its results: one combined row without ``group_by``
    (none when it had no requests), else its top ``TOP_GROUPS`` groups by tokens (usage) or
    cost, highest first."""
    assert query.width is not None
    width = WIDTHS[query.width]
    first = floor_to(query.start, width)
    at = _page_token(query, "bucket")
    if at is not None:
        if at % width or not to_epoch_micros(first) <= at < to_epoch_micros(query.end):
            raise AdminInvalidRequestError("page: this token belongs to another report; ask again without page")
        first = from_epoch_micros(at)
    starts: list[datetime] = []
    moment = first
    while moment < query.end and len(starts) < query.limit:
        starts.append(moment)
        moment += timedelta(microseconds=width)
    has_more = moment < query.end
    part = _slice(rollup, query, width=query.width, start=first, end=moment, order_by="time") if starts else None
    rows = rollup.totals(part) if part is not None else []
    names = _names(rollup, rows)
    items: list[tuple[Total, dict[str, Any] | None]] = [(row, None) for row in rows]
    if query.people and people is not None:
        resolved = _ranked(_people_rows(rows, query, people), query)
        _actor_keys(resolved, names)
        items = list(resolved)
    results: dict[datetime, list[dict[str, Any]]] = {start: [] for start in starts}
    nulls = dict.fromkeys(LEGACY_FIELDS) | ({} if query.kind == USAGE else {"cost_type": None, "token_type": None})
    for row, extra in items:
        assert row.bucket is not None
        bucket = results[row.bucket]
        if len(bucket) >= TOP_GROUPS:
            continue
        result = _usage(row) if query.kind == USAGE else _cost(row)
        result.update(nulls)
        if query.group:
            result.update(_dimensions(query, row, names, extra))
        bucket.append(result)
    step = timedelta(microseconds=width)
    token = {"bucket": to_epoch_micros(moment), "query": query.fingerprint()}
    return {
        "data": [
            {"starting_at": rfc3339(start), "ending_at": rfc3339(start + step), "results": results[start]}
            for start in starts
        ],
        "has_more": has_more,
        "next_page": encode_cursor(token) if has_more else None,
        "data_refreshed_at": rfc3339(refreshed),
    }


def analytics_report(
    rollup: Rollup, query: ReportQuery, refreshed: datetime | None, people: People | None = None
) -> dict[str, Any]:
    """A page of ``usage`` / ``cost``: ``query.limit`` rows, one per (time bucket, group) with
    requests in the range (the whole range rounded down to hours in one row without buckets),
    in ``query.order_by``'s order. Rows ranked by a metric need the whole range summed, page
    after page (``offset`` in the token); rows in time order read only the buckets of their page
    (``_time_ordered``). Rows resolved through the keys' people (``query.people``) sum the whole
    range by key, then by person or group, for every page."""
    extras: list[dict[str, Any] | None] | None = None
    if query.people and people is not None:
        rows, extras, has_more, token, names, width, first, stop = _people_page(rollup, query, people)
    elif query.width is not None:
        width = WIDTHS[query.width]
        first = floor_to(query.start, width)
        stop = floor_to(query.end - timedelta(microseconds=1), width) + timedelta(microseconds=width)
        if query.order_by == "time":
            rows, has_more, token = _time_ordered(rollup, query, first, stop)
        else:
            offset = _page_token(query, "offset") or 0
            page = {"order_by": query.order_by, "descending": query.descending, "limit": query.limit + 1}
            part = _slice(rollup, query, width=query.width, start=first, end=stop, offset=offset, **page)
            rows, has_more, token = _cut(rollup.totals(part) if part is not None else [], query, offset)
    else:  # Admin API: "each row aggregates the requested range ... rounded down to the hour"
        width = 0
        first, stop = floor_to(query.start, HOUR), floor_to(query.end, HOUR)
        offset = _page_token(query, "offset") or 0
        page = {"order_by": query.order_by, "descending": query.descending, "limit": query.limit + 1}
        part = None
        if first < stop:
            part = _slice(rollup, query, width="1h", start=first, end=stop, by_bucket=False, offset=offset, **page)
        rows, has_more, token = _cut(rollup.totals(part) if part is not None else [], query, offset)
    if extras is None:
        names = _names(rollup, rows)
        extras = [None] * len(rows)
    data = []
    for row, extra in zip(rows, extras, strict=True):
        start = row.bucket if row.bucket is not None else first
        end = start + timedelta(microseconds=width) if row.bucket is not None else stop
        group = {name: None for name in GROUP_FIELDS} | _dimensions(query, row, names, extra)
        item: dict[str, Any] = {"starting_at": rfc3339(start), "ending_at": rfc3339(end)}
        if query.kind == USAGE:
            item["group"] = group
            item["usage"] = {**_usage(row), "total_tokens": row.total_tokens}
        else:
            item["group"] = {**group, "cost_type": None, "token_type": None}
            item["cost"] = _cost(row)
        data.append(item)
    return {
        "data": data,
        "has_more": has_more,
        "next_page": encode_cursor({**token, "query": query.fingerprint()}) if has_more else None,
        "data_refreshed_at": rfc3339(refreshed),
    }


def _people_page(
    rollup: Rollup, query: ReportQuery, people: People
) -> tuple[list[Total], list[dict[str, Any] | None], bool, dict[str, int], _Names, int, datetime, datetime]:
    """A page of the newer reports grouped by people: the range read by key in one slice, summed
    again by person or group (``_people_rows``), ranked, cut at the token's offset."""
    if query.width is not None:
        width = WIDTHS[query.width]
        first = floor_to(query.start, width)
        stop = floor_to(query.end - timedelta(microseconds=1), width) + timedelta(microseconds=width)
        part = _slice(rollup, query, width=query.width, start=first, end=stop, order_by="time")
    else:
        width = 0
        first, stop = floor_to(query.start, HOUR), floor_to(query.end, HOUR)
        part = None
        if first < stop:
            part = _slice(rollup, query, width="1h", start=first, end=stop, by_bucket=False, order_by="time")
    rows = rollup.totals(part) if part is not None else []
    names = _names(rollup, rows)
    items = _ranked(_people_rows(rows, query, people), query)
    _actor_keys(items, names)
    offset = _page_token(query, "offset") or 0
    page = items[offset : offset + query.limit]
    token = {"offset": offset + len(page)}
    return (
        [row for row, _ in page],
        [extra for _, extra in page],
        offset + len(page) < len(items),
        token,
        names,
        width,
        first,
        stop,
    )


def _cut(rows: list[Total], query: ReportQuery, offset: int) -> tuple[list[Total], bool, dict[str, int]]:
    """A page of rows read with one more than ``query.limit``: the page, whether more follow,
    and the next page's token."""
    page = rows[: query.limit]
    return page, len(rows) > query.limit, {"offset": offset + len(page)}


TIME_WINDOW = 8  # buckets a time-ordered page reads first (then 4 times as many, until it has its rows)


def _time_ordered(
    rollup: Rollup, query: ReportQuery, first: datetime, stop: datetime
) -> tuple[list[Total], bool, dict[str, int]]:
    """A page of rows in time order (then by tokens or cost within a bucket), read from a window
    of buckets that grows from where the last page ended until it holds the page: the token is
    the bucket of the page's first row and how many rows of that bucket earlier pages had."""
    assert query.width is not None
    step = timedelta(microseconds=WIDTHS[query.width])
    held = _page_token(query, "bucket")
    anchor = (stop - step if query.descending else first) if held is None else from_epoch_micros(held)
    skip = 0 if held is None else _page_token(query, "skip")
    if to_epoch_micros(anchor) % WIDTHS[query.width] or not first <= anchor < stop or skip < 0:
        raise AdminInvalidRequestError("page: this token belongs to another report; ask again without page")
    wanted = skip + query.limit + 1
    buckets = TIME_WINDOW
    while True:
        if query.descending:
            lo, hi = max(first, anchor - (buckets - 1) * step), anchor + step
            whole = lo == first
        else:
            lo, hi = anchor, min(stop, anchor + buckets * step)
            whole = hi == stop
        part = _slice(rollup, query, width=query.width, start=lo, end=hi, order_by="time")
        if part is None:
            return [], False, {}
        part = replace(part, descending=query.descending, limit=wanted)
        rows = rollup.totals(part)
        if len(rows) >= wanted or whole:
            break
        buckets *= 4
    page = rows[skip : skip + query.limit]
    if len(rows) < wanted:
        return page, False, {}
    after = rows[skip + query.limit]
    assert after.bucket is not None
    seen = sum(1 for row in rows[: skip + query.limit] if row.bucket == after.bucket)
    return page, True, {"bucket": to_epoch_micros(after.bucket), "skip": seen}


def report(store: Store, args: Mapping[str, Any] | Any, *, kind: str, legacy: bool) -> dict[str, Any]:
    """The report ``args`` ask for, after folding what the ledger got since the last fold. Its
    ``data_refreshed_at`` is now when that fold reached the ledger's end (every request settled
    before it is in), else when one last did."""
    now = datetime.now(UTC)
    query, people = resolve_people(store, parse_query(args, kind=kind, legacy=legacy, now=now))
    rollup = store.rollup
    assert rollup is not None
    refreshed = now if rollup.catch_up() else rollup.refreshed_at()
    if legacy:
        return legacy_report(rollup, query, refreshed, people)
    return analytics_report(rollup, query, refreshed, people)


# ---------------------------------------------------------------- OpenAPI shapes (documentation)


class _ReportQuery(Schema):
    """The query parameters (lists come as ``name[]``, read with ``parse_list``)."""

    class Meta:
        unknown = EXCLUDE

    starting_at = fields.Str(required=True, metadata={"description": "RFC 3339, inclusive"})
    ending_at = fields.Str(metadata={"description": "RFC 3339, exclusive; at most 31 days after starting_at"})
    limit = fields.Int()
    page = fields.Str(metadata={"description": "next_page of the previous page"})
    models = fields.List(fields.Str(), data_key="models[]")
    api_key_ids = fields.List(fields.Str(), data_key="api_key_ids[]", metadata={"description": "apikey_…"})
    workspace_ids = fields.List(fields.Str(), data_key="workspace_ids[]", metadata={"description": "wrkspc_…"})
    rbac_group_ids = fields.List(
        fields.Str(), data_key="rbac_group_ids[]", metadata={"description": "group_… (or names): their members now"}
    )


class _LegacyQuery(_ReportQuery):
    bucket_width = fields.Str(metadata={"description": "1d (default), 1h or 1m"})
    group_by = fields.List(fields.Str(), data_key="group_by[]", metadata={"description": ", ".join(LEGACY_GROUPS)})
    user_ids = fields.List(fields.Str(), data_key="user_ids[]", metadata={"description": "user_… (or emails)"})


class _AnalyticsQuery(_ReportQuery):
    time_bucket_width = fields.Str(metadata={"description": "1d, 1h or 1m (then ending_at is required)"})
    group_by = fields.List(fields.Str(), data_key="group_by[]", metadata={"description": ", ".join(GROUPS)})
    order = fields.Str(metadata={"description": "asc or desc (default)"})
    order_by = fields.Str(metadata={"description": "usage: " + ", ".join(USAGE_ORDERS) + "; cost: amount, time"})
    actor_types = fields.List(fields.Str(), data_key="actor_types[]")
    actor_ids = fields.List(fields.Str(), data_key="actor_ids[]", metadata={"description": "user_… or apikey_…"})


class _CacheCreation(Schema):
    ephemeral_1h_input_tokens = fields.Int()
    ephemeral_5m_input_tokens = fields.Int()


class _ServerToolUse(Schema):
    web_search_requests = fields.Int()


class _Tokens(Schema):
    uncached_input_tokens = fields.Int()
    cache_creation = fields.Nested(_CacheCreation)
    cache_read_input_tokens = fields.Int()
    output_tokens = fields.Int()
    server_tool_use = fields.Nested(_ServerToolUse)
    requests = fields.Int(allow_none=True)


class _Money(Schema):
    amount = fields.Str(metadata={"description": "US cents, a decimal string (up to 4 decimals)"})
    list_amount = fields.Str()
    currency = fields.Str()
    requests = fields.Int(allow_none=True)


def _nullable_strings(names: Sequence[str]) -> dict[str, fields.Field]:
    return {name: fields.Str(allow_none=True) for name in names}


_LegacyUsageResult = _Tokens.from_dict(_nullable_strings(LEGACY_FIELDS), name="LegacyUsageResult")
_LegacyCostResult = _Money.from_dict(
    _nullable_strings((*LEGACY_FIELDS, "cost_type", "token_type")), name="LegacyCostResult"
)


def _bucket(result: type[Schema], name: str) -> type[Schema]:
    return Schema.from_dict(
        {"starting_at": fields.Str(), "ending_at": fields.Str(), "results": fields.List(fields.Nested(result))},
        name=name,
    )


def _page(item: type[Schema], name: str) -> type[Schema]:
    return Schema.from_dict(
        {
            "data": fields.List(fields.Nested(item)),
            "has_more": fields.Bool(),
            "next_page": fields.Str(allow_none=True),
            "data_refreshed_at": fields.Str(allow_none=True),
        },
        name=name,
    )


_Group = Schema.from_dict(
    {**_nullable_strings(GROUP_FIELDS), "actor": fields.Dict(allow_none=True)}, name="AnalyticsGroup"
)
_CostGroup = Schema.from_dict(
    {**_nullable_strings((*GROUP_FIELDS, "cost_type", "token_type")), "actor": fields.Dict(allow_none=True)},
    name="AnalyticsCostGroup",
)
_UsageMetrics = _Tokens.from_dict({"total_tokens": fields.Int()}, name="AnalyticsUsageMetrics")
_UsageItem = Schema.from_dict(
    {
        "starting_at": fields.Str(),
        "ending_at": fields.Str(),
        "group": fields.Nested(_Group),
        "usage": fields.Nested(_UsageMetrics),
    },
    name="AnalyticsUsageItem",
)
_CostItem = Schema.from_dict(
    {
        "starting_at": fields.Str(),
        "ending_at": fields.Str(),
        "group": fields.Nested(_CostGroup),
        "cost": fields.Nested(_Money),
    },
    name="AnalyticsCostItem",
)
UsageReportPage = _page(_bucket(_LegacyUsageResult, "UsageReportBucket"), "UsageReportPage")
CostReportPage = _page(_bucket(_LegacyCostResult, "CostReportBucket"), "CostReportPage")
UsagePage = _page(_UsageItem, "AnalyticsUsagePage")
CostPage = _page(_CostItem, "AnalyticsCostPage")


# ---------------------------------------------------------------- the views


def encoded(body: dict[str, Any]) -> bytes:
    """A report's body as the view sends it: compact JSON (orjson: a large page is megabytes; the
    body holds no float) and a newline, as the other admin views' bodies end (Flask's JSON
    provider). Encoded here, not through flask-smorest's schema, whose dump would cost as much
    again."""
    return encode_json(body, floats=False) + b"\n"


def _answer(kind: str, legacy: bool) -> Response:
    admin_context()
    store: Store = current_app.extensions["ezat_store"]
    return Response(encoded(report(store, request.args, kind=kind, legacy=legacy)), mimetype="application/json")


@blp.route("/analytics/usage_report", methods=["GET"])
@blp.arguments(_LegacyQuery, location="query")
@blp.response(200, UsageReportPage)
def usage_report(_query: dict[str, Any]) -> Response:
    """Token usage in time buckets (1d, 1h, 1m), each with its results, optionally grouped by
    model, api_key_id, workspace_id."""
    return _answer(USAGE, legacy=True)


@blp.route("/analytics/cost_report", methods=["GET"])
@blp.arguments(_LegacyQuery, location="query")
@blp.response(200, CostReportPage)
def cost_report(_query: dict[str, Any]) -> Response:
    """Cost (US cents) in time buckets, each with its results, optionally grouped by model,
    api_key_id, workspace_id."""
    return _answer(COST, legacy=True)


@blp.route("/analytics/usage", methods=["GET"])
@blp.arguments(_AnalyticsQuery, location="query")
@blp.response(200, UsagePage)
def usage(_query: dict[str, Any]) -> Response:
    """Token usage per (time bucket, group), ranked by order_by."""
    return _answer(USAGE, legacy=False)


@blp.route("/analytics/cost", methods=["GET"])
@blp.arguments(_AnalyticsQuery, location="query")
@blp.response(200, CostPage)
def cost(_query: dict[str, Any]) -> Response:
    """Cost (US cents) per (time bucket, group), ranked by order_by."""
    return _answer(COST, legacy=False)
