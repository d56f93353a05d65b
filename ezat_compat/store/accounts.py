"""Organisations, API keys and authentication.

The CLI calls ``Accounts`` to manage orgs and keys (``ezat-compat orgs …``, ``keys …``); the
request pipeline calls ``Accounts.authenticate`` once per request, which costs one indexed
SELECT and never caches, so a revoked or expired key is refused at once by every worker.

A key is ``ezat_sk_`` + 32 base62 characters (190 bits from ``secrets``). It is shown once, at
creation; the database keeps only its SHA-256 and a display prefix (its first 12 characters).

Management errors (unknown org, duplicate name, bad argument) raise ``StoreError``: print its
message to the operator. ``authenticate`` raises the gateway's 401/403 errors.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, Row, insert, select, update
from sqlalchemy.exc import IntegrityError

from ezat_compat.errors import AuthenticationError, PermissionDeniedError
from ezat_compat.pricing import micros_to_usd
from ezat_compat.store.db import write_engine
from ezat_compat.store.hotpath import AUTH_SQL, HotPath
from ezat_compat.store.tables import api_keys, orgs, to_epoch_micros

KEY_PREFIX = "ezat_sk_"
_KEY_ALPHABET = string.ascii_letters + string.digits
_KEY_RANDOM_CHARS = 32  # 32 × log2(62) ≈ 190 bits
DISPLAY_PREFIX_LEN = 12
_ORG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class StoreError(Exception):
    """An operator command can't be done (unknown org or key, name taken, bad value).
    The message says what and how to fix it: print it and exit non-zero."""


@dataclass(frozen=True, slots=True)
class OrgInfo:
    """An organisation as stored. Money in micro-USD; ``available_micros`` is what new
    requests may still reserve."""

    id: int
    name: str
    balance_micros: int
    reserved_micros: int
    suspended: bool
    created_at: datetime

    @property
    def available_micros(self) -> int:
        return self.balance_micros - self.reserved_micros


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """An API key as listed by ``keys list`` (never its secret). ``id`` is the public id that
    ``keys revoke`` takes."""

    id: str
    prefix: str
    org: str
    name: str
    models: tuple[str, ...]
    spend_limit_micros: int | None
    spent_micros: int
    rpm: int | None
    tpm: int | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        """The object of ``keys list --json`` (a contract of the operator interface): dollars as
        decimal strings, times as ISO 8601 UTC, ``models`` as a list (empty: every model)."""
        return {
            "id": self.id,
            "prefix": self.prefix,
            "org": self.org,
            "name": self.name,
            "models": list(self.models),
            "spend_limit_usd": None if self.spend_limit_micros is None else micros_to_usd(self.spend_limit_micros),
            "spent_usd": micros_to_usd(self.spent_micros),
            "rpm": self.rpm,
            "tpm": self.tpm,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
        }


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z``: ``2025-01-31T12:00:00.123456Z``."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern.lower()))


@dataclass(frozen=True, slots=True)
class AuthContext:
    """Who is calling: what the rest of the pipeline needs about the key and its org."""

    key_id: int
    key_public_id: str
    org_id: int
    org_name: str
    model_patterns: tuple[str, ...]
    spend_limit_micros: int | None
    rpm: int | None
    tpm: int | None

    def allows(self, model_id: str, aliases: Sequence[str] = ()) -> bool:
        """Whether the key may use the model: any of its glob patterns (``*``, ``?``, ``[…]``,
        any letter case) matches the canonical id or one of the aliases. No patterns: every
        model. When it returns False, answer 403 ``PermissionDeniedError``."""
        if not self.model_patterns:
            return True
        names = [model_id.lower(), *(alias.lower() for alias in aliases)]
        return any(_compiled(p).match(name) for p in self.model_patterns for name in names)


def hash_key(secret: str) -> str:
    """SHA-256 hex of a key secret, as stored in ``api_keys.key_hash``."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_secret() -> str:
    """A fresh key secret: ``ezat_sk_`` + 32 random base62 characters."""
    return KEY_PREFIX + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(_KEY_RANDOM_CHARS))


def _split_patterns(stored: str) -> tuple[str, ...]:
    return tuple(p for p in stored.split(",") if p)


def _clean_patterns(models: Sequence[str]) -> tuple[str, ...]:
    if isinstance(models, str):
        raise StoreError("models: pass a list of patterns, not one string")
    cleaned = tuple(p.strip() for p in models)
    for pattern in cleaned:
        if not pattern or "," in pattern:
            raise StoreError(
                f"models: {pattern!r} is not a model pattern; use ids or globs like "
                "anthropic/claude-sonnet-*, separated by commas"
            )
    if len(",".join(cleaned)) > 2048:
        raise StoreError("models: the patterns are too long together (at most 2048 characters)")
    return cleaned


def _check_positive(name: str, value: int | None, *, zero_ok: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero_ok else 1):
        least = "0" if zero_ok else "1"
        raise StoreError(f"{name}: must be a whole number of at least {least}, got {value!r}")


