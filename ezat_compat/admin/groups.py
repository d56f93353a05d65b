"""``/v1/organizations/rbac_groups``: the IdP groups the gateway maps, in the wire shapes of
Anthropic's Admin API (the ``anthropic`` SDK's ``client.organization.rbac_groups``: create, list,
retrieve, update, delete; ``.members.list``), and the service under both the API and the CLI
(``groups …``).

What maps (docs/admin-api.md, "People and groups"):

- an rbac group is a mapping of one IdP group (``idp_groups``): ``name`` is the group as the
  IdP's groups claim writes it (a name, or the IdP's id where it sends ids) and is unique here;
  ``id`` its ``group_…`` (a path takes the name too). ``role_ids`` is always ``[]`` (the console's
  roles come from ``[identity] admins``/``viewers``), ``source_type`` always ``direct``.
- extensions on the object: ``workspace_id`` (the organisation that pays for its members'
  requests; null: none), ``models`` (the patterns its members may use; ``[]``: every model),
  ``user_spend_limits`` (``{"daily", "weekly", "monthly"}``: the cap each member gets at sign-in,
  US cents as a decimal string, null: none) and ``source`` (``config``: set in ``[identity.groups]``
  of the configuration file, rewritten at each start and read-only here (409); ``api``: made here).
- members are who the IdP says: ``members.list`` shows the people whose last sign-in put them
  in the group; adding or removing one is the IdP's business (400).

Every change leaves an audit row (``rbac_group.create``, ``.update``, ``.delete``); deleting a
group also deletes its spend limits (each with its ``spend_limit.delete`` row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flask import current_app, request
from flask_smorest import Blueprint
from marshmallow import RAISE, Schema, ValidationError, fields, validate

from ezat_compat.admin.auth import AdminContext, admin_context
from ezat_compat.admin.errors import AdminConflictError, AdminInvalidRequestError, AdminNotFoundError
from ezat_compat.admin.money import cents_to_micros, micros_to_cents
from ezat_compat.admin.pages import cursor_page, parse_limit, rfc3339
from ezat_compat.admin.service import find_org, record_change
from ezat_compat.store.accounts import StoreError
from ezat_compat.store.people import SOURCE_API, SOURCE_CONFIG, GroupInfo, People
from ezat_compat.store.spend import SCOPE_GROUP

if TYPE_CHECKING:
    from ezat_compat.store.store import Store

blp = Blueprint(
    "admin_rbac_groups",
    __name__,
    url_prefix="/v1/organizations",
    description="The IdP groups the gateway maps to an organisation, models and per-person caps.",
)

PERIOD_FIELDS = (("daily", "daily_micros"), ("weekly", "weekly_micros"), ("monthly", "monthly_micros"))
_UNSET: Any = object()


# ---------------------------------------------------------------- the service (API and CLI)


def people(store: Store) -> People:
    """The store's people (every kind of store has them)."""
    assert store.people is not None, "open_store makes the people"
    return store.people


def find_group(store: Store, ref: str) -> GroupInfo:
    """The group whose id (``group_…``) or name is ``ref``; 404 if none."""
    try:
        return people(store).get_group(ref)
    except StoreError:
        raise AdminNotFoundError(
            f"There is no rbac group {ref!r} (an id group_… or the IdP group's name); `groups list` shows them."
        ) from None


def snapshot(group: GroupInfo) -> dict[str, Any]:
    """A group as the audit trail and ``groups list --json`` show it (money in US dollars)."""
    from ezat_compat.pricing import micros_to_usd

    return {
        "id": group.public_id,
        "name": group.name,
        "org": group.org or None,
        "models": list(group.models),
        **{
            f"{period}_usd": None if (value := getattr(group, column)) is None else micros_to_usd(value)
            for period, column in PERIOD_FIELDS
        },
        "rpm": group.rpm,
        "tpm": group.tpm,
        "source": group.source,
        "created_at": rfc3339(group.created_at),
        "updated_at": rfc3339(group.updated_at),
    }


def _writable(group: GroupInfo, config_path: str) -> None:
    if group.source == SOURCE_CONFIG:
        where = f"[identity.groups] of {config_path}" if config_path else "[identity.groups] of the configuration file"
        raise AdminConflictError(
            f"The group {group.name!r} is set in {where}; change it there (the file rewrites it at each start)."
        )


