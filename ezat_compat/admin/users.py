"""``/v1/organizations/users``: the people of the company's IdP who signed in to the gateway, in
the wire shapes of Anthropic's Admin API (the ``anthropic`` SDK's ``client.organization.users``:
list, retrieve, update, remove), the extensions beside them, and the service under both the API
and the CLI (``users …``).

What maps (docs/admin-api.md, "People and groups"):

- a user is a person (``users``): ``id`` their ``user_…``, ``email``, ``name`` as the IdP last
  said, ``added_at`` their first sign-in. A path takes the email (or the IdP's subject) in place
  of the id too. ``role`` is always ``user``: what a person may do comes from their IdP groups
  (``[identity] admins``/``viewers`` for the console, ``[identity.groups]`` or rbac_groups for
  their organisation, models and caps), so an update to another role is a 400.
- extensions on the object: ``status`` (``active`` or ``disabled``: refused at their next
  request, everywhere), ``disabled_at``, ``last_sign_in_at``, ``subject``, ``groups`` (the IdP's
  groups as last said), ``rbac_group_ids`` (the mapped ones), ``workspace_id`` (the organisation
  that pays for them; null: none) and ``models``.
- ``remove`` (DELETE) can't forget a person — the ledger and the audit trail name them — so it
  disables them and revokes their live keys, and answers ``user_deleted`` as Anthropic's does.
  ``POST …/{id}/enable`` undoes it (their keys stay revoked; a new sign-in mints new ones).

Extensions: ``POST …/{id}`` with ``status`` (and ``revoke_keys``), ``POST …/{id}/disable``,
``…/enable``, ``…/revoke_keys`` and ``GET …/{id}/api_keys`` (the person's keys, as api_keys).
Every change leaves an audit row (``user.disable``, ``user.enable``, ``user.revoke_keys``,
``user.delete``); people are made by signing in, never through the API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flask import current_app, request
from flask_smorest import Blueprint
from marshmallow import RAISE, Schema, fields, validate

from ezat_compat.admin.auth import AdminContext, admin_context
from ezat_compat.admin.errors import AdminInvalidRequestError, AdminNotFoundError
from ezat_compat.admin.groups import find_group
from ezat_compat.admin.keys import ApiKeyPageSchema, api_key_json
from ezat_compat.admin.pages import DEFAULT_LIMIT, MAX_LIMIT, parse_list, rfc3339, sync_page
from ezat_compat.admin.service import record_change
from ezat_compat.store.accounts import StoreError, api_key_id
from ezat_compat.store.people import People, PersonInfo
from ezat_compat.store.people_queries import live_key_count

if TYPE_CHECKING:
    from ezat_compat.store.store import Store

blp = Blueprint(
    "admin_users",
    __name__,
    url_prefix="/v1/organizations",
    description="People of the company's IdP who signed in: list, retrieve, disable or enable, revoke their keys.",
)

ROLE = "user"  # every person's role here: their groups decide the rest
ROLES = ("billing", "claude_code_user", "developer", "managed", "user")  # what the SDK's update sends
STATUSES = ("active", "disabled")


# ---------------------------------------------------------------- the service (API and CLI)


def people(store: Store) -> People:
    """The store's people (every kind of store has them)."""
    assert store.people is not None, "open_store makes the people"
    return store.people


def find_person(store: Store, ref: str) -> PersonInfo:
    """The person whose id (``user_…``), email or IdP subject is ``ref``; 404 if none."""
    try:
        return people(store).get(ref)
    except StoreError:
        raise AdminNotFoundError(
            f"There is no user {ref!r} (an id user_…, an email or the IdP's subject); a person exists once "
            "they have signed in, and `users list` shows them."
        ) from None


def status_of(person: PersonInfo) -> str:
    """``active`` or ``disabled``."""
    return "active" if person.disabled_at is None else "disabled"


def snapshot(store: Store, person: PersonInfo) -> dict[str, Any]:
    """A person as the audit trail shows them: ``users list --json``'s object, their status and how
    many live keys they have."""
    return {
        **person.to_json(),
        "status": status_of(person),
        "live_keys": live_key_count(store.engine, person.id),
    }


