"""People and the IdP's groups: who signs in, what their groups give them, and their keys.

A person (``users``) is created at their first sign-in — the console, a command-line sign-in
(the device grant) or a JWT bearer — from the ID token's (or the JWT's) claims: ``sub``, ``email``,
``name`` and the groups of ``[identity] groups_claim``, and brought up to date at each later one.
The groups the gateway knows (``idp_groups``: ``[identity.groups]`` of the file, rewritten at each
start, or made through the admin API) map a person to:

- the organisation that pays for their requests: the first of their mapped groups (by name) that
  names one, else ``[identity] default_org``; none of either: the person gets no key
  (``NoOrganisationError``, a 403);
- the models they may use: every pattern of their mapped groups (one group with none: every
  model); in no mapped group, every model (the organisation's own access still applies);
- per-person spend caps (``daily``/``weekly``/``monthly``): a spend limit of scope "user" made at
  sign-in for each period the person has none of yet (the smallest of their groups' caps).

The person's mapped groups, models and disabled mark are read by authentication with their key
(store/hotpath.py ``AUTH_SQL``, one row), so a disabled person, or a change of their groups, is
refused or applied at their next request on every worker and node. Disabling can also revoke
every live key of the person at once (``set_disabled(..., revoke_keys=True)``).

A person's keys are ordinary keys of their organisation with ``api_keys.user_id`` set: minted by a
command-line sign-in for a few hours (``mint_key``), or their one IdP-token key (``bearer_key``)
that requests made with a JWT bearer are billed to (never usable with a secret: none exists).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ezat_compat.domain import GroupSettings, IdentitySettings
from ezat_compat.errors import AuthenticationError, PermissionDeniedError
from ezat_compat.store.accounts import (
    Accounts,
    KeyInfo,
    StoreError,
    _check_positive,
    _clean_patterns,
    _split_patterns,
    iso,
)
from ezat_compat.store.db import write_engine
from ezat_compat.store.spend import SCOPE_USER, SpendLimits, insert_limit
from ezat_compat.store.tables import api_keys, console_sessions, idp_groups, orgs, spend_limits, users

log = logging.getLogger("ezat_compat")

USER_ID_PREFIX = "user_"
GROUP_ID_PREFIX = "group_"
BEARER_KEY_NAME = "IdP tokens"  # the name of a person's IdP-token key
SOURCE_CONFIG = "config"
SOURCE_API = "api"
_ID_ALPHABET = string.ascii_letters + string.digits
_PERIOD_COLUMNS = (("daily", "daily_micros"), ("weekly", "weekly_micros"), ("monthly", "monthly_micros"))


def _new_id(prefix: str) -> str:
    return prefix + "01" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(22))


class NoOrganisationError(PermissionDeniedError):
    """The person is in no group that names an organisation and there is no default one."""

    def __init__(self, email: str) -> None:
        super().__init__(
            f"{email or 'This person'} is in no group the gateway maps to an organization; ask your administrator "
            "to add one of your groups to [identity.groups] (or to set [identity] default_org)."
        )


class PersonDisabledError(AuthenticationError):
    """A disabled person signs in (401, as their keys are refused)."""

    def __init__(self, email: str) -> None:
        super().__init__(f"{email or 'This person'} is disabled on this gateway; ask your administrator.")


@dataclass(frozen=True, slots=True)
class GroupInfo:
    id: int
    public_id: str
    name: str
    org_id: int | None
    org: str  # the organisation's name ("" for none)
    models: tuple[str, ...]
    daily_micros: int | None
    weekly_micros: int | None
    monthly_micros: int | None
    source: str
    created_at: datetime
    updated_at: datetime
    rpm: int | None = None  # each member's requests per minute at most (all their keys together)
    tpm: int | None = None  # and tokens per minute

    def cap(self, period: str) -> int | None:
        return {"daily": self.daily_micros, "weekly": self.weekly_micros, "monthly": self.monthly_micros}[period]


@dataclass(frozen=True, slots=True)
class PersonInfo:
    id: int
    public_id: str
    subject: str
    email: str
    name: str
    idp_groups: tuple[str, ...]  # as the IdP last said
    group_ids: tuple[int, ...]  # the mapped ones
    org_id: int | None
    org: str
    models: tuple[str, ...]  # empty: every model
    created_at: datetime
    last_sign_in_at: datetime | None
    disabled_at: datetime | None
    rpm: int | None = None  # their own caps, all their keys together (set by an admin)
    tpm: int | None = None
    group_rpm: int | None = None  # the lowest of their mapped groups'
    group_tpm: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The object of ``users list --json``."""
        return {
            "id": self.public_id,
            "subject": self.subject,
            "email": self.email,
            "name": self.name,
            "groups": list(self.idp_groups),
            "org": self.org or None,
            "models": list(self.models),
            "created_at": iso(self.created_at),
            "last_sign_in_at": iso(self.last_sign_in_at),
            "disabled_at": iso(self.disabled_at),
            "rpm": self.rpm,
            "tpm": self.tpm,
            "group_rpm": self.group_rpm,
            "group_tpm": self.group_tpm,
        }


