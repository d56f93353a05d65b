"""``/v1/organizations/me``, workspaces (our organisations) and rate limits, in the wire shapes of
Anthropic's Admin API (the ``anthropic`` SDK's ``client.organization.retrieve``, ``.workspaces``,
``.rate_limits``, ``.workspaces.rate_limits``), plus our extensions.

What maps (docs/admin-api.md):

- a workspace is an organisation: ``id`` its workspace id (``wrkspc_…``; the name is taken too),
  ``name`` its name (letters, digits, ``.``, ``_``, ``-``: it is also the CLI's handle), archive
  is suspend (every key refused with 403) and, unlike Anthropic's, can be undone
  (``POST …/unarchive``, an extension). Fields with no counterpart here (data residency, tags,
  external keys, user profiles) are answered with Anthropic's defaults and refused when set.
- extensions on a workspace: ``balance`` (US cents, decimal strings; ``POST …/top_up``),
  ``models`` (what its keys may use at most) and ``rate_limits``.
- rate limits: the gateway has one rate-limit group, every model (``RATE_LIMIT_GROUP``), with no
  organisation-wide limit. A workspace's ``requests_per_minute`` and ``tokens_per_minute`` cap
  **each of its keys** (the lower of the key's own and the workspace's applies), not the
  workspace's keys together as Anthropic's do. Other limiter types are refused.
"""

from __future__ import annotations

from typing import Any

from flask import current_app
from flask_smorest import Blueprint
from marshmallow import RAISE, Schema, ValidationError, fields, validate

from ezat_compat.admin import service
from ezat_compat.admin.auth import admin_context
from ezat_compat.admin.errors import AdminInvalidRequestError, AdminNotFoundError
from ezat_compat.admin.money import cents_to_micros, micros_to_cents
from ezat_compat.admin.pages import DEFAULT_LIMIT, MAX_LIMIT, cursor_page, rfc3339, sync_page
from ezat_compat.catalog import Catalog
from ezat_compat.domain import Config
from ezat_compat.store.accounts import OrgInfo
from ezat_compat.store.store import Store

blp = Blueprint(
    "admin_workspaces",
    __name__,
    url_prefix="/v1/organizations",
    description="The organization, its workspaces (the gateway's organisations) and rate limits.",
)

DISPLAY_COLOR = "#6C5BB9"
DATA_RESIDENCY = {"workspace_geo": "us", "allowed_inference_geos": "unrestricted", "default_inference_geo": "global"}
ORGANIZATION_ID = "org_gateway"  # the gateway as a whole is the Admin API's one organization
RATE_LIMIT_ID = "rl_all_models"  # the one organization rate-limit entry (``rate_limit_id``)
RATE_LIMIT_GROUP = {"id": "rlg_all_models", "type": "model_group", "display_name": "Every model of the gateway"}
# Anthropic's limiter types -> the organisation's column (the only ones the gateway keeps)
LIMITER_TO_COLUMN = {"requests_per_minute": "rpm", "tokens_per_minute": "tpm"}
# Workspace fields the gateway has no counterpart for: a value other than these is refused.
UNSUPPORTED_EMPTY: dict[str, tuple[Any, ...]] = {
    "data_residency": (None,),
    "display_color": (None,),
    "external_key_id": (None,),
    "tags": (None, {}),
    "user_profile_id": (None,),
}


def _store() -> Store:
    store: Store = current_app.extensions["ezat_store"]
    return store


def _config() -> Config:
    config: Config = current_app.extensions["ezat_admin_config"]
    return config


# ---------------------------------------------------------------- shapes


def _cents(value: Any) -> None:
    try:
        cents_to_micros(value)
    except ValueError as exc:
        raise ValidationError(str(exc).split(": ", 1)[-1]) from None


class _Strict(Schema):
    class Meta:
        unknown = RAISE


class _Loose(Schema):
    """A dumped object: the fields written out, whatever else is known."""


class BalanceSchema(_Loose):
    amount = fields.Str(metadata={"description": "The balance, US cents (decimal string, up to 4 decimals)"})
    reserved = fields.Str(metadata={"description": "Held for requests in flight, US cents"})
    available = fields.Str(metadata={"description": "What new requests may still reserve, US cents"})
    currency = fields.Str()


class WorkspaceRateLimitsSchema(_Loose):
    requests_per_minute = fields.Int(allow_none=True)
    tokens_per_minute = fields.Int(allow_none=True)


