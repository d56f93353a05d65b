"""``/v1/organizations/api_keys``: our keys in the wire shapes of Anthropic's Admin API (the
``anthropic`` SDK's ``client.organization.api_keys``: list, retrieve, update) and our extensions.

What maps (docs/admin-api.md): ``id`` is ``apikey_`` + the key's hex id (``key_…`` is taken too);
``scope`` its organisation's workspace; ``status`` is ``archived`` (revoked: final), ``expired``,
``inactive`` (blocked: refused with 401 at once, until made ``active`` again) or ``active``;
``partial_key_hint`` its display prefix; ``created_by`` the admin key or CLI user that made it.

Extensions: create (``POST /api_keys``: the secret is in the answer, once), rotate
(``POST /api_keys/{id}/rotate`` with ``grace_seconds``: the previous secret keeps working until
then), and on the object ``models`` (model access), ``rate_limits`` (requests and tokens per
minute), ``expires_at`` (settable) and ``last_used_at`` (written at most once a minute per worker).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import current_app
from flask_smorest import Blueprint
from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from ezat_compat.admin import service
from ezat_compat.admin.auth import admin_context
from ezat_compat.admin.pages import DEFAULT_LIMIT, MAX_LIMIT, parse_time, rfc3339, sync_page
from ezat_compat.store.accounts import MAX_GRACE, KeyInfo, api_key_id
from ezat_compat.store.store import Store

blp = Blueprint(
    "admin_api_keys",
    __name__,
    url_prefix="/v1/organizations",
    description="API keys (the gateway's inference keys): list, retrieve, update; create and rotate (extensions).",
)

KEY_STATES = ("active", "archived", "expired", "inactive")


def _store() -> Store:
    store: Store = current_app.extensions["ezat_store"]
    return store


# ---------------------------------------------------------------- shapes


class _Strict(Schema):
    class Meta:
        unknown = RAISE


class KeyRateLimitsSchema(Schema):
    requests_per_minute = fields.Int(allow_none=True, strict=True, validate=validate.Range(min=1))
    tokens_per_minute = fields.Int(allow_none=True, strict=True, validate=validate.Range(min=1))

    class Meta:
        unknown = RAISE


class ApiKeySchema(Schema):
    id = fields.Str()
    type = fields.Str()
    name = fields.Str()
    status = fields.Str()
    created_at = fields.Str()
    created_by = fields.Dict(allow_none=True)
    expires_at = fields.Str(allow_none=True)
    partial_key_hint = fields.Str(allow_none=True)
    principal = fields.Dict(allow_none=True)
    scope = fields.Dict()
    models = fields.List(fields.Str(), metadata={"description": "Extension: model patterns ([]: every model)"})
    rate_limits = fields.Nested(KeyRateLimitsSchema, metadata={"description": "Extension: the key's own caps"})
    last_used_at = fields.Str(allow_none=True, metadata={"description": "Extension: within a minute"})


class ApiKeyWithSecretSchema(ApiKeySchema):
    secret = fields.Str(metadata={"description": "The key itself: shown in this answer only"})


class ApiKeyPageSchema(Schema):
    data = fields.List(fields.Nested(ApiKeySchema))
    has_more = fields.Bool()
    first_id = fields.Str(allow_none=True)
    last_id = fields.Str(allow_none=True)


class ApiKeyListQuery(Schema):
    after_id = fields.Str()
    before_id = fields.Str()
    limit = fields.Int(load_default=DEFAULT_LIMIT, validate=validate.Range(min=1, max=MAX_LIMIT))
    status = fields.Str(validate=validate.OneOf(KEY_STATES))
    workspace_id = fields.Str()
    created_by_user_id = fields.Str()


def _time(value: Any) -> None:
    if value is not None:
        parse_time(value, "expires_at")


class _KeyFields(_Strict):
    name = fields.Str(allow_none=True, validate=validate.Length(max=128))
    models = fields.List(fields.Str(), allow_none=True)
    rate_limits = fields.Nested(KeyRateLimitsSchema)
    expires_at = fields.Str(allow_none=True, validate=_time)


class ApiKeyCreateSchema(_KeyFields):
    workspace_id = fields.Str(required=True)


class ApiKeyUpdateSchema(_KeyFields):
    status = fields.Str(allow_none=True, validate=validate.OneOf(service.KEY_STATUSES))


class RotateSchema(_Strict):
    grace_seconds = fields.Int(
        load_default=0, strict=True, validate=validate.Range(min=0, max=int(MAX_GRACE.total_seconds()))
    )

    @validates_schema
    def _whole(self, data: dict[str, Any], **_: Any) -> None:
        if isinstance(data.get("grace_seconds"), bool):
            raise ValidationError({"grace_seconds": ["Not a valid integer."]})


# ---------------------------------------------------------------- objects


def _created_by(actor: str | None) -> dict[str, str] | None:
    if not actor:
        return None
    return {"id": actor, "type": "user" if actor.startswith("cli:") else "service_account"}


def api_key_json(key: KeyInfo, now: datetime) -> dict[str, Any]:
    """A key as the Admin API's ``APIKey``, with our extensions (never its secret)."""
    return {
        "id": api_key_id(key.id),
        "type": "api_key",
        "name": key.name,
        "status": key.status(now),
        "created_at": rfc3339(key.created_at),
        "created_by": _created_by(key.created_by),
        "expires_at": rfc3339(key.expires_at),
        "partial_key_hint": key.prefix + "…",
        "principal": None,
        "scope": {"type": "workspace", "workspace_id": key.org_public_id},
        "models": list(key.models),
        "rate_limits": {"requests_per_minute": key.rpm, "tokens_per_minute": key.tpm},
        "last_used_at": rfc3339(key.last_used_at),
    }