_GROUPS = select(idp_groups, orgs.c.name.label("org_name")).select_from(
    idp_groups.outerjoin(orgs, orgs.c.id == idp_groups.c.org_id)
)
_USERS = select(users, orgs.c.name.label("org_name")).select_from(users.outerjoin(orgs, orgs.c.id == users.c.org_id))


def _group(row: Any) -> GroupInfo:
    return GroupInfo(
        id=row.id,
        public_id=row.public_id,
        name=row.name,
        org_id=row.org_id,
        org=row.org_name or "",
        models=_split_patterns(row.models),
        daily_micros=row.daily_micros,
        weekly_micros=row.weekly_micros,
        monthly_micros=row.monthly_micros,
        rpm=row.rpm,
        tpm=row.tpm,
        source=row.source,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _person(row: Any) -> PersonInfo:
    return PersonInfo(
        id=row.id,
        public_id=row.public_id,
        subject=row.subject,
        email=row.email,
        name=row.name,
        idp_groups=tuple(g for g in row.idp_groups.split("\n") if g),
        group_ids=tuple(int(g) for g in row.group_ids.split(",") if g),
        org_id=row.org_id,
        org=row.org_name or "",
        models=_split_patterns(row.models),
        created_at=row.created_at,
        last_sign_in_at=row.last_sign_in_at,
        disabled_at=row.disabled_at,
        rpm=row.rpm,
        tpm=row.tpm,
        group_rpm=row.group_rpm,
        group_tpm=row.group_tpm,
    )


def groups_claim(claims: Mapping[str, Any], claim: str) -> tuple[str, ...]:
    """The groups ``claims[claim]`` lists (a list of strings, or one string), sorted."""
    value = claims.get(claim)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(sorted({str(v) for v in value if isinstance(v, str | int) and str(v)}))
    return ()


@dataclass(frozen=True, slots=True)
class _Mapping:
    group_ids: tuple[int, ...]
    org_id: int | None
    models: str
    caps: dict[str, int]  # period -> the smallest cap of the person's groups
    rpm: int | None  # the lowest of the person's groups' rate caps
    tpm: int | None

    def values(self) -> dict[str, Any]:
        """The ``users`` columns the mapping sets."""
        return {
            "group_ids": ",".join(map(str, self.group_ids)),
            "org_id": self.org_id,
            "models": self.models,
            "group_rpm": self.rpm,
            "group_tpm": self.tpm,
        }


def _lowest(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _map(groups: Sequence[GroupInfo], default_org_id: int | None) -> _Mapping:
    """What ``groups`` (the person's mapped groups, by name) give the person."""
    org_id = next((g.org_id for g in groups if g.org_id is not None), default_org_id)
    if not groups or any(not g.models for g in groups):
        models = ""
    else:
        models = ",".join(dict.fromkeys(p for g in groups for p in g.models))
    caps: dict[str, int] = {}
    for period, _ in _PERIOD_COLUMNS:
        values = [c for g in groups if (c := g.cap(period)) is not None]
        if values:
            caps[period] = min(values)
    rpm, tpm = _lowest(g.rpm for g in groups), _lowest(g.tpm for g in groups)
    return _Mapping(tuple(g.id for g in groups), org_id, models, caps, rpm, tpm)


class People:
    """The people and groups of the database behind ``engine``; thread-safe, one per process
    (``store.Store.people``). ``accounts`` mints the keys; ``spend`` sets the per-person caps."""

    def __init__(self, engine: Engine, accounts: Accounts, spend: SpendLimits, *, default_org: str = "") -> None:
        self._default_org = default_org  # [identity] default_org
        self._engine = engine
        self._writer = write_engine(engine)
        self._accounts = accounts
        self._spend = spend

    # ------------------------------------------------------------ groups

    def list_groups(self) -> list[GroupInfo]:
        with self._engine.connect() as conn:
            return [_group(r) for r in conn.execute(_GROUPS.order_by(idp_groups.c.name))]

    def get_group(self, ref: str) -> GroupInfo:
        """A group by its public id (``group_…``) or its name; ``StoreError`` if none."""
        with self._engine.connect() as conn:
            row = conn.execute(_GROUPS.where((idp_groups.c.public_id == ref) | (idp_groups.c.name == ref))).first()
        if row is None:
            raise StoreError(f"There is no group {ref!r}; `groups list` shows them.")
        return _group(row)

    def _org_id(self, conn: Any, name: str) -> int | None:
        if not name:
            return None
        found = conn.execute(select(orgs.c.id).where(orgs.c.name == name)).scalar()
        if found is None:
            raise StoreError(f"There is no organization named {name!r}.")
        return int(found)

    def put_group(
        self,
        name: str,
        *,
        org: str = "",
        models: Sequence[str] = (),
        daily_micros: int | None = None,
        weekly_micros: int | None = None,
        monthly_micros: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        source: str = SOURCE_API,
        now: datetime | None = None,
    ) -> tuple[GroupInfo | None, GroupInfo]:
        """Create the group ``name`` or replace what it gives; returns (before, after). Its
        members' mapping is brought up to date at once (``remap``)."""
        if not name or len(name) > 255:
            raise StoreError("name: 1 to 255 characters, as the IdP's groups claim writes it")
        for label, value in (("daily", daily_micros), ("weekly", weekly_micros), ("monthly", monthly_micros)):
            if value is not None and value < 0:
                raise StoreError(f"{label}: must not be negative")
        _check_positive("rpm", rpm)
        _check_positive("tpm", tpm)
        patterns = _clean_patterns(models)
        now = now or datetime.now(UTC)
        values = {
            "models": ",".join(patterns),
            "daily_micros": daily_micros,
            "weekly_micros": weekly_micros,
            "monthly_micros": monthly_micros,
            "rpm": rpm,
            "tpm": tpm,
            "source": source,
            "updated_at": now,
        }
        with self._writer.begin() as conn:
            values["org_id"] = self._org_id(conn, org)
            row = conn.execute(_GROUPS.where(idp_groups.c.name == name)).first()
            before = None if row is None else _group(row)
            if before is None:
                conn.execute(
                    insert(idp_groups).values(name=name, public_id=_new_id(GROUP_ID_PREFIX), created_at=now, **values)
                )
            else:
                conn.execute(update(idp_groups).where(idp_groups.c.id == before.id).values(**values))
            after = _group(conn.execute(_GROUPS.where(idp_groups.c.name == name)).one())
            self._remap(conn, after.name)
        return before, after

    def rename_group(self, ref: str, new_name: str, *, now: datetime | None = None) -> GroupInfo:
        """Give the group ``ref`` (public id or name) a new name: the IdP group it maps becomes
        ``new_name`` (its id, its settings and its spend limits stay). The people of the old name lose
        what it gave them and those of the new one gain it, at once. ``StoreError`` when the name is
        taken or not valid."""
        if not new_name or len(new_name) > 255:
            raise StoreError("name: 1 to 255 characters, as the IdP's groups claim writes it")
        group = self.get_group(ref)
        if new_name == group.name:
            return group
        try:
            with self._writer.begin() as conn:
                conn.execute(
                    update(idp_groups)
                    .where(idp_groups.c.id == group.id)
                    .values(name=new_name, updated_at=now or datetime.now(UTC))
                )
                self._remap(conn, group.name)
                self._remap(conn, new_name)
        except IntegrityError:
            raise StoreError(f"name: there is a group named {new_name!r} already") from None
        return self.get_group(group.public_id)

    def delete_group(self, ref: str) -> GroupInfo:
        """Forget a group (its members lose what it gave them at once); returns it as it was."""
        group = self.get_group(ref)
        with self._writer.begin() as conn:
            conn.execute(delete(idp_groups).where(idp_groups.c.id == group.id))
            self._remap(conn, group.name)
        return group

    def sync_config_groups(self, groups: Iterable[GroupSettings], *, now: datetime | None = None) -> None:
        """Make the groups of ``[identity.groups]`` what the file says: create or update each
        (``source`` "config"), and forget the file's groups no longer in it (those made through
        the admin API stay). An organisation a group names that doesn't exist yet is made, with
        a balance of 0."""
        groups = list(groups)
        named = {g.name for g in groups}
        for g in groups:
            if g.org and self._accounts.find_org(g.org) is None:
                # A cost centre the file names before anyone made it: made empty (balance 0, so
                # nothing is spent until an operator tops it up).
                with contextlib.suppress(StoreError):  # made meanwhile by another process
                    self._accounts.create_org(g.org, 0, now=now)
                log.warning("[identity.groups.%s]: created the organization %r (balance 0)", g.name, g.org)
            self.put_group(
                g.name,
                org=g.org,
                models=g.models,
                daily_micros=g.daily_micros,
                weekly_micros=g.weekly_micros,
                monthly_micros=g.monthly_micros,
                rpm=g.rpm,
                tpm=g.tpm,
                source=SOURCE_CONFIG,
                now=now,
            )
        for group in self.list_groups():
            if group.source == SOURCE_CONFIG and group.name not in named:
                self.delete_group(group.public_id)

    # ------------------------------------------------------------ people

    def _mapping(self, conn: Any, idp_names: Sequence[str]) -> _Mapping:
        rows = conn.execute(_GROUPS.where(idp_groups.c.name.in_(list(idp_names))).order_by(idp_groups.c.name)).all()
        default_id = None
        if self._default_org:
            found = conn.execute(select(orgs.c.id).where(orgs.c.name == self._default_org)).scalar()
            default_id = None if found is None else int(found)
        return _map([_group(r) for r in rows], default_id)

    def _remap(self, conn: Any, group_name: str) -> None:
        """Bring up to date the mapping of every person whose IdP groups include ``group_name``."""
        for row in conn.execute(select(users).where(users.c.idp_groups.like(f"%{group_name}%"))).all():
            names = [g for g in row.idp_groups.split("\n") if g]
            if group_name not in names:
                continue
            mapping = self._mapping(conn, names)
            conn.execute(update(users).where(users.c.id == row.id).values(**mapping.values()))

    def sign_in(
        self, claims: Mapping[str, Any], identity: IdentitySettings, *, now: datetime | None = None
    ) -> PersonInfo:
        """The person of these (checked) claims, created at their first sign-in and brought up
        to date (email, name, groups and what they give) at each. ``PersonDisabledError`` for a
        disabled person; ``NoOrganisationError`` when nothing pays for them."""
        subject = str(claims.get("sub") or "")
        if not subject:
            raise StoreError("the IdP's claims have no subject (sub)")
        now = now or datetime.now(UTC)
        email = str(claims.get("email") or claims.get("preferred_username") or claims.get("upn") or "")[:320]
        name = str(claims.get("name") or email or subject)[:255]
        names = groups_claim(claims, identity.groups_claim)
        with self._writer.begin() as conn:
            mapping = self._mapping(conn, names)
            values = {
                "email": email,
                "name": name,
                "idp_groups": "\n".join(names),
                **mapping.values(),
                "last_sign_in_at": now,
            }
            row = conn.execute(select(users.c.id, users.c.disabled_at).where(users.c.subject == subject)).first()
            if row is None:
                try:
                    with conn.begin_nested():
                        new_id = conn.execute(
                            insert(users)
                            .values(public_id=_new_id(USER_ID_PREFIX), subject=subject, created_at=now, **values)
                            .returning(users.c.id)
                        ).scalar_one()
                        # The caps of their groups, made with them: a worker that reads the person
                        # reads their caps (store/spend.py ``holds``: ``newest_user``).
                        for period, amount in mapping.caps.items():
                            insert_limit(conn, SCOPE_USER, new_id, period, amount, None, now)
                except IntegrityError:  # signed in twice at once: the other made the row
                    conn.execute(update(users).where(users.c.subject == subject).values(**values))
            else:
                conn.execute(update(users).where(users.c.id == row.id).values(**values))
            person = _person(conn.execute(_USERS.where(users.c.subject == subject)).one())
        if person.disabled_at is not None:
            raise PersonDisabledError(person.email)
        if person.org_id is None:
            raise NoOrganisationError(person.email)
        if row is None:
            self._spend.changed()  # this process's snapshot knows them at once
        else:
            self._default_caps(person, mapping.caps, now)
        return person

    def _default_caps(self, person: PersonInfo, caps: Mapping[str, int], now: datetime) -> None:
        """A cap of their groups' for a period the person has none of yet (a group's cap set
        after their first sign-in)."""
        if not caps:
            return
        with self._engine.connect() as conn:
            have = set(
                conn.execute(
                    select(spend_limits.c.period).where(
                        spend_limits.c.scope_type == SCOPE_USER, spend_limits.c.scope_id == person.id
                    )
                ).scalars()
            )
        for period, amount in caps.items():
            if period not in have:
                with contextlib.suppress(StoreError):  # made meanwhile by another sign-in
                    self._spend.set_limit(SCOPE_USER, person.id, period, amount, now=now)

    def get(self, ref: str) -> PersonInfo:
        """A person by public id (``user_…``), email or subject; ``StoreError`` if none."""
        with self._engine.connect() as conn:
            row = conn.execute(
                _USERS.where((users.c.public_id == ref) | (users.c.email == ref) | (users.c.subject == ref))
            ).first()
        if row is None:
            raise StoreError(f"There is no user {ref!r}; `users list` shows them (a person exists once signed in).")
        return _person(row)

    def get_by_id(self, user_id: int) -> PersonInfo | None:
        with self._engine.connect() as conn:
            row = conn.execute(_USERS.where(users.c.id == user_id)).first()
        return None if row is None else _person(row)

    def list_people(self, *, group: str | None = None, email: str | None = None) -> list[PersonInfo]:
        """Every person (of the IdP group ``group``, or with ``email``), oldest first."""
        query = _USERS.order_by(users.c.id)
        if email:
            query = query.where(users.c.email == email)
        with self._engine.connect() as conn:
            found = [_person(r) for r in conn.execute(query)]
        return [p for p in found if group is None or group in p.idp_groups]

    def set_disabled(
        self, ref: str, disabled: bool, *, revoke_keys: bool = False, now: datetime | None = None
    ) -> tuple[PersonInfo, PersonInfo]:
        """Disable (refused at their next request, everywhere; their console sessions ended) or
        enable a person; with ``revoke_keys``, revoke every live key of theirs too. Returns
        (before, after)."""
        before = self.get(ref)
        now = now or datetime.now(UTC)
        with self._writer.begin() as conn:
            conn.execute(update(users).where(users.c.id == before.id).values(disabled_at=now if disabled else None))
            if disabled:  # and out of the console at their next page
                conn.execute(
                    update(console_sessions)
                    .where(console_sessions.c.subject == before.subject, console_sessions.c.ended_at.is_(None))
                    .values(ended_at=now)
                )
            if revoke_keys:
                conn.execute(
                    update(api_keys)
                    .where(api_keys.c.user_id == before.id, api_keys.c.revoked_at.is_(None))
                    .values(revoked_at=now)
                )
        return before, self.get(before.public_id)

    def set_rate_limits(self, ref: str, *, rpm: int | None, tpm: int | None) -> tuple[PersonInfo, PersonInfo]:
        """The person's own requests and tokens per minute, all their keys together (None: no
        cap of their own; their groups' and organisation's still apply). Returns (before,
        after); applies at their next request."""
        _check_positive("rpm", rpm)
        _check_positive("tpm", tpm)
        before = self.get(ref)
        with self._writer.begin() as conn:
            conn.execute(update(users).where(users.c.id == before.id).values(rpm=rpm, tpm=tpm))
        return before, self.get(before.public_id)

    def revoke_keys(self, ref: str, *, now: datetime | None = None) -> int:
        """Revoke every live key of the person at once; returns how many."""
        person = self.get(ref)
        with self._writer.begin() as conn:
            return int(
                conn.execute(
                    update(api_keys)
                    .where(api_keys.c.user_id == person.id, api_keys.c.revoked_at.is_(None))
                    .values(revoked_at=now or datetime.now(UTC))
                ).rowcount
            )

    def keys(self, person: PersonInfo) -> list[KeyInfo]:
        """The person's keys, oldest first."""
        return [k for k in self._accounts.list_keys() if k.user_id == person.id]

    # ------------------------------------------------------------ their keys

    def _org_name(self, person: PersonInfo) -> str:
        if person.org_id is None or not person.org:
            raise NoOrganisationError(person.email)
        return person.org

    def mint_key(
        self, person: PersonInfo, *, hours: float, client: str = "", now: datetime | None = None
    ) -> tuple[KeyInfo, str]:
        """A key of the person's organisation, bound to them, expiring in ``hours``: its info and
        its secret (shown to the person's client once)."""
        now = now or datetime.now(UTC)
        label = f"sign-in {client}".strip() if client else "sign-in"
        return self._accounts.create_key(
            self._org_name(person),
            name=f"{label} ({person.email or person.subject})"[:128],
            expires_at=now + timedelta(hours=hours),
            now=now,
            created_by=f"user:{person.public_id}",
            user_id=person.id,
        )

    def bearer_key(self, person: PersonInfo, *, now: datetime | None = None) -> int:
        """The row id of the person's IdP-token key (made at their first JWT bearer request, in
        their organisation): what requests made with their JWTs are billed and limited as.
        A person whose organisation changed gets a new one there (the old one is revoked)."""
        org_name = self._org_name(person)
        with self._engine.connect() as conn:
            row = conn.execute(
                select(api_keys.c.id, api_keys.c.org_id).where(
                    api_keys.c.user_id == person.id,
                    api_keys.c.name == BEARER_KEY_NAME,
                    api_keys.c.revoked_at.is_(None),
                    api_keys.c.expires_at.is_(None),
                )
            ).first()
        if row is not None and row.org_id == person.org_id:
            return int(row.id)
        now = now or datetime.now(UTC)
        if row is not None:
            self._accounts.revoke_key(self._public_id_of(row.id), now=now)
        self._accounts.create_key(
            org_name, name=BEARER_KEY_NAME, now=now, created_by=f"user:{person.public_id}", user_id=person.id
        )
        # Two workers (or nodes) may have seen the person's first token at once and made one
        # each: every one of them keeps the oldest and revokes the others.
        with self._engine.connect() as conn:
            live = conn.execute(
                select(api_keys.c.id, api_keys.c.public_id)
                .where(
                    api_keys.c.user_id == person.id,
                    api_keys.c.name == BEARER_KEY_NAME,
                    api_keys.c.revoked_at.is_(None),
                    api_keys.c.expires_at.is_(None),
                    api_keys.c.org_id == person.org_id,
                )
                .order_by(api_keys.c.id)
            ).all()
        for extra in live[1:]:
            self._accounts.revoke_key(extra.public_id, now=now)
        return int(live[0].id)

    def _public_id_of(self, key_id: int) -> str:
        with self._engine.connect() as conn:
            return str(conn.execute(select(api_keys.c.public_id).where(api_keys.c.id == key_id)).scalar_one())