class WorkspaceSchema(_Loose):
    id = fields.Str()
    type = fields.Str()
    name = fields.Str()
    created_at = fields.Str()
    archived_at = fields.Str(allow_none=True)
    display_color = fields.Str()
    compartment_id = fields.Str()
    data_residency = fields.Dict()
    external_key_id = fields.Str(allow_none=True)
    tags = fields.Dict()
    user_profile_id = fields.Str(allow_none=True)
    balance = fields.Nested(BalanceSchema, metadata={"description": "Extension: the organisation's balance"})
    models = fields.List(fields.Str(), metadata={"description": "Extension: model patterns its keys may use"})
    rate_limits = fields.Nested(WorkspaceRateLimitsSchema, metadata={"description": "Extension: each key's caps"})


class WorkspacePageSchema(_Loose):
    data = fields.List(fields.Nested(WorkspaceSchema))
    has_more = fields.Bool()
    first_id = fields.Str(allow_none=True)
    last_id = fields.Str(allow_none=True)


class WorkspaceListQuery(Schema):
    after_id = fields.Str()
    before_id = fields.Str()
    limit = fields.Int(load_default=DEFAULT_LIMIT, validate=validate.Range(min=1, max=MAX_LIMIT))
    ids = fields.List(fields.Str(), data_key="ids[]", validate=validate.Length(max=100))
    include_archived = fields.Bool(load_default=False)
    include_default = fields.Bool(load_default=True, metadata={"description": "No default workspace here: ignored"})


class _WorkspaceFields(_Strict):
    data_residency = fields.Raw(allow_none=True)
    display_color = fields.Raw(allow_none=True)
    external_key_id = fields.Raw(allow_none=True)
    tags = fields.Raw(allow_none=True)
    user_profile_id = fields.Raw(allow_none=True)
    models = fields.List(
        fields.Str(), allow_none=True, metadata={"description": "Extension: [] or null for every model"}
    )


class WorkspaceCreateSchema(_WorkspaceFields):
    name = fields.Str(required=True)
    balance = fields.Str(validate=_cents, metadata={"description": "Extension: the starting balance, US cents"})


class WorkspaceUpdateSchema(_WorkspaceFields):
    name = fields.Str()


class TopUpSchema(_Strict):
    amount = fields.Str(required=True, validate=_cents, metadata={"description": "US cents to add (decimal string)"})


class OrganizationSchema(_Loose):
    id = fields.Str()
    name = fields.Str()
    type = fields.Str()


class LimitValueSchema(_Loose):
    type = fields.Str()
    value = fields.Int()


class OrganizationRateLimitSchema(_Loose):
    id = fields.Str()
    type = fields.Str()
    group = fields.Dict()
    limits = fields.List(fields.Nested(LimitValueSchema))
    models = fields.List(fields.Str(), allow_none=True)


class OrganizationRateLimitPageSchema(_Loose):
    data = fields.List(fields.Nested(OrganizationRateLimitSchema))
    has_more = fields.Bool()
    next_page = fields.Str(allow_none=True)


class WorkspaceLimitValueSchema(_Loose):
    type = fields.Str()
    value = fields.Int()
    org_limit = fields.Int(allow_none=True)
    source = fields.Dict()


class WorkspaceRateLimitSchema(_Loose):
    type = fields.Str()
    workspace_id = fields.Str()
    rate_limit_id = fields.Str()
    group = fields.Dict()
    limits = fields.List(fields.Nested(WorkspaceLimitValueSchema))
    models = fields.List(fields.Str(), allow_none=True)


class WorkspaceRateLimitPageSchema(_Loose):
    data = fields.List(fields.Nested(WorkspaceRateLimitSchema))
    has_more = fields.Bool()
    next_page = fields.Str(allow_none=True)


class RateLimitListQuery(Schema):
    group_type = fields.Str(
        validate=validate.OneOf(("batch", "files", "model_group", "skills", "token_count", "web_search"))
    )
    model = fields.Str()
    limit = fields.Int(validate=validate.Range(min=1, max=MAX_LIMIT))
    page = fields.Str()


class WorkspaceRateLimitListQuery(Schema):
    group_type = fields.Str(
        validate=validate.OneOf(("batch", "files", "model_group", "skills", "token_count", "web_search"))
    )
    include_inherited = fields.Bool(load_default=False)
    limit = fields.Int(validate=validate.Range(min=1, max=MAX_LIMIT))
    page = fields.Str()


class LimitChangeSchema(_Strict):
    type = fields.Str(required=True)
    value = fields.Int(required=True, allow_none=True, strict=True, validate=validate.Range(min=1))


class WorkspaceRateLimitUpdateSchema(_Strict):
    limits = fields.List(fields.Nested(LimitChangeSchema), required=True)


# ---------------------------------------------------------------- objects


