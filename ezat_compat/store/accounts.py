"""Organisations, API keys and authentication.

The CLI and the admin API (through ``admin/service.py``) call ``Accounts`` to manage orgs and keys
(``ezat-compat orgs …``, ``keys …``); the request pipeline calls ``Accounts.authenticate`` once
per request, which costs one indexed SELECT and never caches, so a revoked, blocked or expired
key (or a rotated key's previous secret past its grace window) is refused at once by every worker.

A key is ``ezat_sk_`` + 32 base62 characters (190 bits from ``secrets``). It is shown once, at
creation (and at each rotation); the database keeps only its SHA-256 and a display prefix (its
first 12 characters). A rotated key's previous secret is kept as its SHA-256 in ``api_key_grace``
until its grace window ends, and read only when a secret matches no key.

Its public id is ``key_`` + 12 hex digits; the admin API writes it ``apikey_`` + the same digits
(``api_key_id``) and takes either (``key_public_id``). An organisation's public id (the admin API's
workspace id) is ``wrkspc_01`` + 22 base62 characters.

``last_used_at`` is written off the request's path: ``authenticate`` notes the key in memory, at
most once a minute per key and process, and a background thread (a greenlet in a gevent worker)
writes what was noted in one statement per key.

Management errors (unknown org, duplicate name, bad argument) raise ``StoreError``: print its
message to the operator. ``authenticate`` raises the gateway's 401/403 errors.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import re
import secrets
import string
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import BigInteger, Engine, Row, delete, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError

from ezat_compat.errors import AuthenticationError, PermissionDeniedError
from ezat_compat.locks import thread_lock
from ezat_compat.pricing import micros_to_usd
from ezat_compat.procid import after_fork
from ezat_compat.store.db import write_engine
from ezat_compat.store.hotpath import AUTH_BY_ID_SQL, AUTH_GRACE_SQL, AUTH_SQL, Execute, HotPath
from ezat_compat.store.tables import api_key_grace, api_keys, orgs, to_epoch_micros

log = logging.getLogger("ezat_compat.accounts")

KEY_PREFIX = "ezat_sk_"
_KEY_ALPHABET = string.ascii_letters + string.digits
_KEY_RANDOM_CHARS = 32  # 32 × log2(62) ≈ 190 bits
DISPLAY_PREFIX_LEN = 12
_ORG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
KEY_ID_PREFIX = "key_"
API_KEY_ID_PREFIX = "apikey_"  # the admin API's spelling of a key's id
WORKSPACE_ID_PREFIX = "wrkspc_"
MAX_GRACE = timedelta(days=7)  # the longest a rotated key's previous secret may keep working
LAST_USED_EVERY_MICROS = 60_000_000  # ``last_used_at`` is written at most once a minute per key and process
TOUCH_SQL = "UPDATE api_keys SET last_used_at = :at WHERE id = :key_id AND (last_used_at IS NULL OR last_used_at < :at)"


def api_key_id(public_id: str) -> str:
    """The admin API's id of a key: ``key_1a2b…`` (or already ``apikey_1a2b…``) -> ``apikey_1a2b…``."""
    return API_KEY_ID_PREFIX + key_public_id(public_id).removeprefix(KEY_ID_PREFIX)


def key_public_id(given: str) -> str:
    """A key's public id from either spelling: ``apikey_1a2b…`` or ``key_1a2b…`` -> ``key_1a2b…``."""
    if given.startswith(API_KEY_ID_PREFIX):
        return KEY_ID_PREFIX + given[len(API_KEY_ID_PREFIX) :]
    return given


