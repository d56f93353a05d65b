"""Admin keys and the audit trail (the admin API's, ``admin/``; the CLI's ``admin-keys`` and ``audit``).

An admin key is ``ezat_admin_`` + 32 base62 characters (190 bits from ``secrets``), shown once at
creation; the database keeps its SHA-256, a display prefix, ``read_only``, an optional expiry and
its revocation. Its public id ``adminkey_…`` names it everywhere else (the audit trail's actor,
``admin-keys revoke``). ``find_key`` is one indexed SELECT and never caches: a revoked admin key
is refused by every worker at once.

The audit trail is append-only: ``record`` inserts, ``entries`` reads (newest first, by id), and
nothing here updates or deletes a row (the migration's triggers refuse both). The caller passes
JSON-ready ``before``/``after`` objects it has already cleaned of secrets (``admin/service.py``).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Row, insert, select, update

from ezat_compat.store.accounts import StoreError, iso
from ezat_compat.store.db import write_engine
from ezat_compat.store.hotpath import HotPath
from ezat_compat.store.tables import admin_keys, audit_log

ADMIN_KEY_PREFIX = "ezat_admin_"
ADMIN_ID_PREFIX = "adminkey_"
_ALPHABET = string.ascii_letters + string.digits
_RANDOM_CHARS = 32  # 32 × log2(62) ≈ 190 bits
_DISPLAY_PREFIX_LEN = len(ADMIN_KEY_PREFIX) + 4
LAST_USED_EVERY = timedelta(minutes=1)  # ``last_used_at`` is written at most this often per key
AUDIT_BATCH = 1000  # rows read at once by whoever walks the whole trail

_FIND_SQL = (
    "SELECT id, public_id, name, prefix, read_only, created_at, created_by, expires_at, revoked_at, last_used_at "
    "FROM admin_keys WHERE key_hash = :key_hash"
)


def hash_admin_key(secret: str) -> str:
    """SHA-256 hex of an admin key's secret, as stored in ``admin_keys.key_hash``."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _moment(micros: int | None) -> datetime | None:
    return None if micros is None else datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


@dataclass(frozen=True, slots=True)
class AdminKeyInfo:
    """An admin key as listed (never its secret)."""

    id: str
    name: str
    prefix: str
    read_only: bool
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def status(self, now: datetime) -> str:
        """``active``, ``expired`` or ``revoked``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def to_json(self) -> dict[str, Any]:
        """The object of ``admin-keys list --json``: times in ISO 8601 UTC with a ``Z``."""
        return {
            "id": self.id,
            "name": self.name,
            "prefix": self.prefix,
            "read_only": self.read_only,
            "created_at": iso(self.created_at),
            "created_by": self.created_by,
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
            "last_used_at": iso(self.last_used_at),
        }


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the audit trail. ``before``/``after``: the target as JSON (None: it didn't
    exist / doesn't any more)."""

    id: int
    at: datetime
    actor: str
    action: str
    target_type: str
    target_id: str
    before: Any
    after: Any
    address: str
    request_id: str

    def to_json(self) -> dict[str, Any]:
        """The object of ``audit list --json`` and of the admin API's audit list."""
        return {
            "id": f"audit_{self.id}",
            "type": "audit_entry",
            "at": iso(self.at),
            "actor": self.actor,
            "action": self.action,
            "target": {"type": self.target_type, "id": self.target_id},
            "before": self.before,
            "after": self.after,
            "address": self.address,
            "request_id": self.request_id,
        }


def _key_info(row: Row[Any]) -> AdminKeyInfo:
    return AdminKeyInfo(
        id=row.public_id,
        name=row.name,
        prefix=row.prefix,
        read_only=bool(row.read_only),
        created_at=row.created_at,
        created_by=row.created_by,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
    )


def _entry(row: Row[Any]) -> AuditEntry:
    return AuditEntry(
        id=row.id,
        at=row.at,
        actor=row.actor,
        action=row.action,
        target_type=row.target_type,
        target_id=row.target_id,
        before=None if row.before is None else json.loads(row.before),
        after=None if row.after is None else json.loads(row.after),
        address=row.address,
        request_id=row.request_id,
    )