def set_disabled(
    store: Store, ctx: AdminContext, ref: str, disabled: bool, *, revoke_keys: bool = False, action: str = ""
) -> PersonInfo:
    """Disable a person (refused at their next request on every worker and node; with
    ``revoke_keys`` every live key of theirs is revoked too) or enable them again, and leave the
    trace (``user.disable``/``user.enable``, or ``action``). Nothing changed, no row."""
    found = find_person(store, ref)
    before_json = snapshot(store, found)
    if revoke_keys and not disabled:
        raise AdminInvalidRequestError("revoke_keys: only with disabling (status disabled)")
    if (found.disabled_at is not None) == disabled:
        if not revoke_keys:
            return found
        people(store).revoke_keys(found.public_id)  # disabled already: keep when it was
        after = people(store).get(found.public_id)
    else:
        _, after = people(store).set_disabled(found.public_id, disabled, revoke_keys=revoke_keys)
    after_json = snapshot(store, after)
    if after_json != before_json:
        record_change(
            store,
            ctx,
            action or ("user.disable" if disabled else "user.enable"),
            "user",
            after.public_id,
            before_json,
            after_json,
        )
    return after


def revoke_keys(store: Store, ctx: AdminContext, ref: str) -> tuple[PersonInfo, int]:
    """Revoke every live key of a person at once (they may sign in again for new ones unless
    disabled); returns the person and how many keys were revoked."""
    person = find_person(store, ref)
    before_json = snapshot(store, person)
    revoked = people(store).revoke_keys(person.public_id)
    if revoked:
        after_json = {**snapshot(store, person), "revoked_keys": revoked}
        record_change(store, ctx, "user.revoke_keys", "user", person.public_id, before_json, after_json)
    return person, revoked


def set_rate_limits(store: Store, ctx: AdminContext, ref: str, changes: Mapping[str, int | None]) -> PersonInfo:
    """The person's own ``rpm``/``tpm`` (all their keys together; None: none of their own), what
    isn't in ``changes`` kept; an audit row ``user.update`` when something changed."""
    person = find_person(store, ref)
    rpm = changes.get("rpm", person.rpm)
    tpm = changes.get("tpm", person.tpm)
    if (rpm, tpm) == (person.rpm, person.tpm):
        return person
    before_json = snapshot(store, person)
    try:
        _, after = people(store).set_rate_limits(person.public_id, rpm=rpm, tpm=tpm)
    except StoreError as exc:
        raise AdminInvalidRequestError(str(exc)) from None
    record_change(store, ctx, "user.update", "user", after.public_id, before_json, snapshot(store, after))
    return after


def remove(store: Store, ctx: AdminContext, ref: str) -> PersonInfo:
    """The Admin API's remove: a person can't be deleted (the ledger and the audit trail name
    them), so they are disabled and every live key of theirs is revoked (``user.delete``)."""
    person = find_person(store, ref)
    if person.disabled_at is not None and not live_key_count(store.engine, person.id):
        return person
    return set_disabled(store, ctx, person.public_id, True, revoke_keys=True, action="user.delete")


# ---------------------------------------------------------------- the object


class _Names:
    """The workspace ids of organisations and the public ids of groups, read once per answer."""

    def __init__(self, store: Store) -> None:
        self.workspaces = {o.id: o.public_id for o in store.accounts.list_orgs_by_creation()}
        self.groups = {g.id: g.public_id for g in people(store).list_groups()}


def user_json(person: PersonInfo, names: _Names) -> dict[str, Any]:
    """A person as the Admin API's ``OrganizationUser``, with our extensions."""
    return {
        "id": person.public_id,
        "type": "user",
        "email": person.email,
        "name": person.name,
        "role": ROLE,
        "added_at": rfc3339(person.created_at),
        "status": status_of(person),
        "disabled_at": rfc3339(person.disabled_at),
        "last_sign_in_at": rfc3339(person.last_sign_in_at),
        "subject": person.subject,
        "groups": list(person.idp_groups),
        "rbac_group_ids": [names.groups[g] for g in person.group_ids if g in names.groups],
        "workspace_id": names.workspaces.get(person.org_id) if person.org_id is not None else None,
        "models": list(person.models),
        "rpm": person.rpm,
        "tpm": person.tpm,
        "group_rpm": person.group_rpm,
        "group_tpm": person.group_tpm,
    }


# ---------------------------------------------------------------- shapes


class _Strict(Schema):
    class Meta:
        unknown = RAISE