def put_group(
    store: Store,
    ctx: AdminContext,
    name: str,
    *,
    create: bool | None = None,
    org: str | None = None,
    models: Sequence[str] | None = None,
    caps: Mapping[str, int | None] | None = None,
    rates: Mapping[str, int | None] | None = None,
    config_path: str = "",
) -> GroupInfo:
    """Create the mapping of IdP group ``name`` or change it: ``org`` (an organisation's name or
    workspace id; "" for none), ``models`` (``[]``: every model) and per-person ``caps`` (period ->
    micro-USD or None); what isn't given stays. ``create`` True: 409 if it exists; False: 404 if it
    doesn't; None: either. A group of the configuration file is read-only (409)."""
    existing: GroupInfo | None
    try:
        existing = people(store).get_group(name)
    except StoreError:
        existing = None
    if create is True and existing is not None:
        raise AdminConflictError(f"There is a group {name!r} already ({existing.public_id}); update it instead.")
    if create is False and existing is None:
        raise AdminNotFoundError(f"There is no rbac group {name!r}; `groups list` shows them.")
    if existing is not None:
        _writable(existing, config_path)
    org_name = (existing.org if existing else "") if org is None else (find_org(store, org).name if org else "")
    patterns = (list(existing.models) if existing else []) if models is None else list(models)
    values = {column: (getattr(existing, column) if existing else None) for _, column in PERIOD_FIELDS}
    for period, column in PERIOD_FIELDS:
        if caps is not None and period in caps:
            values[column] = caps[period]
    for rate in ("rpm", "tpm"):
        values[rate] = (rates or {}).get(rate, getattr(existing, rate) if existing else None)
    before, after = people(store).put_group(
        existing.name if existing else name, org=org_name, models=patterns, source=SOURCE_API, **values
    )
    if before is None or snapshot(before) != snapshot(after):
        action = "rbac_group.create" if before is None else "rbac_group.update"
        record_change(
            store,
            ctx,
            action,
            "rbac_group",
            after.public_id,
            None if before is None else snapshot(before),
            snapshot(after),
        )
    return after


def rename(store: Store, ctx: AdminContext, ref: str, new_name: str, *, config_path: str = "") -> GroupInfo:
    """Map the group ``ref`` to the IdP group ``new_name`` instead (its id, settings and spend
    limits stay; the people of each name are remapped at once)."""
    before = find_group(store, ref)
    _writable(before, config_path)
    after = people(store).rename_group(before.public_id, new_name)
    if snapshot(after) != snapshot(before):
        record_change(store, ctx, "rbac_group.update", "rbac_group", after.public_id, snapshot(before), snapshot(after))
    return after


def delete_group(store: Store, ctx: AdminContext, ref: str, *, config_path: str = "") -> GroupInfo:
    """Forget a group (its members lose what it gave them at once) and its spend limits."""
    from ezat_compat.admin.spend import delete_limit, spend_limits

    group = find_group(store, ref)
    _writable(group, config_path)
    for limit in spend_limits(store).list_limits([SCOPE_GROUP]):
        if limit.scope_id == group.id:
            delete_limit(store, ctx, limit.public_id)
    gone = people(store).delete_group(group.public_id)
    record_change(store, ctx, "rbac_group.delete", "rbac_group", gone.public_id, snapshot(gone), None)
    return gone


# ---------------------------------------------------------------- the object


def group_json(group: GroupInfo, workspaces: Mapping[int, str]) -> dict[str, Any]:
    """A group as the Admin API's ``RBACGroup``, with our extensions."""
    return {
        "id": group.public_id,
        "type": "rbac_group",
        "name": group.name,
        "created_at": rfc3339(group.created_at),
        "updated_at": rfc3339(group.updated_at),
        "role_ids": [],
        "source_type": "direct",
        "source": group.source,
        "workspace_id": workspaces.get(group.org_id) if group.org_id is not None else None,
        "models": list(group.models),
        "user_spend_limits": {
            period: None if (value := getattr(group, column)) is None else micros_to_cents(value)
            for period, column in PERIOD_FIELDS
        },
        "user_rate_limits": {"rpm": group.rpm, "tpm": group.tpm},
    }


def _workspaces(store: Store) -> dict[int, str]:
    return {o.id: o.public_id for o in store.accounts.list_orgs_by_creation()}


# ---------------------------------------------------------------- shapes


def _caps(value: Any) -> None:
    if not isinstance(value, dict):
        raise ValidationError("must be an object with daily, weekly and monthly")
    unknown = set(value) - {p for p, _ in PERIOD_FIELDS}
    if unknown:
        raise ValidationError(f"unknown period {', '.join(sorted(unknown))}; use daily, weekly, monthly")
    for period, amount in value.items():
        if amount is not None:
            try:
                cents_to_micros(amount, period)
            except ValueError as exc:
                raise ValidationError(str(exc)) from None


class _Strict(Schema):
    class Meta:
        unknown = RAISE


