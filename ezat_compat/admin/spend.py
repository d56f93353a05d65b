"""Spend limits by period on the admin API, in the wire shapes of Anthropic's Admin API (the
``anthropic`` SDK's ``client.beta.organization.spend_limits`` and
``client.organization.spend_limits.effective``), and the service under both it and the CLI.

    POST   /v1/organizations/spend_limits              set (upsert on scope and period)
    GET    /v1/organizations/spend_limits              list (cursor pages; scope_type[], workspace_id)
    GET    /v1/organizations/spend_limits/effective    per key: the limit that binds each period
    GET    /v1/organizations/spend_limits/{id}         retrieve
    DELETE /v1/organizations/spend_limits/{id}         delete

Scopes map as the rest of the admin API does: the gateway is Anthropic's ``organization``, an
organisation is a ``workspace`` (``workspace_id`` ``wrkspc_…``), a person is a ``user``
(``user_id`` ``user_…``, or their email), an IdP group is an ``rbac_group`` (``rbac_group_id``
``group_…``, or its name: its members' requests together), and a key is an extension scope
``{"type": "api_key", "api_key_id": "apikey_…"}``. Amounts are integer strings of cents
(``"50000"`` is $500.00; ``null`` is an explicit "no limit"), spend so far has up to three
decimals of a cent, the currency is always ``USD``, times are RFC 3339. ``thresholds`` (alert
percentages) is an extension of the limit object. Every change goes through ``set_limit`` /
``delete_limit``, which leave their audit row (``admin.service.record_change``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flask import current_app, request
from flask_smorest import Blueprint
from marshmallow import EXCLUDE, RAISE, Schema, ValidationError, fields, validate, validates_schema

from ezat_compat.admin.auth import AdminContext, admin_context
from ezat_compat.admin.errors import AdminInvalidRequestError, AdminNotFoundError
from ezat_compat.admin.pages import cursor_page, parse_limit, parse_list, rfc3339
from ezat_compat.admin.service import find_key, find_org, record_change
from ezat_compat.periods import PERIODS, cents, cents_to_micros, fractional_cents
from ezat_compat.pricing import micros_to_usd
from ezat_compat.store.accounts import StoreError, api_key_id, key_public_id
from ezat_compat.store.people import PersonInfo
from ezat_compat.store.people_queries import key_owners, keys_spend, people_keys
from ezat_compat.store.spend import (
    DEFAULT_THRESHOLDS,
    SCOPE_GATEWAY,
    SCOPE_GROUP,
    SCOPE_KEY,
    SCOPE_ORG,
    SCOPE_TYPES,
    SCOPE_USER,
    Member,
    PeriodSpend,
    SpendLimitInfo,
    SpendLimits,
)

if TYPE_CHECKING:
    from ezat_compat.store.store import Store

blp = Blueprint(
    "spend_limits",
    __name__,
    url_prefix="/v1/organizations",
    description="Spend limits by period (daily, weekly, monthly) on the gateway, a workspace or an API key.",
)

CURRENCY = "USD"
# Anthropic's scope types -> ours; the other types of the SDK (seat_tier, usage_tier,
# organization_service) have no counterpart here: listing them is a 400, as the Admin API answers
# a type that doesn't apply to the organization.
API_SCOPE_TYPES = {
    "organization": SCOPE_GATEWAY,
    "workspace": SCOPE_ORG,
    "user": SCOPE_USER,
    "rbac_group": SCOPE_GROUP,
    "api_key": SCOPE_KEY,
}
DEFAULT_PERIOD = "monthly"  # Console's limits are monthly; ``set`` without ``period`` makes one


# ---------------------------------------------------------------- the service (API and CLI)


@dataclass(frozen=True, slots=True)
class Scope:
    """A scope as named by a caller: a type of ``SCOPE_TYPES`` and a reference (an organisation's
    name or workspace id, a key's ``key_…`` or ``apikey_…`` id, a person's ``user_…`` id or email,
    a group's ``group_…`` id or name; "" for the gateway)."""

    type: str
    ref: str = ""


def spend_limits(store: Store) -> SpendLimits:
    """The store's spend limits (every kind of store has them)."""
    assert store.spend is not None, "open_store makes the spend limits"
    return store.spend


def parse_cli_scope(text: str) -> Scope:
    """The CLI's ``--scope``: ``gateway``, ``org:NAME``, ``key:KEY_ID``, ``user:EMAIL`` or
    ``group:NAME``; ``StoreError`` else."""
    kind, _, ref = text.partition(":")
    if kind == SCOPE_GATEWAY and not ref:
        return Scope(SCOPE_GATEWAY)
    if kind in (SCOPE_ORG, SCOPE_KEY, SCOPE_USER, SCOPE_GROUP) and ref:
        return Scope(kind, ref)
    raise StoreError(f"--scope: {text!r} is not gateway, org:NAME, key:KEY_ID, user:EMAIL or group:NAME")


def _scope_id(store: Store, scope: Scope) -> int:
    """The row id of ``scope``'s organisation, key, person or group (0: the gateway); 404 for an
    unknown one."""
    if scope.type == SCOPE_GATEWAY:
        return 0
    spend = spend_limits(store)
    if scope.type == SCOPE_ORG:
        return spend.scope_id(SCOPE_ORG, find_org(store, scope.ref).name)
    if scope.type == SCOPE_KEY:
        return spend.scope_id(SCOPE_KEY, find_key(store, scope.ref).id)
    if scope.type == SCOPE_USER:
        from ezat_compat.admin.users import find_person

        return find_person(store, scope.ref).id
    if scope.type == SCOPE_GROUP:
        from ezat_compat.admin.groups import find_group

        return find_group(store, scope.ref).id
    raise AdminInvalidRequestError(f"scope: {scope.type!r} is not a scope of this gateway")


def limit_json(limit: SpendLimitInfo, default_thresholds: Sequence[int] = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """A limit as the Admin API's ``SpendLimit`` (plus ``thresholds``, an extension)."""
    return {
        "id": limit.public_id,
        "type": "spend_limit",
        "scope": scope_json(limit),
        "period": limit.period,
        "amount": None if limit.amount_micros is None else cents(limit.amount_micros),
        "currency": CURRENCY,
        "is_enabled": True,
        "thresholds": list(limit.thresholds or default_thresholds),
        "created_at": rfc3339(limit.created_at),
        "updated_at": rfc3339(limit.updated_at),
    }


def scope_json(limit: SpendLimitInfo) -> dict[str, Any]:
    """A limit's scope in the Admin API's union (``api_key`` is our extension)."""
    if limit.scope_type == SCOPE_ORG:
        return {"type": "workspace", "workspace_id": limit.workspace_id}
    if limit.scope_type == SCOPE_USER:
        return {"type": "user", "user_id": limit.scope_public_id}
    if limit.scope_type == SCOPE_GROUP:
        return {"type": "rbac_group", "rbac_group_id": limit.scope_public_id}
    if limit.scope_type == SCOPE_KEY:
        return {"type": "api_key", "api_key_id": api_key_id(limit.scope_name)}
    return {"type": "organization"}


def _snapshot(limit: SpendLimitInfo) -> dict[str, Any]:
    """A limit as the audit trail shows it: the API's object (``thresholds`` null: the
    configured ones) and the CLI's scope."""
    thresholds = list(limit.thresholds) if limit.thresholds else None
    return {**limit_json(limit), "thresholds": thresholds, "scope_label": limit.scope_label}


def set_limit(
    store: Store,
    ctx: AdminContext,
    scope: Scope,
    period: str,
    amount_micros: int | None,
    *,
    thresholds: Sequence[int] | None = None,
) -> SpendLimitInfo:
    """Set the limit of ``scope`` and ``period`` (create or overwrite; None: explicitly no limit)
    and leave its trace. 404 for an unknown organisation or key, ``StoreError`` for a bad value."""
    before, after = spend_limits(store).set_limit(
        scope.type, _scope_id(store, scope), period, amount_micros, thresholds=thresholds
    )
    if before is None or _snapshot(before) != _snapshot(after):
        action = "spend_limit.create" if before is None else "spend_limit.update"
        record_change(
            store,
            ctx,
            action,
            "spend_limit",
            after.public_id,
            None if before is None else _snapshot(before),
            _snapshot(after),
        )
    return after


def delete_limit(store: Store, ctx: AdminContext, public_id: str) -> SpendLimitInfo:
    """Remove a limit (404 if there is none) and leave its trace."""
    spend = spend_limits(store)
    try:
        before = spend.delete(public_id)
    except StoreError:
        raise AdminNotFoundError(f"There is no spend limit {public_id!r}.") from None
    record_change(store, ctx, "spend_limit.delete", "spend_limit", before.public_id, _snapshot(before), None)
    return before


def cli_rows(store: Store, now: datetime) -> list[dict[str, Any]]:
    """The objects of ``spend-limits list --json``: ``id``, ``scope`` (``gateway``, ``org:NAME``,
    ``key:KEY_ID``, ``user:EMAIL``, ``group:NAME``), ``period``, ``amount_usd`` (null: no limit), ``spent_usd`` and
    ``reserved_usd`` of the current period, ``period_start``, ``resets_at``, ``thresholds``,
    ``created_at``, ``updated_at``."""
    spend = spend_limits(store)
    limits = spend.list_limits()
    periods = spend.current(limits, now)
    return [
        {
            "id": limit.public_id,
            "scope": limit.scope_label,
            "period": limit.period,
            "amount_usd": None if limit.amount_micros is None else micros_to_usd(limit.amount_micros),
            "spent_usd": micros_to_usd(periods[limit.id].spent_micros),
            "reserved_usd": micros_to_usd(periods[limit.id].reserved_micros),
            "period_start": rfc3339(periods[limit.id].start),
            "resets_at": rfc3339(periods[limit.id].end),
            "thresholds": list(limit.thresholds) if limit.thresholds else None,
            "created_at": rfc3339(limit.created_at),
            "updated_at": rfc3339(limit.updated_at),
        }
        for limit in limits
    ]


def _binding(limits: Sequence[SpendLimitInfo], periods: Mapping[int, PeriodSpend]) -> SpendLimitInfo:
    """Of the limits of one period that apply to a key, the one that binds first: the least room
    left among those with an amount; else (all "no limit") the narrowest scope."""
    capped = [limit for limit in limits if limit.amount_micros is not None]
    if capped:

        def room(limit: SpendLimitInfo) -> tuple[int, int]:
            spent = periods[limit.id]
            assert limit.amount_micros is not None
            left = limit.amount_micros - spent.spent_micros - spent.reserved_micros
            return left, -SCOPE_TYPES.index(limit.scope_type)

        return min(capped, key=room)
    return max(limits, key=lambda limit: SCOPE_TYPES.index(limit.scope_type))


def effective_rows(
    store: Store, members: Sequence[Member], periods: Sequence[str], now: datetime
) -> list[dict[str, Any]]:
    """``SpendSummary`` rows: for each key and period with a limit that applies to it (for a
    person's key, their own and their groups' too), the one that binds (``_binding``), and the
    key's own spend in the period (its key limit's counter, else its ledger rows since the period
    began)."""
    spend = spend_limits(store)
    limits = spend.list_limits()
    current = spend.current(limits, now)
    owners = key_owners(store.engine, [m.key_id for m in members])
    rows = []
    for member in members:
        owner = owners.get(member.key_id)
        for period in periods:
            applying = [
                limit
                for limit in limits
                if limit.period == period
                and (
                    limit.scope_type == SCOPE_GATEWAY
                    or (limit.scope_type == SCOPE_ORG and limit.scope_id == member.org_id)
                    or (limit.scope_type == SCOPE_KEY and limit.scope_id == member.key_id)
                    or (owner is not None and _owns(limit, owner.user_id, owner.group_ids))
                )
            ]
            if not applying:
                continue
            chosen = _binding(applying, current)
            own = next((limit for limit in applying if limit.scope_type == SCOPE_KEY), None)
            window = current[chosen.id]
            spent = (
                current[own.id].spent_micros
                if own is not None
                else spend.key_spend(member.key_id, window.start, window.end)
            )
            actor = {"type": "scoped_api_key_actor", "scoped_api_key_id": api_key_id(member.public_id)}
            scope = {"type": "api_key", "api_key_id": api_key_id(member.public_id)}
            rows.append(_summary(actor, scope, chosen, period, spent, window))
    return rows


def _summary(
    actor: dict[str, Any], scope: dict[str, Any], chosen: SpendLimitInfo, period: str, spent: int, window: PeriodSpend
) -> dict[str, Any]:
    """One ``SpendSummary`` row: who, the limit that binds them in ``period``, what they spent."""
    return {
        "actor": actor,
        "scope": scope,
        "source": scope_json(chosen),
        "spend_limit_id": chosen.public_id,
        "period": period,
        "amount": None if chosen.amount_micros is None else cents(chosen.amount_micros),
        "currency": CURRENCY,
        "period_to_date_spend": fractional_cents(spent),
        "period_start": rfc3339(window.start),
        "resets_at": rfc3339(window.end),
    }


def _owns(limit: SpendLimitInfo, user_id: int, group_ids: Sequence[int]) -> bool:
    """Whether ``limit`` is the person's own or one of their groups'."""
    return (limit.scope_type == SCOPE_USER and limit.scope_id == user_id) or (
        limit.scope_type == SCOPE_GROUP and limit.scope_id in group_ids
    )


def effective_people_rows(
    store: Store, persons: Sequence[PersonInfo], periods: Sequence[str], now: datetime
) -> list[dict[str, Any]]:
    """``SpendSummary`` rows per person (``user_actor``): for each period with a limit that applies
    to every request of theirs (the gateway's, their organisation's, their own, their groups'), the
    one that binds, and what all their keys spent in the period (their own limit's counter, else
    the ledger)."""
    spend = spend_limits(store)
    limits = spend.list_limits()
    current = spend.current(limits, now)
    rows = []
    for person in persons:
        keys: Sequence[int] | None = None  # the person's keys, read once when a period needs the ledger
        for period in periods:
            applying = [
                limit
                for limit in limits
                if limit.period == period
                and (
                    limit.scope_type == SCOPE_GATEWAY
                    or (limit.scope_type == SCOPE_ORG and person.org_id is not None and limit.scope_id == person.org_id)
                    or _owns(limit, person.id, person.group_ids)
                )
            ]
            if not applying:
                continue
            chosen = _binding(applying, current)
            own = next((limit for limit in applying if limit.scope_type == SCOPE_USER), None)
            window = current[chosen.id]
            if own is not None:
                spent = current[own.id].spent_micros
            else:
                if keys is None:
                    keys = people_keys(store.engine, [person.id])
                spent = keys_spend(store.engine, keys, window.start, window.end)
            actor = {
                "type": "user_actor",
                "user_id": person.public_id,
                "email_address": person.email or None,
                "name": person.name or None,
                "deleted": False,
            }
            rows.append(_summary(actor, {"type": "user", "user_id": person.public_id}, chosen, period, spent, window))
    return rows


# ---------------------------------------------------------------- the wire schemas


class _ScopeField(fields.Dict):
    """A scope object: ``{"type": "organization"}``, ``{"type": "workspace", "workspace_id": …}``
    or ``{"type": "api_key", "api_key_id": …}``."""


class SetSpendLimitSchema(Schema):
    """The body of ``set``: ``amount`` must be present (null: explicitly no limit)."""

    class Meta:
        unknown = RAISE

    amount = fields.Str(required=True, allow_none=True, metadata={"description": "integer cents; null: no limit"})
    scope = _ScopeField(required=True)
    period = fields.Str(load_default=DEFAULT_PERIOD, validate=validate.OneOf(PERIODS))
    thresholds = fields.List(
        fields.Int(strict=True, validate=validate.Range(min=1, max=1000)),
        load_default=None,
        metadata={"description": "extension: alert percentages of the amount (default: [alerts] thresholds)"},
    )

    @validates_schema
    def _amount_in_cents(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("amount") is not None:
            try:
                cents_to_micros(data["amount"])
            except ValueError as exc:
                raise ValidationError(str(exc), "amount") from None


class SpendLimitSchema(Schema):
    id = fields.Str()
    type = fields.Str(metadata={"enum": ["spend_limit"]})
    scope = _ScopeField()
    period = fields.Str(metadata={"enum": list(PERIODS)})
    amount = fields.Str(allow_none=True)
    currency = fields.Str()
    is_enabled = fields.Bool()
    thresholds = fields.List(fields.Int())
    created_at = fields.Str()
    updated_at = fields.Str()


class SpendLimitPageSchema(Schema):
    data = fields.List(fields.Nested(SpendLimitSchema))
    has_more = fields.Bool()
    next_page = fields.Str(allow_none=True)


class SpendLimitDeletedSchema(Schema):
    id = fields.Str()
    type = fields.Str(metadata={"enum": ["spend_limit_deleted"]})


class SpendSummarySchema(Schema):
    actor = fields.Dict()
    scope = _ScopeField()
    source = _ScopeField()
    spend_limit_id = fields.Str()
    period = fields.Str(metadata={"enum": list(PERIODS)})
    amount = fields.Str(allow_none=True)
    currency = fields.Str()
    period_to_date_spend = fields.Str()
    period_start = fields.Str()
    resets_at = fields.Str()


class SpendSummaryPageSchema(Schema):
    data = fields.List(fields.Nested(SpendSummarySchema))
    has_more = fields.Bool()
    next_page = fields.Str(allow_none=True)


class _ListQuery(Schema):
    """Documented query parameters (lists come as ``name[]``, read with ``parse_list``)."""

    class Meta:
        unknown = EXCLUDE

    limit = fields.Int(metadata={"description": "limits per page (default 20, at most 1000)"})
    page = fields.Str()
    scope_type = fields.List(
        fields.Str(), data_key="scope_type[]", metadata={"description": ", ".join(API_SCOPE_TYPES)}
    )
    workspace_id = fields.Str(metadata={"description": "the limits of this workspace and of its keys"})
    api_key_id = fields.Str(metadata={"description": "extension: the limits of this key"})
    user_id = fields.Str(metadata={"description": "extension: the limits of this person (user_… or email)"})
    rbac_group_id = fields.Str(metadata={"description": "extension: the limits of this group (group_… or name)"})


class _EffectiveQuery(Schema):
    class Meta:
        unknown = EXCLUDE

    limit = fields.Int(metadata={"description": "keys per page (default 20, at most 1000)"})
    page = fields.Str()
    period = fields.List(fields.Str(), data_key="period[]")
    api_key_ids = fields.List(fields.Str(), data_key="api_key_ids[]", metadata={"description": "extension"})
    user_ids = fields.List(
        fields.Str(), data_key="user_ids[]", metadata={"description": "one row per person and period (user_actor)"}
    )


# ---------------------------------------------------------------- the views


def _store() -> Store:
    store: Store = current_app.extensions["ezat_store"]
    return store


def _default_thresholds() -> tuple[int, ...]:
    """``[alerts] thresholds``: what a limit that names none alerts at."""
    config = current_app.extensions.get("ezat_admin_config")  # admin.api's CONFIG_EXTENSION
    alerts = getattr(config, "alerts", None)
    return tuple(alerts.thresholds) if alerts is not None else DEFAULT_THRESHOLDS


def _scope_of(body: Mapping[str, Any]) -> Scope:
    kind = body.get("type")
    if kind == "organization":
        return Scope(SCOPE_GATEWAY)
    if kind == "workspace" and isinstance(body.get("workspace_id"), str) and body["workspace_id"]:
        return Scope(SCOPE_ORG, body["workspace_id"])
    if kind == "api_key" and isinstance(body.get("api_key_id"), str) and body["api_key_id"]:
        return Scope(SCOPE_KEY, body["api_key_id"])
    if kind == "user" and isinstance(body.get("user_id"), str) and body["user_id"]:
        return Scope(SCOPE_USER, body["user_id"])
    if kind == "rbac_group" and isinstance(body.get("rbac_group_id"), str) and body["rbac_group_id"]:
        return Scope(SCOPE_GROUP, body["rbac_group_id"])
    raise AdminInvalidRequestError(
        'scope: must be {"type": "organization"}, {"type": "workspace", "workspace_id": "wrkspc_…"}, '
        '{"type": "user", "user_id": "user_…"}, {"type": "rbac_group", "rbac_group_id": "group_…"} or '
        '{"type": "api_key", "api_key_id": "apikey_…"}'
    )


def _store_error(exc: StoreError) -> AdminInvalidRequestError:
    return AdminInvalidRequestError(str(exc))


@blp.route("/spend_limits", methods=["POST"])
@blp.arguments(SetSpendLimitSchema)
@blp.response(200, SpendLimitSchema)
def set_spend_limit(body: dict[str, Any]) -> dict[str, Any]:
    """Set a spend limit (an upsert on scope and period)."""
    ctx = admin_context(write=True)
    amount = None if body["amount"] is None else cents_to_micros(body["amount"])
    try:
        limit = set_limit(
            _store(), ctx, _scope_of(body["scope"]), body["period"], amount, thresholds=body["thresholds"]
        )
    except StoreError as exc:
        raise _store_error(exc) from None
    return limit_json(limit, _default_thresholds())


@blp.route("/spend_limits", methods=["GET"])
@blp.arguments(_ListQuery, location="query")
@blp.response(200, SpendLimitPageSchema)
def list_spend_limits(_query: dict[str, Any]) -> dict[str, Any]:
    """List spend limits: gateway first, then workspaces, then keys (cursor pages)."""
    admin_context()
    store = _store()
    wanted = parse_list(request.args, "scope_type")
    unknown = [t for t in wanted if t not in API_SCOPE_TYPES]
    if unknown:
        raise AdminInvalidRequestError(
            f"scope_type: {', '.join(map(repr, unknown))} doesn't apply to this gateway "
            f"(it has {', '.join(API_SCOPE_TYPES)})"
        )
    limits = spend_limits(store).list_limits([API_SCOPE_TYPES[t] for t in wanted] or None)
    if request.args.get("workspace_id"):
        workspace = find_org(store, request.args["workspace_id"])
        limits = [s for s in limits if s.scope_type != SCOPE_GATEWAY and s.org_id == workspace.id]
    if request.args.get("api_key_id"):
        key = key_public_id(request.args["api_key_id"])
        limits = [s for s in limits if s.scope_type == SCOPE_KEY and s.scope_name == key]
    if request.args.get("user_id"):
        from ezat_compat.admin.users import find_person

        person = find_person(store, request.args["user_id"])
        limits = [s for s in limits if s.scope_type == SCOPE_USER and s.scope_id == person.id]
    if request.args.get("rbac_group_id"):
        from ezat_compat.admin.groups import find_group

        group = find_group(store, request.args["rbac_group_id"])
        limits = [s for s in limits if s.scope_type == SCOPE_GROUP and s.scope_id == group.id]
    defaults = _default_thresholds()
    page = cursor_page(
        limits,  # in this order (SpendLimits.list)
        limit=parse_limit(request.args.get("limit")),
        page=request.args.get("page") or None,
        key_of=lambda s: [SCOPE_TYPES.index(s.scope_type), s.scope_name, PERIODS.index(s.period), s.id],
    )
    return {**page, "data": [limit_json(limit, defaults) for limit in page["data"]]}


@blp.route("/spend_limits/effective", methods=["GET"])
@blp.arguments(_EffectiveQuery, location="query")
@blp.response(200, SpendSummaryPageSchema)
def effective_spend_limits(_query: dict[str, Any]) -> dict[str, Any]:
    """Per key, for each period a limit applies in, the one that binds and the key's spend so far;
    with ``user_ids[]``, per person (``user_actor``) instead, with all their keys' spend."""
    admin_context()
    store = _store()
    periods = parse_list(request.args, "period") or list(PERIODS)
    bad = [p for p in periods if p not in PERIODS]
    if bad:
        raise AdminInvalidRequestError(f"period: {', '.join(map(repr, bad))} is not one of {', '.join(PERIODS)}")
    user_ids = parse_list(request.args, "user_ids")
    if user_ids:
        if parse_list(request.args, "api_key_ids"):
            raise AdminInvalidRequestError("user_ids and api_key_ids: send one of them, not both")
        if len(user_ids) > 100:
            raise AdminInvalidRequestError(f"user_ids: at most 100, got {len(user_ids)}")
        from ezat_compat.admin.users import find_person

        persons = sorted(
            {p.public_id: p for p in (find_person(store, i) for i in user_ids)}.values(), key=lambda p: p.public_id
        )
        people_page = cursor_page(
            persons,
            limit=parse_limit(request.args.get("limit")),
            page=request.args.get("page") or None,
            key_of=lambda person: person.public_id,
        )
        ordered = [p for p in PERIODS if p in periods]
        return {**people_page, "data": effective_people_rows(store, people_page["data"], ordered, datetime.now(UTC))}
    ids = parse_list(request.args, "api_key_ids")
    members = spend_limits(store).members([key_public_id(i) for i in ids] if ids else None)
    page = cursor_page(
        members,
        limit=parse_limit(request.args.get("limit")),
        page=request.args.get("page") or None,
        key_of=lambda member: member.public_id,
    )
    now = datetime.now(UTC)
    ordered_periods = [p for p in PERIODS if p in periods]
    return {**page, "data": effective_rows(store, page["data"], ordered_periods, now)}


@blp.route("/spend_limits/<spend_limit_id>", methods=["GET"])
@blp.response(200, SpendLimitSchema)
def retrieve_spend_limit(spend_limit_id: str) -> dict[str, Any]:
    """One spend limit."""
    admin_context()
    try:
        limit = spend_limits(_store()).get(spend_limit_id)
    except StoreError:
        raise AdminNotFoundError(f"There is no spend limit {spend_limit_id!r}.") from None
    return limit_json(limit, _default_thresholds())


@blp.route("/spend_limits/<spend_limit_id>", methods=["DELETE"])
@blp.response(200, SpendLimitDeletedSchema)
def delete_spend_limit(spend_limit_id: str) -> dict[str, Any]:
    """Delete a spend limit (requests holding on it settle without it)."""
    ctx = admin_context(write=True)
    limit = delete_limit(_store(), ctx, spend_limit_id)
    return {"id": limit.public_id, "type": "spend_limit_deleted"}