def _changes(body: dict[str, Any]) -> dict[str, Any]:
    """The ``Accounts.update_key`` changes a create or update body asks for."""
    changes: dict[str, Any] = {}
    if body.get("name") is not None:
        changes["name"] = body["name"]
    if "models" in body:
        changes["models"] = body["models"] or []
    if "expires_at" in body:
        changes["expires_at"] = None if body["expires_at"] is None else parse_time(body["expires_at"], "expires_at")
    limits = body.get("rate_limits") or {}
    for limiter, column in (("requests_per_minute", "rpm"), ("tokens_per_minute", "tpm")):
        if limiter in limits:
            changes[column] = limits[limiter]
    return changes


# ---------------------------------------------------------------- views


@blp.route("/api_keys", methods=["GET"])
@blp.arguments(ApiKeyListQuery, location="query", as_kwargs=True)
@blp.response(200, ApiKeyPageSchema)
def list_api_keys(**query: Any) -> dict[str, Any]:
    """Keys, oldest first; filtered by ``status``, ``workspace_id`` (or an organisation's name)
    and ``created_by_user_id`` (who made it: an admin key's id or ``cli:<user>``)."""
    admin_context()
    store, now = _store(), datetime.now(UTC)
    keys = store.accounts.list_keys()
    if query.get("workspace_id") is not None:
        org = service.find_org(store, query["workspace_id"])
        keys = [k for k in keys if k.org_public_id == org.public_id]
    if query.get("status") is not None:
        keys = [k for k in keys if k.status(now) == query["status"]]
    if query.get("created_by_user_id") is not None:
        keys = [k for k in keys if k.created_by == query["created_by_user_id"]]
    page = sync_page(
        keys,
        limit=query["limit"],
        after_id=_key_id(query.get("after_id")),
        before_id=_key_id(query.get("before_id")),
        id_of=lambda k: api_key_id(k.id),
    )
    return {**page, "data": [api_key_json(k, now) for k in page["data"]]}


def _key_id(given: str | None) -> str | None:
    return None if given is None else api_key_id(given)


@blp.route("/api_keys", methods=["POST"])
@blp.arguments(ApiKeyCreateSchema)
@blp.response(200, ApiKeyWithSecretSchema)
def create_api_key(body: dict[str, Any]) -> dict[str, Any]:
    """Extension: a new key of the workspace; its ``secret`` is in this answer and nowhere else."""
    ctx = admin_context(write=True)
    changes = _changes(body)
    key, secret = service.create_key(
        _store(),
        ctx,
        body["workspace_id"],
        name=changes.get("name", ""),
        models=changes.get("models", ()),
        rpm=changes.get("rpm"),
        tpm=changes.get("tpm"),
        expires_at=changes.get("expires_at"),
    )
    return {**api_key_json(key, datetime.now(UTC)), "secret": secret}


@blp.route("/api_keys/<api_key_id>", methods=["GET"])
@blp.response(200, ApiKeySchema)
def retrieve_api_key(api_key_id: str) -> dict[str, Any]:
    """One key, by its id (``apikey_…`` or ``key_…``)."""
    admin_context()
    return api_key_json(service.find_key(_store(), api_key_id), datetime.now(UTC))


@blp.route("/api_keys/<api_key_id>", methods=["POST"])
@blp.arguments(ApiKeyUpdateSchema)
@blp.response(200, ApiKeySchema)
def update_api_key(body: dict[str, Any], api_key_id: str) -> dict[str, Any]:
    """Rename a key or change its ``status`` (``inactive`` blocks it at once, ``active`` unblocks
    it, ``archived`` revokes it for good); ``models``, ``rate_limits`` and ``expires_at`` are
    extensions."""
    ctx = admin_context(write=True)
    store = _store()
    key = service.find_key(store, api_key_id)
    changes = _changes(body)
    if changes:
        key = service.update_key(store, ctx, key.id, **changes)
    if body.get("status") is not None:
        key = service.set_key_status(store, ctx, key.id, body["status"])
    return api_key_json(key, datetime.now(UTC))


@blp.route("/api_keys/<api_key_id>/rotate", methods=["POST"])
@blp.arguments(RotateSchema)
@blp.response(200, ApiKeyWithSecretSchema)
def rotate_api_key(body: dict[str, Any], api_key_id: str) -> dict[str, Any]:
    """Extension: a new secret for the key (in this answer only); the previous one keeps working
    for ``grace_seconds`` (0: refused at once; at most 7 days), on every worker."""
    ctx = admin_context(write=True)
    key, secret = service.rotate_key(_store(), ctx, api_key_id, body["grace_seconds"])
    return {**api_key_json(key, datetime.now(UTC)), "secret": secret}
