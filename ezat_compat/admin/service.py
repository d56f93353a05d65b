"""The one service layer under the admin API and the CLI: every change to organisations, keys and
admin keys goes through here, and leaves its trace.

Each operation takes the store and an ``AdminContext`` (who: ``admin_context()`` in a request,
``cli_context()`` on the command line), makes the change through the store's repositories and
calls ``record_change``: one append-only audit row (``store/admin.py``) and one JSON log line
(logger ``ezat_compat.audit``), with the target before and after the change, cleaned of secrets
(``scrub``). Other modules' changes (spend limits, …) call ``record_change`` the same way.

Errors: an unknown organisation or key is ``AdminNotFoundError`` (404); a value the store refuses
is its ``StoreError`` (the API answers 400; the CLI prints it); a change that conflicts with the
state (an archived key made active) is ``AdminConflictError`` (409).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ezat_compat.admin.errors import AdminConflictError, AdminInvalidRequestError, AdminNotFoundError
from ezat_compat.pricing import micros_to_usd
from ezat_compat.store.accounts import KEY_PREFIX, KeyInfo, OrgInfo, StoreError, api_key_id, iso, key_public_id
from ezat_compat.store.admin import ADMIN_KEY_PREFIX, AdminKeyInfo, AdminStore, AuditEntry

if TYPE_CHECKING:
    from ezat_compat.store.store import Store

__all__ = ["AdminContext", "cli_context", "record_change", "scrub"]

audit_log = logging.getLogger("ezat_compat.audit")

# Fields never written to the audit trail or its log line, whatever object they are in.
SECRET_FIELDS = frozenset({"secret", "api_key", "key_hash", "password", "token", "webhook_secret", "authorization"})
_SECRET_PREFIXES = (KEY_PREFIX, ADMIN_KEY_PREFIX)
_REDACTED = "[redacted]"
KEY_STATUSES = ("active", "inactive", "archived")  # what api_keys.update may set (not "expired")


# ---------------------------------------------------------------- who, and the trace


@dataclass(frozen=True, slots=True)
class AdminContext:
    """Who makes a change and from where: ``actor`` is an admin key's id (``adminkey_…``) or
    ``cli:<unix user>``; ``address`` the client's address ("" on the command line);
    ``request_id`` the request's ("" on the command line)."""

    actor: str
    read_only: bool
    address: str
    request_id: str


def cli_context() -> AdminContext:
    """The command line's caller: ``cli:<unix user>`` (the login name, else the numeric uid)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return AdminContext(actor=f"cli:{user}", read_only=False, address="", request_id="")


def scrub(value: Any) -> Any:
    """``value`` (JSON-ready) without secrets: fields named in ``SECRET_FIELDS`` are dropped, and a
    string that holds a whole key (``ezat_sk_…``, ``ezat_admin_…`` longer than a display prefix)
    is replaced, wherever it is."""
    if isinstance(value, Mapping):
        return {k: scrub(v) for k, v in value.items() if str(k).lower() not in SECRET_FIELDS}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    if isinstance(value, str) and value.startswith(_SECRET_PREFIXES) and len(value) > len(ADMIN_KEY_PREFIX) + 8:
        return _REDACTED
    return value


def admin_store(store: Store) -> AdminStore:
    """The store's admin repository (every kind of store has one)."""
    assert store.admin is not None, "open_store makes the admin repository"
    return store.admin


def record_change(
    store: Store,
    ctx: AdminContext,
    action: str,
    target_type: str,
    target_id: str,
    before: Any,
    after: Any,
) -> AuditEntry:
    """Leave the trace of one change: an audit row and one JSON log line (``ezat_compat.audit``),
    both without secrets. ``action`` names it (``workspace.create``, ``api_key.rotate``…);
    ``before``/``after`` are the target's JSON (None: it didn't exist / doesn't any more)."""
    entry = admin_store(store).record(
        actor=ctx.actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        before=scrub(before),
        after=scrub(after),
        address=ctx.address,
        request_id=ctx.request_id,
    )
    audit_log.info(json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":")))
    return entry