def workspace_json(org: OrgInfo) -> dict[str, Any]:
    """An organisation as the Admin API's ``Workspace``, with our extensions."""
    return {
        "id": org.public_id,
        "type": "workspace",
        "name": org.name,
        "created_at": rfc3339(org.created_at),
        "archived_at": rfc3339(org.suspended_at) if org.suspended else None,
        "display_color": DISPLAY_COLOR,
        "compartment_id": "default",
        "data_residency": dict(DATA_RESIDENCY),
        "external_key_id": None,
        "tags": {},
        "user_profile_id": None,
        "balance": {
            "amount": micros_to_cents(org.balance_micros),
            "reserved": micros_to_cents(org.reserved_micros),
            "available": micros_to_cents(org.available_micros),
            "currency": "USD",
        },
        "models": list(org.models),
        "rate_limits": {"requests_per_minute": org.rpm, "tokens_per_minute": org.tpm},
    }


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, empty in UNSUPPORTED_EMPTY.items():
        if name in body and body[name] not in empty:
            raise AdminInvalidRequestError(f"{name}: not supported by this gateway; leave it out")


def _catalog_names(config: Config) -> list[str]:
    return [name for model in config.models for name in (model.id, *model.aliases)]


# ---------------------------------------------------------------- the organization


@blp.route("/me", methods=["GET"])
@blp.response(200, OrganizationSchema)
def retrieve_organization() -> dict[str, Any]:
    """The organization the admin key belongs to: the gateway as a whole."""
    admin_context()
    return {"id": ORGANIZATION_ID, "name": _config().server.name or "ezat-compat", "type": "organization"}


# ---------------------------------------------------------------- workspaces


@blp.route("/workspaces", methods=["GET"])
@blp.arguments(WorkspaceListQuery, location="query", as_kwargs=True)
@blp.response(200, WorkspacePageSchema)
def list_workspaces(**query: Any) -> dict[str, Any]:
    """Workspaces (organisations), oldest first; archived (suspended) ones with ``include_archived``."""
    admin_context()
    orgs = _store().accounts.list_orgs_by_creation()
    if not query["include_archived"]:
        orgs = [o for o in orgs if not o.suspended]
    if query.get("ids"):
        wanted = set(query["ids"])
        orgs = [o for o in orgs if o.public_id in wanted]
    page = sync_page(
        orgs,
        limit=query["limit"],
        after_id=query.get("after_id"),
        before_id=query.get("before_id"),
        id_of=lambda o: o.public_id,
    )
    return {**page, "data": [workspace_json(o) for o in page["data"]]}


@blp.route("/workspaces", methods=["POST"])
@blp.arguments(WorkspaceCreateSchema)
@blp.response(200, WorkspaceSchema)
def create_workspace(body: dict[str, Any]) -> dict[str, Any]:
    """A new workspace (organisation); ``balance`` (US cents) and ``models`` are extensions."""
    ctx = admin_context(write=True)
    _refuse_unsupported(body)
    store = _store()
    org = service.create_org(store, ctx, body["name"], cents_to_micros(body.get("balance", "0"), "balance"))
    if body.get("models"):
        org = service.update_org(store, ctx, org.public_id, models=body["models"])
    return workspace_json(org)


@blp.route("/workspaces/<workspace_id>", methods=["GET"])
@blp.response(200, WorkspaceSchema)
def retrieve_workspace(workspace_id: str) -> dict[str, Any]:
    """One workspace, by its id (or its name)."""
    admin_context()
    return workspace_json(service.find_org(_store(), workspace_id))


@blp.route("/workspaces/<workspace_id>", methods=["POST"])
@blp.arguments(WorkspaceUpdateSchema)
@blp.response(200, WorkspaceSchema)
def update_workspace(body: dict[str, Any], workspace_id: str) -> dict[str, Any]:
    """Rename a workspace, or change its ``models`` (an extension)."""
    ctx = admin_context(write=True)
    _refuse_unsupported(body)
    changes = {k: body[k] for k in ("name",) if k in body}
    if "models" in body:
        changes["models"] = body["models"] or []
    return workspace_json(service.update_org(_store(), ctx, workspace_id, **changes))


@blp.route("/workspaces/<workspace_id>/archive", methods=["POST"])
@blp.response(200, WorkspaceSchema)
def archive_workspace(workspace_id: str) -> dict[str, Any]:
    """Archive a workspace: the organisation is suspended, every key refused with 403 at once."""
    ctx = admin_context(write=True)
    return workspace_json(service.set_suspended(_store(), ctx, workspace_id, True))


@blp.route("/workspaces/<workspace_id>/unarchive", methods=["POST"])
@blp.response(200, WorkspaceSchema)
def unarchive_workspace(workspace_id: str) -> dict[str, Any]:
    """Extension: undo an archive (resume the organisation)."""
    ctx = admin_context(write=True)
    return workspace_json(service.set_suspended(_store(), ctx, workspace_id, False))