_KEY_COLUMNS = (
    api_keys.c.public_id,
    api_keys.c.prefix,
    orgs.c.name.label("org"),
    api_keys.c.name,
    api_keys.c.models,
    api_keys.c.spend_limit_micros,
    api_keys.c.spent_micros,
    api_keys.c.rpm,
    api_keys.c.tpm,
    api_keys.c.created_at,
    api_keys.c.expires_at,
    api_keys.c.revoked_at,
)
_KEYS = select(*_KEY_COLUMNS).select_from(api_keys.join(orgs, api_keys.c.org_id == orgs.c.id))


def _key_info(row: Row[Any, *tuple[Any, ...]]) -> KeyInfo:
    return KeyInfo(
        id=row.public_id,
        prefix=row.prefix,
        org=row.org,
        name=row.name,
        models=_split_patterns(row.models),
        spend_limit_micros=row.spend_limit_micros,
        spent_micros=row.spent_micros,
        rpm=row.rpm,
        tpm=row.tpm,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


def _org_info(row: Row[Any]) -> OrgInfo:
    return OrgInfo(
        id=row.id,
        name=row.name,
        balance_micros=row.balance_micros,
        reserved_micros=row.reserved_micros,
        suspended=row.suspended,
        created_at=row.created_at,
    )


class Accounts:
    """Organisations and keys in the database behind ``engine`` (migrated with ``migrate``).

    ``hot_path`` runs ``authenticate``: the one ``make_hot_path(engine)`` of the process, shared
    with ``Ledger``. Thread-safe; create one per process and share it.
    """

    def __init__(self, engine: Engine, hot_path: HotPath) -> None:
        self._engine = engine
        self._writer = write_engine(engine)
        self._read = hot_path.read

    # ------------------------------------------------------------ organisations

    def create_org(self, name: str, balance_micros: int = 0, *, now: datetime | None = None) -> OrgInfo:
        """Create an organisation with a starting balance. ``StoreError`` if the name is taken
        or not a plain name (letters, digits, ``.``, ``_``, ``-``; up to 128)."""
        if not isinstance(name, str) or not _ORG_NAME.fullmatch(name):
            raise StoreError(
                f"{name!r} is not a valid organization name; use letters, digits, '.', '_' "
                "and '-' (up to 128 characters, starting with a letter or digit)"
            )
        _check_positive("balance", balance_micros, zero_ok=True)
        try:
            with self._writer.begin() as conn:
                conn.execute(
                    insert(orgs).values(
                        name=name,
                        balance_micros=balance_micros,
                        reserved_micros=0,
                        suspended=False,
                        created_at=now or datetime.now(UTC),
                    )
                )
        except IntegrityError:
            raise StoreError(f"An organization named {name!r} already exists.") from None
        return self.get_org(name)

    def get_org(self, name: str) -> OrgInfo:
        """The organisation named ``name``; ``StoreError`` if there is none."""
        with self._engine.connect() as conn:
            row = conn.execute(select(orgs).where(orgs.c.name == name)).first()
        if row is None:
            raise StoreError(f"There is no organization named {name!r}; create it with `orgs create {name}`.")
        return _org_info(row)

    def list_orgs(self) -> list[OrgInfo]:
        """Every organisation, by name."""
        with self._engine.connect() as conn:
            return [_org_info(row) for row in conn.execute(select(orgs).order_by(orgs.c.name))]

    def top_up(self, name: str, micros: int) -> OrgInfo:
        """Add ``micros`` (> 0) to the organisation's balance; returns the updated org."""
        _check_positive("amount", micros)
        with self._writer.begin() as conn:
            done = conn.execute(
                update(orgs).where(orgs.c.name == name).values(balance_micros=orgs.c.balance_micros + micros)
            ).rowcount
        if not done:
            self.get_org(name)  # raises the "no organization" error
        return self.get_org(name)

    def set_suspended(self, name: str, suspended: bool) -> OrgInfo:
        """Suspend (every key answers 403 at once) or resume an organisation."""
        with self._writer.begin() as conn:
            done = conn.execute(update(orgs).where(orgs.c.name == name).values(suspended=suspended)).rowcount
        if not done:
            self.get_org(name)
        return self.get_org(name)

    # ------------------------------------------------------------ keys

    def create_key(
        self,
        org_name: str,
        *,
        name: str = "",
        models: Sequence[str] = (),
        spend_limit_micros: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: datetime | None = None,
        now: datetime | None = None,
    ) -> tuple[KeyInfo, str]:
        """Create a key for ``org_name``; returns its info and its secret.

        Show the secret to the operator once (``keys create`` prints it as its last line):
        it can't be recovered. ``models`` are glob patterns (empty: every model);
        ``expires_at`` must be an aware datetime in the future.
        """
        now = now or datetime.now(UTC)
        patterns = _clean_patterns(models)
        _check_positive("spend limit", spend_limit_micros, zero_ok=True)
        _check_positive("rpm", rpm)
        _check_positive("tpm", tpm)
        if len(name) > 128:
            raise StoreError("name: at most 128 characters")
        if expires_at is not None:
            if expires_at.tzinfo is None:
                raise StoreError("expires: give a time zone, e.g. 2030-01-01T00:00:00Z")
            if expires_at <= now:
                raise StoreError(f"expires: {iso(expires_at)} is in the past")
        org = self.get_org(org_name)
        secret = new_secret()
        with self._writer.begin() as conn:
            conn.execute(
                insert(api_keys).values(
                    public_id="key_" + secrets.token_hex(6),
                    org_id=org.id,
                    name=name,
                    prefix=secret[:DISPLAY_PREFIX_LEN],
                    key_hash=hash_key(secret),
                    models=",".join(patterns),
                    spend_limit_micros=spend_limit_micros,
                    spent_micros=0,
                    reserved_micros=0,
                    rpm=rpm,
                    tpm=tpm,
                    created_at=now,
                    expires_at=expires_at,
                    revoked_at=None,
                )
            )
            row = conn.execute(_KEYS.where(api_keys.c.key_hash == hash_key(secret))).one()
        return _key_info(row), secret

    def list_keys(self, org_name: str | None = None) -> list[KeyInfo]:
        """Every key (of ``org_name`` if given; ``StoreError`` if that org doesn't exist),
        oldest first."""
        query = _KEYS.order_by(api_keys.c.created_at, api_keys.c.id)
        if org_name is not None:
            query = query.where(api_keys.c.org_id == self.get_org(org_name).id)
        with self._engine.connect() as conn:
            return [_key_info(row) for row in conn.execute(query)]

    def update_key(self, public_id: str, **changes: int | None) -> KeyInfo:
        """Change a key's ``spend_limit_micros``, ``rpm`` or ``tpm`` (None: no limit), seen by
        the gateway on the key's next request; ``StoreError`` if there is no such key. What is
        spent and held is kept: a limit below it refuses the key's next request (402)."""
        allowed = {"spend_limit_micros", "rpm", "tpm"}
        unknown = set(changes) - allowed
        if unknown:
            raise StoreError(f"can't change {', '.join(sorted(unknown))}")
        _check_positive("spend limit", changes.get("spend_limit_micros"), zero_ok=True)
        _check_positive("rpm", changes.get("rpm"))
        _check_positive("tpm", changes.get("tpm"))
        with self._writer.begin() as conn:
            if changes:
                conn.execute(update(api_keys).where(api_keys.c.public_id == public_id).values(**changes))
            row = conn.execute(_KEYS.where(api_keys.c.public_id == public_id)).first()
        if row is None:
            raise StoreError(f"There is no key {public_id!r}; `keys list` shows the ids (key_…).")
        return _key_info(row)

    def revoke_key(self, public_id: str, *, now: datetime | None = None) -> KeyInfo:
        """Revoke a key by its public id (``key_…``); it answers 401 from the next request on.
        Revoking twice keeps the first revocation time. ``StoreError`` if there is no such key."""
        with self._writer.begin() as conn:
            conn.execute(
                update(api_keys)
                .where(api_keys.c.public_id == public_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=now or datetime.now(UTC))
            )
            row = conn.execute(_KEYS.where(api_keys.c.public_id == public_id)).first()
        if row is None:
            raise StoreError(f"There is no key {public_id!r}; `keys list` shows the ids (key_…).")
        return _key_info(row)

    # ------------------------------------------------------------ the hot path

    def authenticate(self, secret: str, now: datetime) -> AuthContext:
        """Who is calling with ``secret``: one indexed SELECT of the key and its org.

        Raises ``AuthenticationError`` (401) for an unknown, revoked or expired key and
        ``PermissionDeniedError`` (403) when the organisation is suspended. The model check
        is the caller's: ``ctx.allows(model.id, model.aliases)``.
        """
        if not secret or not secret.startswith(KEY_PREFIX):
            raise AuthenticationError("Invalid API key.")
        row = self._read(AUTH_SQL, {"key_hash": hash_key(secret)})
        if row is None:
            raise AuthenticationError("Invalid API key.")
        key_id, public_id, models, spend_limit, rpm, tpm, expires_at, revoked_at, org_id, org_name, suspended = row
        if revoked_at is not None:
            raise AuthenticationError("This API key has been revoked.")
        if expires_at is not None and expires_at <= to_epoch_micros(now):
            raise AuthenticationError("This API key has expired.")
        if suspended:
            raise PermissionDeniedError(
                f"The organization '{org_name}' is suspended; ask your administrator to resume it."
            )
        return AuthContext(
            key_id=key_id,
            key_public_id=public_id,
            org_id=org_id,
            org_name=org_name,
            model_patterns=_split_patterns(models),
            spend_limit_micros=spend_limit,
            rpm=rpm,
            tpm=tpm,
        )