# ---------------------------------------------------------------- snapshots (what the trail shows)


def org_snapshot(org: OrgInfo) -> dict[str, Any]:
    """An organisation as the audit trail shows it."""
    return {
        "id": org.public_id,
        "name": org.name,
        "balance_usd": micros_to_usd(org.balance_micros),
        "suspended": org.suspended,
        "models": list(org.models),
        "rpm": org.rpm,
        "tpm": org.tpm,
    }


def key_snapshot(key: KeyInfo) -> dict[str, Any]:
    """A key as the audit trail shows it (its display prefix, never its secret)."""
    return {
        **key.to_json(),
        "id": api_key_id(key.id),
        "workspace_id": key.org_public_id,
        "blocked_at": iso(key.blocked_at),
    }


# ---------------------------------------------------------------- organisations (workspaces)


def find_org(store: Store, ref: str) -> OrgInfo:
    """The organisation whose workspace id or name is ``ref``; 404 if none."""
    org = store.accounts.find_org(ref)
    if org is None:
        raise AdminNotFoundError(
            f"There is no organization {ref!r} (a workspace id wrkspc_… or a name); `orgs list` shows them."
        )
    return org


def create_org(store: Store, ctx: AdminContext, name: str, balance_micros: int = 0) -> OrgInfo:
    """A new organisation with a starting balance."""
    org = store.accounts.create_org(name, balance_micros)
    record_change(store, ctx, "workspace.create", "workspace", org.public_id, None, org_snapshot(org))
    return org


def top_up(store: Store, ctx: AdminContext, ref: str, micros: int) -> OrgInfo:
    """Add ``micros`` to an organisation's balance."""
    before = find_org(store, ref)
    after = store.accounts.top_up(before.name, micros)
    record_change(
        store, ctx, "workspace.top_up", "workspace", after.public_id, org_snapshot(before), org_snapshot(after)
    )
    return after


def set_suspended(store: Store, ctx: AdminContext, ref: str, suspended: bool) -> OrgInfo:
    """Suspend (the admin API: archive) or resume (unarchive) an organisation."""
    before = find_org(store, ref)
    after = store.accounts.set_suspended(before.name, suspended)
    if org_snapshot(after) != org_snapshot(before):  # archiving twice changes nothing the second time
        action = "workspace.archive" if suspended else "workspace.unarchive"
        record_change(store, ctx, action, "workspace", after.public_id, org_snapshot(before), org_snapshot(after))
    return after


def update_org(store: Store, ctx: AdminContext, ref: str, **changes: Any) -> OrgInfo:
    """Rename an organisation (``name``) or change its keys' caps (``models``, ``rpm``, ``tpm``)."""
    unknown = set(changes) - {"name", "models", "rpm", "tpm"}
    if unknown:
        raise AdminInvalidRequestError(f"can't change {', '.join(sorted(unknown))}")
    before = find_org(store, ref)
    name = before.name
    if "name" in changes and changes["name"] != before.name:
        name = store.accounts.rename_org(before.name, changes["name"]).name
    access = {k: v for k, v in changes.items() if k != "name"}
    after = store.accounts.set_org_access(name, **access) if access else store.accounts.get_org(name)
    if org_snapshot(after) != org_snapshot(before):
        record_change(
            store, ctx, "workspace.update", "workspace", after.public_id, org_snapshot(before), org_snapshot(after)
        )
    return after


# ---------------------------------------------------------------- keys (api_keys)


def find_key(store: Store, ref: str) -> KeyInfo:
    """The key whose id is ``ref`` (``apikey_…`` or ``key_…``); 404 if none."""
    try:
        return store.accounts.get_key(key_public_id(ref))
    except StoreError:
        raise AdminNotFoundError(f"There is no key {ref!r}; `keys list` shows the ids (key_…).") from None