class _GroupFields(_Strict):
    workspace_id = fields.Str(
        allow_none=True, metadata={"description": "Extension: who pays for its members (id or name; null: none)"}
    )
    models = fields.List(fields.Str(), allow_none=True, metadata={"description": "Extension: [] for every model"})
    user_spend_limits = fields.Raw(
        validate=_caps,
        metadata={"description": "Extension: each member's cap per period, US cents (decimal strings; null: none)"},
    )
    user_rate_limits = fields.Nested(
        lambda: UserRateLimitsSchema(),
        metadata={"description": "Extension: each member's requests and tokens per minute (null: none)"},
    )


class UserRateLimitsSchema(_Strict):
    rpm = fields.Int(allow_none=True, validate=validate.Range(min=1))
    tpm = fields.Int(allow_none=True, validate=validate.Range(min=1))


class RBACGroupCreateSchema(_GroupFields):
    name = fields.Str(required=True, metadata={"description": "The IdP group, as its groups claim writes it"})


class RBACGroupUpdateSchema(_GroupFields):
    name = fields.Str(allow_none=True)


class UserSpendLimitsSchema(Schema):
    daily = fields.Str(allow_none=True)
    weekly = fields.Str(allow_none=True)
    monthly = fields.Str(allow_none=True)


class RBACGroupSchema(Schema):
    id = fields.Str()
    type = fields.Str(metadata={"enum": ["rbac_group"]})
    name = fields.Str()
    created_at = fields.Str()
    updated_at = fields.Str()
    role_ids = fields.List(fields.Str())
    source_type = fields.Str(metadata={"enum": ["direct"]})
    source = fields.Str(metadata={"enum": [SOURCE_CONFIG, SOURCE_API], "description": "Extension"})
    workspace_id = fields.Str(allow_none=True, metadata={"description": "Extension"})
    models = fields.List(fields.Str(), metadata={"description": "Extension"})
    user_spend_limits = fields.Nested(UserSpendLimitsSchema, metadata={"description": "Extension"})
    user_rate_limits = fields.Nested(UserRateLimitsSchema, metadata={"description": "Extension"})


class RBACGroupPageSchema(Schema):
    data = fields.List(fields.Nested(RBACGroupSchema))
    has_more = fields.Bool()
    next_page = fields.Str(allow_none=True)


class DeletedRBACGroupSchema(Schema):
    id = fields.Str()
    type = fields.Str(metadata={"enum": ["rbac_group_deleted"]})


class MemberSchema(Schema):
    type = fields.Str(metadata={"enum": ["rbac_group_member"]})
    rbac_group_id = fields.Str()
    user_id = fields.Str()
    email = fields.Str()
    created_at = fields.Str(metadata={"description": "The person's first sign-in"})


class MemberPageSchema(Schema):
    data = fields.List(fields.Nested(MemberSchema))
    has_more = fields.Bool()
    next_page = fields.Str(allow_none=True)


class PageQuery(Schema):
    limit = fields.Int(metadata={"description": "default 20, at most 1000"})
    page = fields.Str(allow_none=True)


# ---------------------------------------------------------------- views


def _store() -> Store:
    store: Store = current_app.extensions["ezat_store"]
    return store


def _config_path() -> str:
    config = current_app.extensions.get("ezat_admin_config")  # admin.api's CONFIG_EXTENSION
    return str(getattr(config, "path", "") or "")


def _cap_changes(body: Mapping[str, Any]) -> dict[str, int | None] | None:
    if "user_spend_limits" not in body:
        return None
    given = body["user_spend_limits"] or {}
    return {p: None if given[p] is None else cents_to_micros(given[p], p) for p in given}


@blp.route("/rbac_groups", methods=["POST"])
@blp.arguments(RBACGroupCreateSchema)
@blp.response(200, RBACGroupSchema)
def create_rbac_group(body: dict[str, Any]) -> dict[str, Any]:
    """Map an IdP group: ``name`` as its groups claim writes it; ``workspace_id``, ``models`` and
    ``user_spend_limits`` are extensions. 409 if it is mapped already."""
    ctx = admin_context(write=True)
    store = _store()
    group = put_group(
        store,
        ctx,
        body["name"],
        create=True,
        org=body.get("workspace_id") or "",
        models=body.get("models") or [],
        caps=_cap_changes(body),
        rates=body.get("user_rate_limits"),
        config_path=_config_path(),
    )
    return group_json(group, _workspaces(store))