class UserSchema(Schema):
    id = fields.Str()
    type = fields.Str(metadata={"enum": ["user"]})
    email = fields.Str()
    name = fields.Str()
    role = fields.Str(metadata={"description": "Always user: the person's IdP groups decide what they may do"})
    added_at = fields.Str()
    status = fields.Str(metadata={"enum": list(STATUSES), "description": "Extension"})
    disabled_at = fields.Str(allow_none=True, metadata={"description": "Extension"})
    last_sign_in_at = fields.Str(allow_none=True, metadata={"description": "Extension"})
    subject = fields.Str(metadata={"description": "Extension: the IdP's sub"})
    groups = fields.List(fields.Str(), metadata={"description": "Extension: the IdP's groups, as last said"})
    rbac_group_ids = fields.List(fields.Str(), metadata={"description": "Extension: the mapped groups"})
    workspace_id = fields.Str(allow_none=True, metadata={"description": "Extension: who pays for them"})
    models = fields.List(fields.Str(), metadata={"description": "Extension: model patterns ([]: every model)"})
    rpm = fields.Int(allow_none=True, metadata={"description": "Extension: requests per minute, all their keys"})
    tpm = fields.Int(allow_none=True, metadata={"description": "Extension: tokens per minute, all their keys"})
    group_rpm = fields.Int(allow_none=True, metadata={"description": "Extension: the lowest of their groups'"})
    group_tpm = fields.Int(allow_none=True, metadata={"description": "Extension: the lowest of their groups'"})


class UserPageSchema(Schema):
    data = fields.List(fields.Nested(UserSchema))
    has_more = fields.Bool()
    first_id = fields.Str(allow_none=True)
    last_id = fields.Str(allow_none=True)


class UserListQuery(Schema):
    """Documented query parameters (``roles[]`` is read with ``parse_list``)."""

    after_id = fields.Str()
    before_id = fields.Str()
    limit = fields.Int(load_default=DEFAULT_LIMIT, validate=validate.Range(min=1, max=MAX_LIMIT))
    email = fields.Str()
    roles = fields.List(fields.Str(), data_key="roles[]", metadata={"description": "everyone's is user"})
    status = fields.Str(validate=validate.OneOf(STATUSES), metadata={"description": "Extension"})
    rbac_group_id = fields.Str(metadata={"description": "Extension: the members of a group (id or name)"})


class UserUpdateSchema(_Strict):
    role = fields.Str(validate=validate.OneOf(ROLES), metadata={"description": "Only user is accepted"})
    status = fields.Str(validate=validate.OneOf(STATUSES), metadata={"description": "Extension"})
    revoke_keys = fields.Bool(load_default=False, metadata={"description": "Extension: with status disabled"})
    rpm = fields.Int(allow_none=True, validate=validate.Range(min=1), metadata={"description": "Extension"})
    tpm = fields.Int(allow_none=True, validate=validate.Range(min=1), metadata={"description": "Extension"})


class DisableSchema(_Strict):
    revoke_keys = fields.Bool(load_default=False)


class UserDeletedSchema(Schema):
    id = fields.Str()
    type = fields.Str(metadata={"enum": ["user_deleted"]})


class KeysRevokedSchema(Schema):
    id = fields.Str()
    type = fields.Str(metadata={"enum": ["user_keys_revoked"]})
    revoked = fields.Int(metadata={"description": "How many live keys were revoked"})


# ---------------------------------------------------------------- views


def _store() -> Store:
    store: Store = current_app.extensions["ezat_store"]
    return store


def _members(store: Store, ref: str) -> Sequence[PersonInfo]:
    group = find_group(store, ref)
    return [p for p in people(store).list_people() if group.id in p.group_ids]


@blp.route("/users", methods=["GET"])
@blp.arguments(UserListQuery, location="query", as_kwargs=True)
@blp.response(200, UserPageSchema)
def list_users(**query: Any) -> dict[str, Any]:
    """People who signed in, oldest first; ``email`` picks one, ``status`` and ``rbac_group_id``
    (extensions) filter."""
    admin_context()
    store = _store()
    roles = parse_list(request.args, "roles")
    if query.get("rbac_group_id"):
        found = list(_members(store, query["rbac_group_id"]))
    else:
        found = people(store).list_people(email=query.get("email") or None)
    if query.get("email"):
        found = [p for p in found if p.email == query["email"]]
    if roles and ROLE not in roles:
        found = []
    if query.get("status"):
        found = [p for p in found if status_of(p) == query["status"]]
    page = sync_page(
        found,
        limit=query["limit"],
        after_id=query.get("after_id"),
        before_id=query.get("before_id"),
        id_of=lambda p: p.public_id,
    )
    names = _Names(store)
    return {**page, "data": [user_json(p, names) for p in page["data"]]}