def create_key(
    store: Store,
    ctx: AdminContext,
    org_ref: str,
    *,
    name: str = "",
    models: Sequence[str] = (),
    spend_limit_micros: int | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    expires_at: datetime | None = None,
) -> tuple[KeyInfo, str]:
    """A new key of an organisation; returns it and its secret (show it once)."""
    org = find_org(store, org_ref)
    key, secret = store.accounts.create_key(
        org.name,
        name=name,
        models=models,
        spend_limit_micros=spend_limit_micros,
        rpm=rpm,
        tpm=tpm,
        expires_at=expires_at,
        created_by=ctx.actor,
    )
    record_change(store, ctx, "api_key.create", "api_key", api_key_id(key.id), None, key_snapshot(key))
    return key, secret


def update_key(store: Store, ctx: AdminContext, ref: str, **changes: Any) -> KeyInfo:
    """Change a key's ``name``, ``models``, ``expires_at``, ``rpm``, ``tpm`` or
    ``spend_limit_micros`` (``Accounts.update_key``)."""
    before = find_key(store, ref)
    after = store.accounts.update_key(before.id, **changes)
    if key_snapshot(after) != key_snapshot(before):
        record_change(
            store, ctx, "api_key.update", "api_key", api_key_id(after.id), key_snapshot(before), key_snapshot(after)
        )
    return after


def set_key_status(store: Store, ctx: AdminContext, ref: str, status: str) -> KeyInfo:
    """The admin API's status change: ``active`` (unblock), ``inactive`` (block: refused at once
    until made active) or ``archived`` (revoke: final). An archived key can't be made active or
    inactive again (409)."""
    if status not in KEY_STATUSES:
        raise AdminInvalidRequestError(f"status: must be one of {', '.join(KEY_STATUSES)}, got {status!r}")
    before = find_key(store, ref)
    if status == "archived":
        after = store.accounts.revoke_key(before.id)
        action = "api_key.archive"
    else:
        if before.revoked_at is not None:
            raise AdminConflictError(
                f"The key {api_key_id(before.id)!r} is archived (revoked); it can't be made {status} again."
            )
        after = store.accounts.set_blocked(before.id, status == "inactive")
        action = "api_key.block" if status == "inactive" else "api_key.unblock"
    if key_snapshot(after) != key_snapshot(before):
        record_change(store, ctx, action, "api_key", api_key_id(after.id), key_snapshot(before), key_snapshot(after))
    return after


def revoke_key(store: Store, ctx: AdminContext, ref: str) -> KeyInfo:
    """Revoke a key (the admin API: archive)."""
    return set_key_status(store, ctx, ref, "archived")


def rotate_key(store: Store, ctx: AdminContext, ref: str, grace_seconds: int = 0) -> tuple[KeyInfo, str]:
    """A new secret for a key (returned: show it once); the previous one keeps working for
    ``grace_seconds`` (0: refused at once)."""
    before = find_key(store, ref)
    if before.revoked_at is not None:
        raise AdminConflictError(f"The key {api_key_id(before.id)!r} is archived (revoked); it can't be rotated.")
    after, secret = store.accounts.rotate_key(before.id, grace=timedelta(seconds=grace_seconds))
    trace = {**key_snapshot(after), "grace_seconds": grace_seconds}
    record_change(store, ctx, "api_key.rotate", "api_key", api_key_id(after.id), key_snapshot(before), trace)
    return after, secret


# ---------------------------------------------------------------- admin keys


def create_admin_key(
    store: Store,
    ctx: AdminContext,
    *,
    name: str = "",
    read_only: bool = False,
    expires_at: datetime | None = None,
) -> tuple[AdminKeyInfo, str]:
    """A new admin key; returns it and its secret (show it once)."""
    key, secret = admin_store(store).create_key(
        name=name, read_only=read_only, expires_at=expires_at, created_by=ctx.actor
    )
    record_change(store, ctx, "admin_key.create", "admin_key", key.id, None, key.to_json())
    return key, secret


def revoke_admin_key(store: Store, ctx: AdminContext, public_id: str) -> AdminKeyInfo:
    """Revoke an admin key (refused from its next request on)."""
    admin = admin_store(store)
    before = admin.get_key(public_id)
    after = admin.revoke_key(public_id)
    if after != before:
        record_change(store, ctx, "admin_key.revoke", "admin_key", after.id, before.to_json(), after.to_json())
    return after