@blp.route("/rbac_groups", methods=["GET"])
@blp.arguments(PageQuery, location="query")
@blp.response(200, RBACGroupPageSchema)
def list_rbac_groups(_query: dict[str, Any]) -> dict[str, Any]:
    """The mapped groups, by name (cursor pages)."""
    admin_context()
    store = _store()
    page = cursor_page(
        people(store).list_groups(),
        limit=parse_limit(request.args.get("limit")),
        page=request.args.get("page") or None,
        key_of=lambda g: g.name,
    )
    workspaces = _workspaces(store)
    return {**page, "data": [group_json(g, workspaces) for g in page["data"]]}


@blp.route("/rbac_groups/<rbac_group_id>", methods=["GET"])
@blp.response(200, RBACGroupSchema)
def retrieve_rbac_group(rbac_group_id: str) -> dict[str, Any]:
    """One group, by id (``group_…``) or name."""
    admin_context()
    store = _store()
    return group_json(find_group(store, rbac_group_id), _workspaces(store))


@blp.route("/rbac_groups/<rbac_group_id>", methods=["POST"])
@blp.arguments(RBACGroupUpdateSchema)
@blp.response(200, RBACGroupSchema)
def update_rbac_group(body: dict[str, Any], rbac_group_id: str) -> dict[str, Any]:
    """Change a group: ``name`` maps it to another IdP group (its id and spend limits stay);
    ``workspace_id``, ``models`` and ``user_spend_limits`` (extensions) change what it gives.
    A group of the configuration file is read-only (409)."""
    ctx = admin_context(write=True)
    store = _store()
    path = _config_path()
    group = find_group(store, rbac_group_id)
    _writable(group, path)
    if body.get("name") and body["name"] != group.name:
        group = rename(store, ctx, group.public_id, body["name"], config_path=path)
    settings = {k for k in ("workspace_id", "models", "user_spend_limits", "user_rate_limits") if k in body}
    if settings:
        group = put_group(
            store,
            ctx,
            group.name,
            create=False,
            org=(body["workspace_id"] or "") if "workspace_id" in body else None,
            models=(body["models"] or []) if "models" in body else None,
            caps=_cap_changes(body),
            rates=body.get("user_rate_limits"),
            config_path=path,
        )
    return group_json(group, _workspaces(store))


@blp.route("/rbac_groups/<rbac_group_id>", methods=["DELETE"])
@blp.response(200, DeletedRBACGroupSchema)
def delete_rbac_group(rbac_group_id: str) -> dict[str, Any]:
    """Forget a group: its members lose what it gave them at their next request; its spend
    limits are deleted. A group of the configuration file is read-only (409)."""
    ctx = admin_context(write=True)
    group = delete_group(_store(), ctx, rbac_group_id, config_path=_config_path())
    return {"id": group.public_id, "type": "rbac_group_deleted"}


@blp.route("/rbac_groups/<rbac_group_id>/members", methods=["GET"])
@blp.arguments(PageQuery, location="query")
@blp.response(200, MemberPageSchema)
def list_rbac_group_members(_query: dict[str, Any], rbac_group_id: str) -> dict[str, Any]:
    """The people whose last sign-in put them in the group (cursor pages, oldest first)."""
    admin_context()
    store = _store()
    group = find_group(store, rbac_group_id)
    members = [p for p in people(store).list_people() if group.id in p.group_ids]
    page = cursor_page(
        members,
        limit=parse_limit(request.args.get("limit")),
        page=request.args.get("page") or None,
        key_of=lambda p: p.id,
    )
    return {
        **page,
        "data": [
            {
                "type": "rbac_group_member",
                "rbac_group_id": group.public_id,
                "user_id": p.public_id,
                "email": p.email,
                "created_at": rfc3339(p.created_at),
            }
            for p in page["data"]
        ],
    }


@blp.route("/rbac_groups/<rbac_group_id>/members", methods=["POST"])
def add_rbac_group_member(rbac_group_id: str) -> dict[str, Any]:
    """Members come from the IdP's groups claim: adding one here is refused (400)."""
    admin_context(write=True)
    group = find_group(_store(), rbac_group_id)
    raise AdminInvalidRequestError(
        f"Members of {group.name!r} are who the IdP says at their sign-in; add the person to the group at the IdP."
    )


@blp.route("/rbac_groups/<rbac_group_id>/members/<user_id>", methods=["DELETE"])
def remove_rbac_group_member(rbac_group_id: str, user_id: str) -> dict[str, Any]:
    """Members come from the IdP's groups claim: removing one here is refused (400)."""
    admin_context(write=True)
    group = find_group(_store(), rbac_group_id)
    raise AdminInvalidRequestError(
        f"Members of {group.name!r} are who the IdP says at their sign-in; remove the person from the group at "
        "the IdP (or disable them: POST /v1/organizations/users/{id}/disable)."
    )