class AdminStore:
    """Admin keys and the audit trail in the database behind ``engine``. Thread-safe; one per
    process (``store.Store.admin``)."""

    def __init__(self, engine: Engine, hot_path: HotPath) -> None:
        self._engine = engine
        self._writer = write_engine(engine)
        self._read = hot_path.read

    # ------------------------------------------------------------ admin keys

    def create_key(
        self,
        *,
        name: str = "",
        read_only: bool = False,
        expires_at: datetime | None = None,
        created_by: str,
        now: datetime | None = None,
    ) -> tuple[AdminKeyInfo, str]:
        """A new admin key; returns its info and its secret (show it once: it can't be recovered).
        ``StoreError`` for a name over 128 characters or an expiry without a time zone or not in
        the future."""
        now = now or datetime.now(UTC)
        if len(name) > 128:
            raise StoreError("name: at most 128 characters")
        if expires_at is not None:
            if expires_at.tzinfo is None:
                raise StoreError("expires: give a time zone, e.g. 2030-01-01T00:00:00Z")
            if expires_at <= now:
                raise StoreError(f"expires: {iso(expires_at)} is in the past")
        secret = ADMIN_KEY_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(_RANDOM_CHARS))
        public_id = ADMIN_ID_PREFIX + secrets.token_hex(8)
        with self._writer.begin() as conn:
            conn.execute(
                insert(admin_keys).values(
                    public_id=public_id,
                    name=name,
                    prefix=secret[:_DISPLAY_PREFIX_LEN],
                    key_hash=hash_admin_key(secret),
                    read_only=read_only,
                    created_at=now,
                    created_by=created_by,
                    expires_at=expires_at,
                    revoked_at=None,
                    last_used_at=None,
                )
            )
        return self.get_key(public_id), secret

    def get_key(self, public_id: str) -> AdminKeyInfo:
        """The admin key ``public_id``; ``StoreError`` if there is none."""
        with self._engine.connect() as conn:
            row = conn.execute(select(admin_keys).where(admin_keys.c.public_id == public_id)).first()
        if row is None:
            raise StoreError(f"There is no admin key {public_id!r}; `admin-keys list` shows the ids (adminkey_…).")
        return _key_info(row)

    def list_keys(self) -> list[AdminKeyInfo]:
        """Every admin key, oldest first."""
        with self._engine.connect() as conn:
            rows = conn.execute(select(admin_keys).order_by(admin_keys.c.created_at, admin_keys.c.id))
            return [_key_info(row) for row in rows]

    def revoke_key(self, public_id: str, *, now: datetime | None = None) -> AdminKeyInfo:
        """Revoke an admin key: refused (401) from its next request on. Revoking twice keeps the
        first time. ``StoreError`` if there is no such key."""
        with self._writer.begin() as conn:
            conn.execute(
                update(admin_keys)
                .where(admin_keys.c.public_id == public_id, admin_keys.c.revoked_at.is_(None))
                .values(revoked_at=now or datetime.now(UTC))
            )
        return self.get_key(public_id)

    def find_key(self, secret: str) -> AdminKeyInfo | None:
        """The admin key whose secret is ``secret`` (revoked and expired ones too: the caller
        says why it refuses), or None. One indexed SELECT; nothing cached."""
        if not secret.startswith(ADMIN_KEY_PREFIX):
            return None
        row = self._read(_FIND_SQL, {"key_hash": hash_admin_key(secret)})
        if row is None:
            return None
        _, public_id, name, prefix, read_only, created, by, expires, revoked, last_used = row
        return AdminKeyInfo(
            id=public_id,
            name=name,
            prefix=prefix,
            read_only=bool(read_only),
            created_at=_moment(created) or datetime.now(UTC),
            created_by=by,
            expires_at=_moment(expires),
            revoked_at=_moment(revoked),
            last_used_at=_moment(last_used),
        )

    def note_used(self, key: AdminKeyInfo, now: datetime) -> None:
        """Record that ``key`` was used at ``now``, unless it was within ``LAST_USED_EVERY``
        (admin requests are few: one short write at most once a minute per key)."""
        if key.last_used_at is not None and now - key.last_used_at < LAST_USED_EVERY:
            return
        with self._writer.begin() as conn:
            conn.execute(update(admin_keys).where(admin_keys.c.public_id == key.id).values(last_used_at=now))

    # ------------------------------------------------------------ the audit trail

    def record(
        self,
        *,
        actor: str,
        action: str,
        target_type: str,
        target_id: str,
        before: Any,
        after: Any,
        address: str = "",
        request_id: str = "",
        now: datetime | None = None,
    ) -> AuditEntry:
        """Append one row; returns it. ``before``/``after`` must be JSON-ready and hold no secret."""
        at = now or datetime.now(UTC)
        entry = AuditEntry(
            id=0,
            at=at,
            actor=actor[:160],
            action=action[:64],
            target_type=target_type[:32],
            target_id=target_id[:64],
            before=before,
            after=after,
            address=address[:64],
            request_id=request_id[:64],
        )
        with self._writer.begin() as conn:
            result = conn.execute(
                insert(audit_log).values(
                    at=entry.at,
                    actor=entry.actor,
                    action=entry.action,
                    target_type=entry.target_type,
                    target_id=entry.target_id,
                    before=None if before is None else _dumps(before),
                    after=None if after is None else _dumps(after),
                    address=entry.address,
                    request_id=entry.request_id,
                )
            )
            (new_id,) = result.inserted_primary_key or (0,)
        return replace(entry, id=int(new_id))

    def entries(
        self,
        *,
        since: datetime | None = None,
        actor: str | None = None,
        target_type: str | None = None,
        target_id: str | None = None,
        before_id: int | None = None,
        limit: int = AUDIT_BATCH,
    ) -> list[AuditEntry]:
        """The audit rows matching every filter given, newest first: at or after ``since``, by
        ``actor``, on ``target_type``/``target_id``, with an id below ``before_id`` (the next page
        of a list), at most ``limit``."""
        query = select(audit_log).order_by(audit_log.c.id.desc()).limit(max(1, limit))
        if since is not None:
            query = query.where(audit_log.c.at >= since)
        if actor is not None:
            query = query.where(audit_log.c.actor == actor)
        if target_type is not None:
            query = query.where(audit_log.c.target_type == target_type)
        if target_id is not None:
            query = query.where(audit_log.c.target_id == target_id)
        if before_id is not None:
            query = query.where(audit_log.c.id < before_id)
        with self._engine.connect() as conn:
            return [_entry(row) for row in conn.execute(query)]