@blp.route("/users/<user_id>", methods=["GET"])
@blp.response(200, UserSchema)
def retrieve_user(user_id: str) -> dict[str, Any]:
    """One person, by id (``user_…``), email or IdP subject."""
    admin_context()
    store = _store()
    return user_json(find_person(store, user_id), _Names(store))


@blp.route("/users/<user_id>", methods=["POST"])
@blp.arguments(UserUpdateSchema)
@blp.response(200, UserSchema)
def update_user(body: Mapping[str, Any], user_id: str) -> dict[str, Any]:
    """Update a person: ``role`` must stay ``user`` (their IdP groups decide what they may do);
    ``status`` (an extension) disables (with ``revoke_keys``, their live keys revoked too) or
    enables them; ``rpm``/``tpm`` (extensions; null: none) cap their requests and tokens per
    minute, all their keys together."""
    ctx = admin_context(write=True)
    store = _store()
    if body.get("role") not in (None, ROLE):
        raise AdminInvalidRequestError(
            f"role: {body['role']!r} can't be given here; every person's role is 'user' and what they may do "
            "comes from their IdP groups ([identity] admins and viewers, and the groups' mappings)"
        )
    person = find_person(store, user_id)
    if body.get("revoke_keys") and body.get("status") != "disabled":
        raise AdminInvalidRequestError('revoke_keys: only with "status": "disabled"')
    if "status" in body:
        person = set_disabled(
            store, ctx, person.public_id, body["status"] == "disabled", revoke_keys=body["revoke_keys"]
        )
    rates = {k: body[k] for k in ("rpm", "tpm") if k in body}
    if rates:
        person = set_rate_limits(store, ctx, person.public_id, rates)
    return user_json(person, _Names(store))


@blp.route("/users/<user_id>", methods=["DELETE"])
@blp.response(200, UserDeletedSchema)
def remove_user(user_id: str) -> dict[str, Any]:
    """Remove a person: they can't be forgotten (the ledger and the audit trail name them), so
    they are disabled and every live key of theirs is revoked; ``…/enable`` undoes the first."""
    ctx = admin_context(write=True)
    person = remove(_store(), ctx, user_id)
    return {"id": person.public_id, "type": "user_deleted"}


@blp.route("/users/<user_id>/disable", methods=["POST"])
@blp.arguments(DisableSchema, required=False)
@blp.response(200, UserSchema)
def disable_user(body: Mapping[str, Any], user_id: str) -> dict[str, Any]:
    """Extension: disable a person (refused at their next request, everywhere); ``revoke_keys``
    revokes their live keys too."""
    ctx = admin_context(write=True)
    store = _store()
    person = set_disabled(store, ctx, user_id, True, revoke_keys=bool(body.get("revoke_keys")))
    return user_json(person, _Names(store))


@blp.route("/users/<user_id>/enable", methods=["POST"])
@blp.response(200, UserSchema)
def enable_user(user_id: str) -> dict[str, Any]:
    """Extension: enable a disabled person again (revoked keys stay revoked)."""
    ctx = admin_context(write=True)
    store = _store()
    return user_json(set_disabled(store, ctx, user_id, False), _Names(store))


@blp.route("/users/<user_id>/revoke_keys", methods=["POST"])
@blp.response(200, KeysRevokedSchema)
def revoke_user_keys(user_id: str) -> dict[str, Any]:
    """Extension: revoke every live key of a person at once."""
    ctx = admin_context(write=True)
    person, revoked = revoke_keys(_store(), ctx, user_id)
    return {"id": person.public_id, "type": "user_keys_revoked", "revoked": revoked}


@blp.route("/users/<user_id>/api_keys", methods=["GET"])
@blp.arguments(UserListQuery(only=("after_id", "before_id", "limit")), location="query", as_kwargs=True)
@blp.response(200, ApiKeyPageSchema)
def list_user_keys(user_id: str, **query: Any) -> dict[str, Any]:
    """Extension: a person's keys (minted by their sign-ins, and their IdP-token key), oldest
    first, as api_keys."""
    admin_context()
    store = _store()
    person = find_person(store, user_id)
    keys = sorted(people(store).keys(person), key=lambda k: (k.created_at, k.id))
    page = sync_page(
        keys,
        limit=query["limit"],
        after_id=query.get("after_id"),
        before_id=query.get("before_id"),
        id_of=lambda k: api_key_id(k.id),
    )
    now = datetime.now(UTC)
    return {**page, "data": [api_key_json(k, now) for k in page["data"]]}