@blp.route("/workspaces/<workspace_id>/top_up", methods=["POST"])
@blp.arguments(TopUpSchema)
@blp.response(200, WorkspaceSchema)
def top_up_workspace(body: dict[str, Any], workspace_id: str) -> dict[str, Any]:
    """Extension: add ``amount`` US cents to the organisation's balance."""
    ctx = admin_context(write=True)
    micros = cents_to_micros(body["amount"])
    if micros <= 0:
        raise AdminInvalidRequestError("amount: must be more than 0")
    return workspace_json(service.top_up(_store(), ctx, workspace_id, micros))


# ---------------------------------------------------------------- rate limits


def _organization_entry(config: Config) -> dict[str, Any]:
    return {
        "id": RATE_LIMIT_ID,
        "type": "rate_limit",
        "group": dict(RATE_LIMIT_GROUP),
        "limits": [],  # no organization-wide limit: each key's own and its workspace's
        "models": _catalog_names(config),
    }


def _workspace_entries(org: OrgInfo, config: Config) -> list[dict[str, Any]]:
    limits = [
        {"type": limiter, "value": value, "org_limit": None, "source": {"type": "workspace"}}
        for limiter, value in (("requests_per_minute", org.rpm), ("tokens_per_minute", org.tpm))
        if value is not None
    ]
    if not limits:
        return []
    return [
        {
            "type": "workspace_rate_limit",
            "workspace_id": org.public_id,
            "rate_limit_id": RATE_LIMIT_ID,
            "group": dict(RATE_LIMIT_GROUP),
            "limits": limits,
            "models": _catalog_names(config),
        }
    ]


@blp.route("/rate_limits", methods=["GET"])
@blp.arguments(RateLimitListQuery, location="query", as_kwargs=True)
@blp.response(200, OrganizationRateLimitPageSchema)
def list_rate_limits(**query: Any) -> dict[str, Any]:
    """The organization's rate-limit entries: one group, every model, no organization-wide limit."""
    admin_context()
    config = _config()
    entries = [_organization_entry(config)]
    if query.get("group_type") not in (None, "model_group"):
        entries = []
    model = query.get("model")
    if model is not None and Catalog(config.models).resolve(model) is None:
        raise AdminNotFoundError(f"model: {model!r} is not a model of this gateway")
    return cursor_page(entries, limit=query.get("limit"), page=query.get("page"), key_of=lambda e: e["id"])


@blp.route("/workspaces/<workspace_id>/rate_limits", methods=["GET"])
@blp.arguments(WorkspaceRateLimitListQuery, location="query", as_kwargs=True)
@blp.response(200, WorkspaceRateLimitPageSchema)
def list_workspace_rate_limits(workspace_id: str, **query: Any) -> dict[str, Any]:
    """A workspace's caps on each of its keys (requests and tokens per minute)."""
    admin_context()
    org = service.find_org(_store(), workspace_id)
    entries = _workspace_entries(org, _config())
    if query.get("group_type") not in (None, "model_group"):
        entries = []
    return cursor_page(entries, limit=query.get("limit"), page=query.get("page"), key_of=lambda e: e["rate_limit_id"])


@blp.route("/workspaces/<workspace_id>/rate_limits/<rate_limit_id>", methods=["POST"])
@blp.arguments(WorkspaceRateLimitUpdateSchema)
@blp.response(200, WorkspaceRateLimitSchema)
def update_workspace_rate_limits(body: dict[str, Any], workspace_id: str, rate_limit_id: str) -> dict[str, Any]:
    """Set (a number) or clear (null) a workspace's ``requests_per_minute`` or
    ``tokens_per_minute``: each of its keys is held to it from its next request on."""
    ctx = admin_context(write=True)
    if rate_limit_id != RATE_LIMIT_ID:
        raise AdminNotFoundError(f"There is no rate limit {rate_limit_id!r}; this gateway has {RATE_LIMIT_ID!r}.")
    changes: dict[str, int | None] = {}
    for index, limit in enumerate(body["limits"]):
        column = LIMITER_TO_COLUMN.get(limit["type"])
        if column is None:
            kinds = ", ".join(LIMITER_TO_COLUMN)
            raise AdminInvalidRequestError(f"limits[{index}].type: {limit['type']!r} is not kept here; use {kinds}")
        changes[column] = limit["value"]
    org = service.update_org(_store(), ctx, workspace_id, **changes)
    entries = _workspace_entries(org, _config())
    if entries:
        return entries[0]
    return {
        "type": "workspace_rate_limit",
        "workspace_id": org.public_id,
        "rate_limit_id": RATE_LIMIT_ID,
        "group": dict(RATE_LIMIT_GROUP),
        "limits": [],
        "models": _catalog_names(_config()),
    }
