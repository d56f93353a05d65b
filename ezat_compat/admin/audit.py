"""``GET /v1/organizations/audit_log``: the audit trail (an extension: Anthropic's Admin API has
none), newest first, in cursor pages (``page`` -> ``next_page``, as the SDK's ``SyncPageCursor``).

Filters: ``since`` (RFC 3339), ``actor`` (``adminkey_…``, ``cli:<user>``), ``target_type``
(``workspace``, ``api_key``, ``admin_key``, ``spend_limit``…) and ``target_id``. Each entry says
who changed what, when, from which address and in which request, with the target before and after
(never a secret). Reading it needs an admin key (a read-only one is enough).
"""

from __future__ import annotations

from typing import Any

from flask import current_app
from flask_smorest import Blueprint
from marshmallow import Schema, fields, validate

from ezat_compat.admin.auth import admin_context
from ezat_compat.admin.pages import DEFAULT_LIMIT, MAX_LIMIT, decode_cursor, encode_cursor, parse_time
from ezat_compat.admin.service import admin_store
from ezat_compat.store.store import Store

blp = Blueprint(
    "admin_audit",
    __name__,
    url_prefix="/v1/organizations",
    description="The audit trail (extension): every change made through the admin API or the CLI.",
)


class AuditTargetSchema(Schema):
    type = fields.Str()
    id = fields.Str()


class AuditEntrySchema(Schema):
    id = fields.Str()
    type = fields.Str()
    at = fields.Str()
    actor = fields.Str()
    action = fields.Str()
    target = fields.Nested(AuditTargetSchema)
    before = fields.Raw(allow_none=True)
    after = fields.Raw(allow_none=True)
    address = fields.Str()
    request_id = fields.Str()


class AuditPageSchema(Schema):
    data = fields.List(fields.Nested(AuditEntrySchema))
    has_more = fields.Bool()
    next_page = fields.Str(allow_none=True)


class AuditListQuery(Schema):
    since = fields.Str(metadata={"description": "RFC 3339: entries at or after this time"})
    actor = fields.Str()
    target_type = fields.Str()
    target_id = fields.Str()
    limit = fields.Int(load_default=DEFAULT_LIMIT, validate=validate.Range(min=1, max=MAX_LIMIT))
    page = fields.Str()


@blp.route("/audit_log", methods=["GET"])
@blp.arguments(AuditListQuery, location="query", as_kwargs=True)
@blp.response(200, AuditPageSchema)
def list_audit_log(**query: Any) -> dict[str, Any]:
    """The audit trail, newest first, one page at a time."""
    admin_context()
    store: Store = current_app.extensions["ezat_store"]
    before_id = None
    if query.get("page"):
        before_id = decode_cursor(query["page"])
        if not isinstance(before_id, int) or isinstance(before_id, bool):
            before_id = decode_cursor("not a token")  # raises the 400
    limit = query["limit"]
    entries = admin_store(store).entries(
        since=parse_time(query["since"], "since") if query.get("since") else None,
        actor=query.get("actor"),
        target_type=query.get("target_type"),
        target_id=query.get("target_id"),
        before_id=before_id,
        limit=limit + 1,
    )
    has_more = len(entries) > limit
    entries = entries[:limit]
    return {
        "data": [entry.to_json() for entry in entries],
        "has_more": has_more,
        "next_page": encode_cursor(entries[-1].id) if has_more else None,
    }