def new_workspace_id() -> str:
    """A fresh organisation public id: ``wrkspc_01`` + 22 base62 characters (Anthropic's form)."""
    return WORKSPACE_ID_PREFIX + "01" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(22))


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
    public_id: str = ""  # the admin API's workspace id (``wrkspc_…``)
    suspended_at: datetime | None = None
    models: tuple[str, ...] = ()  # what its keys may use at most (empty: every model)
    rpm: int | None = None  # each of its keys' requests per minute at most
    tpm: int | None = None  # each of its keys' tokens per minute at most

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
    blocked_at: datetime | None = None
    last_used_at: datetime | None = None
    created_by: str | None = None
    org_public_id: str = ""
    user_id: int | None = None  # the person's row id, for a person's key (store/people.py)

    def status(self, now: datetime) -> str:
        """The admin API's status: ``archived`` (revoked), ``expired``, ``inactive`` (blocked) or
        ``active``, in that order of precedence."""
        if self.revoked_at is not None:
            return "archived"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        if self.blocked_at is not None:
            return "inactive"
        return "active"

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
    rpm: int | None  # the key's own or its organisation's, the lower of the two when both are set
    tpm: int | None
    org_model_patterns: tuple[str, ...] = ()  # the organisation's model access (empty: every model)
    # A person's key (store/people.py): the person's row id, their mapped groups' ids and what
    # those groups let them use (empty: every model).
    user_id: int | None = None
    user_public_id: str = ""  # "user_…"
    group_ids: tuple[int, ...] = ()
    user_model_patterns: tuple[str, ...] = ()

    @property
    def rate_id(self) -> str:
        """Whose requests and tokens per minute are counted: the key's, or for a person's key
        the person's (all their keys together)."""
        return str(self.key_id) if self.user_id is None else f"u{self.user_id}"

    @property
    def rate_subject(self) -> str:
        """Who a rate limit's refusal names: ``key key_…`` or ``user user_…``."""
        return f"key {self.key_public_id}" if self.user_id is None else f"user {self.user_public_id}"

    def allows(self, model_id: str, aliases: Sequence[str] = ()) -> bool:
        """Whether the key may use the model: one of the key's glob patterns (``*``, ``?``,
        ``[…]``, any letter case) matches the canonical id or one of the aliases, and so does
        one of its organisation's and, for a person's key, one of their groups'. No patterns
        (of any): every model. When it returns False, answer 403 ``PermissionDeniedError``."""
        if not self.model_patterns and not self.org_model_patterns and not self.user_model_patterns:
            return True
        names = [model_id.lower(), *(alias.lower() for alias in aliases)]
        return all(
            any(_compiled(p).match(name) for p in patterns for name in names)
            for patterns in (self.model_patterns, self.org_model_patterns, self.user_model_patterns)
            if patterns
        )


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
    orgs.c.public_id.label("org_public_id"),
    api_keys.c.blocked_at,
    api_keys.c.last_used_at,
    api_keys.c.created_by,
    api_keys.c.name,
    api_keys.c.models,
    api_keys.c.spend_limit_micros,
    api_keys.c.spent_micros,
    api_keys.c.rpm,
    api_keys.c.tpm,
    api_keys.c.created_at,
    api_keys.c.expires_at,
    api_keys.c.revoked_at,
    api_keys.c.user_id,
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
        blocked_at=row.blocked_at,
        last_used_at=row.last_used_at,
        created_by=row.created_by,
        org_public_id=row.org_public_id or "",
        user_id=row.user_id,
    )


def _org_info(row: Row[Any]) -> OrgInfo:
    return OrgInfo(
        id=row.id,
        name=row.name,
        balance_micros=row.balance_micros,
        reserved_micros=row.reserved_micros,
        suspended=row.suspended,
        created_at=row.created_at,
        public_id=row.public_id or "",
        suspended_at=row.suspended_at,
        models=_split_patterns(row.models or ""),
        rpm=row.rpm,
        tpm=row.tpm,
    )


def _first_time(column: Any, moment: datetime) -> Any:
    """SQL for "``column`` if set, else ``moment``" (a time column keeps its first value)."""
    return func.coalesce(column, literal(to_epoch_micros(moment), BigInteger))


