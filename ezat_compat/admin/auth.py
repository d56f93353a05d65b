"""Who is calling the admin API: an admin key, as Anthropic's Admin API takes its keys.

The key comes in ``x-api-key`` or as ``Authorization: Bearer`` (the ``anthropic`` SDK sends the
latter for ``Anthropic(api_key=…)``). Only ``ezat_admin_…`` keys are admin keys: an inference key
(``ezat_sk_…``) is refused with 403 whatever it is, never looked up. A view asks once per request:

    ctx = admin_context()             # reads
    ctx = admin_context(write=True)   # changes: a read-only admin key gets 403

and passes ``ctx`` to ``admin.service`` (its ``actor`` names the key in the audit trail).
"""

from __future__ import annotations

from datetime import UTC, datetime

from flask import current_app, g, request

from ezat_compat.admin.errors import AdminAuthenticationError, AdminPermissionError
from ezat_compat.admin.service import AdminContext
from ezat_compat.store.accounts import KEY_PREFIX
from ezat_compat.store.admin import ADMIN_KEY_PREFIX, AdminKeyInfo, AdminStore

_BEARER = "bearer "


def presented_key(headers: object) -> str:
    """The key a request presents: ``x-api-key``, else ``Authorization: Bearer …``; "" if none."""
    get = getattr(headers, "get", None)
    if get is None:
        return ""
    key = (get("x-api-key") or "").strip()
    if key:
        return str(key)
    authorization = str(get("authorization") or "")
    if authorization[: len(_BEARER)].lower() == _BEARER:
        return authorization[len(_BEARER) :].strip()
    return ""


def check_admin_key(store: AdminStore, secret: str, now: datetime) -> AdminKeyInfo:
    """The admin key ``secret`` names, if it may call the admin API now; else the error to
    answer: 401 without a key or with an unknown, revoked or expired one, 403 for an inference
    key (``ezat_sk_…``: never an admin key)."""
    if not secret:
        raise AdminAuthenticationError(
            "An admin key is required: send it in the x-api-key header (ezat_admin_…, made with "
            "`ezat-compat admin-keys create`)."
        )
    if secret.startswith(KEY_PREFIX):
        raise AdminPermissionError(
            "This is an inference API key (ezat_sk_…); the admin API takes an admin key (ezat_admin_…), "
            "made with `ezat-compat admin-keys create`."
        )
    key = store.find_key(secret) if secret.startswith(ADMIN_KEY_PREFIX) else None
    if key is None:
        raise AdminAuthenticationError("Invalid admin key.")
    if key.revoked_at is not None:
        raise AdminAuthenticationError("This admin key has been revoked.")
    if key.expires_at is not None and key.expires_at <= now:
        raise AdminAuthenticationError("This admin key has expired.")
    return key


def admin_context(*, write: bool = False) -> AdminContext:
    """The caller of this request (authenticated once per request): 401 without a key or with a
    bad one, 403 for an inference key, or when ``write`` and the admin key is read-only."""
    ctx: AdminContext | None = g.get("admin_context")
    if ctx is None:
        store: AdminStore = current_app.extensions["ezat_store"].admin
        now = datetime.now(UTC)
        key = check_admin_key(store, presented_key(request.headers), now)
        store.note_used(key, now)
        ctx = AdminContext(
            actor=key.id,
            read_only=key.read_only,
            address=request.remote_addr or "",
            request_id=str(g.get("request_id") or ""),
        )
        g.admin_context = ctx
    if write and ctx.read_only:
        raise AdminPermissionError("This admin key is read-only; changes need a read-write admin key.")
    return ctx