def _lower(a: int | None, b: int | None) -> int | None:
    """The lower of two caps, either of which may be None (no cap)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def _touch_tx(execute: Execute, noted: Sequence[tuple[int, int]]) -> tuple[None, bool]:
    for key_id, at in noted:
        execute(TOUCH_SQL, {"key_id": key_id, "at": at})
    return None, True


@dataclass(eq=False)
class LastUsed:
    """When each key was last used, noted in memory by ``authenticate`` at most once every
    ``LAST_USED_EVERY_MICROS`` per key and written by a background thread (a greenlet under
    gevent): the request pays a dictionary lookup; the database one short write per key a minute.
    A write that fails is dropped (it is a hint, not a record)."""

    hot: HotPath
    background: bool = False  # True in the gateway's store (``open_store``); else ``flush`` writes
    _seen: dict[int, int] = field(default_factory=dict)
    _pending: dict[int, int] = field(default_factory=dict)
    _writing: bool = False
    _lock: Any = field(default_factory=thread_lock)

    def __post_init__(self) -> None:
        after_fork(self, LastUsed._forked)

    def _forked(self) -> None:
        self._seen, self._pending, self._writing, self._lock = {}, {}, False, thread_lock()

    def note(self, key_id: int, at_micros: int) -> None:
        last = self._seen.get(key_id)
        if last is not None and at_micros - last < LAST_USED_EVERY_MICROS:
            return
        with self._lock:
            self._seen[key_id] = at_micros
            self._pending[key_id] = at_micros
            start = self.background and not self._writing
            if start:
                self._writing = True
        if start:
            threading.Thread(target=self._write_loop, name="ezat-last-used", daemon=True).start()

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._writing = False
                    return
            try:
                self.flush()
            except Exception as exc:  # a hint only: dropped, said once per failing round
                log.debug("last_used_at not written: %s", exc)

    def flush(self) -> None:
        """Write what was noted (tests call it to see the write at once)."""
        with self._lock:
            noted, self._pending = sorted(self._pending.items()), {}
        if noted:
            self.hot.write(_touch_tx, noted)


class Accounts:
    """Organisations and keys in the database behind ``engine`` (migrated with ``migrate``).

    ``hot_path`` runs ``authenticate``: the one ``make_hot_path(engine)`` of the process, shared
    with ``Ledger``. Thread-safe; create one per process and share it. ``last_used_in_background``:
    the keys' last use is written by a background thread (the gateway's store); else only when
    ``last_used.flush()`` is called.
    """

    def __init__(self, engine: Engine, hot_path: HotPath, *, last_used_in_background: bool = False) -> None:
        self._engine = engine
        self._writer = write_engine(engine)
        self._read = hot_path.read
        self.last_used = LastUsed(hot_path, background=last_used_in_background)

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
                        public_id=new_workspace_id(),
                        models="",
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

    def find_org(self, ref: str) -> OrgInfo | None:
        """The organisation whose workspace id (``wrkspc_…``) or name is ``ref``, or None."""
        with self._engine.connect() as conn:
            row = conn.execute(select(orgs).where(orgs.c.public_id == ref)).first()
            if row is None:
                row = conn.execute(select(orgs).where(orgs.c.name == ref)).first()
        return None if row is None else _org_info(row)

    def list_orgs(self) -> list[OrgInfo]:
        """Every organisation, by name."""
        with self._engine.connect() as conn:
            return [_org_info(row) for row in conn.execute(select(orgs).order_by(orgs.c.name))]

    def list_orgs_by_creation(self) -> list[OrgInfo]:
        """Every organisation, oldest first (the admin API's workspace order)."""
        with self._engine.connect() as conn:
            return [_org_info(row) for row in conn.execute(select(orgs).order_by(orgs.c.created_at, orgs.c.id))]

    def rename_org(self, name: str, new_name: str) -> OrgInfo:
        """Rename an organisation (its keys, balance and id stay); ``StoreError`` if the new name
        is taken or not a plain name."""
        if not isinstance(new_name, str) or not _ORG_NAME.fullmatch(new_name):
            raise StoreError(
                f"{new_name!r} is not a valid organization name; use letters, digits, '.', '_' "
                "and '-' (up to 128 characters, starting with a letter or digit)"
            )
        self.get_org(name)
        try:
            with self._writer.begin() as conn:
                conn.execute(update(orgs).where(orgs.c.name == name).values(name=new_name))
        except IntegrityError:
            raise StoreError(f"An organization named {new_name!r} already exists.") from None
        return self.get_org(new_name)

    def set_org_access(self, name: str, **changes: Any) -> OrgInfo:
        """Change an organisation's ``models`` (patterns; empty: every model), ``rpm`` or ``tpm``
        (None: no cap), which cap each of its keys from the key's next request on."""
        unknown = set(changes) - {"models", "rpm", "tpm"}
        if unknown:
            raise StoreError(f"can't change {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        if "models" in changes:
            values["models"] = ",".join(_clean_patterns(changes["models"]))
        for cap in ("rpm", "tpm"):
            if cap in changes:
                _check_positive(cap, changes[cap])
                values[cap] = changes[cap]
        if values:
            with self._writer.begin() as conn:
                done = conn.execute(update(orgs).where(orgs.c.name == name).values(**values)).rowcount
            if not done:
                self.get_org(name)
        return self.get_org(name)

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

    def set_suspended(self, name: str, suspended: bool, *, now: datetime | None = None) -> OrgInfo:
        """Suspend (every key answers 403 at once) or resume an organisation. Suspending one
        already suspended keeps the first ``suspended_at``."""
        query = update(orgs).where(orgs.c.name == name)
        if suspended:
            when = now or datetime.now(UTC)
            query = query.values(suspended=True, suspended_at=_first_time(orgs.c.suspended_at, when))
        else:
            query = query.values(suspended=False, suspended_at=None)
        with self._writer.begin() as conn:
            done = conn.execute(query).rowcount
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
        created_by: str | None = None,
        user_id: int | None = None,
    ) -> tuple[KeyInfo, str]:
        """Create a key for ``org_name``; returns its info and its secret. ``user_id``: the
        person it belongs to (store/people.py), for good.

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
                    created_by=created_by,
                    user_id=user_id,
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

    def get_key(self, public_id: str) -> KeyInfo:
        """The key ``public_id`` (``key_…`` or ``apikey_…``); ``StoreError`` if there is none."""
        public_id = key_public_id(public_id)
        with self._engine.connect() as conn:
            row = conn.execute(_KEYS.where(api_keys.c.public_id == public_id)).first()
        if row is None:
            raise StoreError(f"There is no key {public_id!r}; `keys list` shows the ids (key_…).")
        return _key_info(row)

    def update_key(self, public_id: str, **changes: Any) -> KeyInfo:
        """Change a key's ``spend_limit_micros``, ``rpm`` or ``tpm`` (None: no limit), ``name``,
        ``models`` (patterns; empty: every model) or ``expires_at`` (None: never; else an aware
        time in the future), seen by the gateway on the key's next request; ``StoreError`` if
        there is no such key. What is spent and held is kept: a limit below it refuses the key's
        next request (402)."""
        public_id = key_public_id(public_id)
        allowed = {"spend_limit_micros", "rpm", "tpm", "name", "models", "expires_at"}
        unknown = set(changes) - allowed
        if unknown:
            raise StoreError(f"can't change {', '.join(sorted(unknown))}")
        _check_positive("spend limit", changes.get("spend_limit_micros"), zero_ok=True)
        _check_positive("rpm", changes.get("rpm"))
        _check_positive("tpm", changes.get("tpm"))
        values = dict(changes)
        if "name" in values and (not isinstance(values["name"], str) or len(values["name"]) > 128):
            raise StoreError("name: at most 128 characters")
        if "models" in values:
            values["models"] = ",".join(_clean_patterns(values["models"]))
        if values.get("expires_at") is not None:
            expires_at = values["expires_at"]
            if expires_at.tzinfo is None:
                raise StoreError("expires: give a time zone, e.g. 2030-01-01T00:00:00Z")
            if expires_at <= datetime.now(UTC):
                raise StoreError(f"expires: {iso(expires_at)} is in the past")
        with self._writer.begin() as conn:
            if values:
                conn.execute(update(api_keys).where(api_keys.c.public_id == public_id).values(**values))
            row = conn.execute(_KEYS.where(api_keys.c.public_id == public_id)).first()
        if row is None:
            raise StoreError(f"There is no key {public_id!r}; `keys list` shows the ids (key_…).")
        return _key_info(row)

    def set_blocked(self, public_id: str, blocked: bool, *, now: datetime | None = None) -> KeyInfo:
        """Block a key (refused with 401 from its next request on, until unblocked) or unblock
        it. Blocking twice keeps the first time; a revoked key can't be unblocked or blocked
        (``StoreError``): revocation is final."""
        key = self.get_key(public_id)
        if key.revoked_at is not None:
            raise StoreError(f"The key {key.id!r} is revoked; a revoked key stays revoked (create a new one).")
        value = _first_time(api_keys.c.blocked_at, now or datetime.now(UTC)) if blocked else None
        with self._writer.begin() as conn:
            conn.execute(update(api_keys).where(api_keys.c.public_id == key.id).values(blocked_at=value))
        return self.get_key(key.id)

    def rotate_key(
        self, public_id: str, *, grace: timedelta = timedelta(0), now: datetime | None = None
    ) -> tuple[KeyInfo, str]:
        """Give a key a new secret; returns its info and the new secret (shown once). The
        previous secret keeps working until ``grace`` has passed (0: refused at once; at most
        ``MAX_GRACE``); the key's id, limits, spend and history stay. ``StoreError`` for a
        revoked key or a grace out of range."""
        now = now or datetime.now(UTC)
        if grace < timedelta(0) or grace > MAX_GRACE:
            raise StoreError(f"grace: between 0 and {int(MAX_GRACE.total_seconds())} seconds")
        public_id = key_public_id(public_id)
        secret = new_secret()
        with self._writer.begin() as conn:
            row = conn.execute(
                select(api_keys.c.id, api_keys.c.key_hash, api_keys.c.revoked_at).where(
                    api_keys.c.public_id == public_id
                )
            ).first()
            if row is None:
                raise StoreError(f"There is no key {public_id!r}; `keys list` shows the ids (key_…).")
            if row.revoked_at is not None:
                raise StoreError(f"The key {public_id!r} is revoked; a revoked key can't be rotated.")
            conn.execute(delete(api_key_grace).where(api_key_grace.c.expires_at <= now))
            if grace > timedelta(0):
                conn.execute(insert(api_key_grace).values(key_hash=row.key_hash, key_id=row.id, expires_at=now + grace))
            conn.execute(
                update(api_keys)
                .where(api_keys.c.id == row.id)
                .values(key_hash=hash_key(secret), prefix=secret[:DISPLAY_PREFIX_LEN])
            )
        return self.get_key(public_id), secret

    def revoke_key(self, public_id: str, *, now: datetime | None = None) -> KeyInfo:
        """Revoke a key by its public id (``key_…`` or ``apikey_…``); it answers 401 from the next
        request on, its previous secrets too. Revoking twice keeps the first revocation time.
        ``StoreError`` if there is no such key."""
        public_id = key_public_id(public_id)
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
        """Who is calling with ``secret``: one indexed SELECT of the key and its org (a second
        one, of the rotated keys' previous secrets, only when the first finds nothing).

        Raises ``AuthenticationError`` (401) for an unknown, revoked, expired or blocked key and
        ``PermissionDeniedError`` (403) when the organisation is suspended. The model check
        is the caller's: ``ctx.allows(model.id, model.aliases)``. The key's rate caps are its
        own or its organisation's, the lower of the two when both are set.
        """
        if not secret or not secret.startswith(KEY_PREFIX):
            raise AuthenticationError("Invalid API key.")
        key_hash = hash_key(secret)
        now_micros = to_epoch_micros(now)
        row = self._read(AUTH_SQL, {"key_hash": key_hash})
        if row is None:
            row = self._read(AUTH_GRACE_SQL, {"key_hash": key_hash, "now": now_micros})
            if row is None:
                raise AuthenticationError("Invalid API key.")
        return self._context(row, now_micros)

    def authenticate_key_id(self, key_id: int, now: datetime) -> AuthContext:
        """``authenticate`` of the key whose row id is ``key_id`` (a person's IdP-token key,
        idp/bearer.py): the same checks, the same errors."""
        row = self._read(AUTH_BY_ID_SQL, {"key_id": key_id})
        if row is None:
            raise AuthenticationError("Invalid API key.")
        return self._context(row, to_epoch_micros(now))

    def _context(self, row: Sequence[Any], now_micros: int) -> AuthContext:
        (key_id, public_id, models, spend_limit, rpm, tpm, expires_at, revoked_at, blocked_at) = row[:9]
        org_id, org_name, suspended, org_models, org_rpm, org_tpm = row[9:15]
        user_id, user_disabled_at, user_models, group_ids, user_public_id = row[15:20]
        if revoked_at is not None:
            raise AuthenticationError("This API key has been revoked.")
        if expires_at is not None and expires_at <= now_micros:
            raise AuthenticationError("This API key has expired.")
        if blocked_at is not None:
            raise AuthenticationError("This API key is disabled; ask your administrator to enable it.")
        if user_disabled_at is not None:
            raise AuthenticationError("This API key's owner is disabled; ask your administrator to enable them.")
        if suspended:
            raise PermissionDeniedError(
                f"The organization '{org_name}' is suspended; ask your administrator to resume it."
            )
        self.last_used.note(key_id, now_micros)
        if user_id is not None:
            return AuthContext(
                key_id=key_id,
                key_public_id=public_id,
                org_id=org_id,
                org_name=org_name,
                model_patterns=_split_patterns(models),
                spend_limit_micros=spend_limit,
                # a person's keys share one budget: the lowest of the key's, the organisation's,
                # the person's own and their groups' caps, counted for the person (``rate_id``)
                rpm=_lower(_lower(rpm, org_rpm), _lower(row[20], row[22])),
                tpm=_lower(_lower(tpm, org_tpm), _lower(row[21], row[23])),
                org_model_patterns=_split_patterns(org_models) if org_models else (),
                user_id=user_id,
                user_public_id=user_public_id,
                group_ids=tuple(int(g) for g in group_ids.split(",")) if group_ids else (),
                user_model_patterns=_split_patterns(user_models) if user_models else (),
            )
        return AuthContext(
            key_id=key_id,
            key_public_id=public_id,
            org_id=org_id,
            org_name=org_name,
            model_patterns=_split_patterns(models),
            spend_limit_micros=spend_limit,
            rpm=_lower(rpm, org_rpm),
            tpm=_lower(tpm, org_tpm),
            org_model_patterns=_split_patterns(org_models) if org_models else (),
        )
