"""Spend limits by period: a cap on what the gateway, an organisation or a key may spend per
calendar day, week or month, enforced with the balance at reserve time.

A limit is one row of ``spend_limits`` per (scope, period); what each period spent and what
requests in flight hold on it is one row of ``spend_counters`` per (limit, period start). The
hot path (store/hotpath.py ``reserve_tx``) holds a request's worst case on the counter of every
limit that applies to it — the gateway's, its organisation's and its key's — in the same
transaction as the balance, with a conditional upsert: spent + held + the request must stay
within the cap, so concurrent requests on any number of workers and nodes never overshoot.
The reservation row remembers which counters it held on (``reservations.spend_holds``), and
its settle moves the real cost from held to spent in those periods, even when a new period
has begun meanwhile; the sweep and a dead worker's release give the holds back.

Periods are calendar periods in one time zone (``[spend] time_zone``, UTC by default): a day
starts at local midnight, a week on Monday (ISO 8601), a month on its first day. A period's
bounds are stored with its counter, so reading the spend never needs the zone.

Which limits apply is read from a per-process snapshot of every limit, read when the process
opens its store and reloaded at most once a second (``REFRESH_S``): a request whose gateway,
organisation and key have no limit costs no statement (but, once a second, one request of the
process the reload's SELECT), and a change made anywhere applies on every worker within a
second (at once in the process that made it).
"""

from __future__ import annotations

import logging
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any

from sqlalchemy import Engine, and_, delete, func, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from ezat_compat.errors import InsufficientQuotaError
from ezat_compat.periods import MICROS_PER_CENT, PERIOD_NOUNS, PERIODS, period_bounds, rfc3339
from ezat_compat.pricing import micros_to_usd
from ezat_compat.store.accounts import StoreError
from ezat_compat.store.db import write_engine
from ezat_compat.store.hotpath import NO_CAP, DatabaseUnavailableError, SpendHold, is_unavailable
from ezat_compat.store.tables import (
    api_keys,
    from_epoch_micros,
    idp_groups,
    ledger,
    orgs,
    spend_alerts,
    spend_counters,
    spend_limits,
    to_epoch_micros,
    users,
)

log = logging.getLogger("ezat_compat")

SCOPE_GATEWAY = "gateway"  # Anthropic's ``organization`` scope: every request through the gateway
SCOPE_ORG = "org"  # an organisation (Anthropic's ``workspace``)
SCOPE_KEY = "key"  # an API key (an extension: ``{"type": "api_key", ...}``)
SCOPE_USER = "user"  # a person (store/people.py): every request of their keys
SCOPE_GROUP = "group"  # an IdP group (Anthropic's ``rbac_group``): its members' requests together
SCOPE_TYPES = (SCOPE_GATEWAY, SCOPE_ORG, SCOPE_KEY, SCOPE_USER, SCOPE_GROUP)
DEFAULT_THRESHOLDS = (80, 100)
REFRESH_S = 1.0  # the snapshot of limits is at most this old: a change applies on every worker within it
_ID_ALPHABET = string.ascii_letters + string.digits


# ---------------------------------------------------------------- thresholds


def parse_thresholds(text: str | None) -> tuple[int, ...] | None:
    """``"80,100"`` -> (80, 100); None or "" -> None."""
    if not text:
        return None
    return tuple(sorted({int(p) for p in text.split(",") if p.strip()}))


def check_thresholds(values: Iterable[int]) -> tuple[int, ...]:
    """Percentages 1–1000, sorted without repeats; ``StoreError`` otherwise."""
    found = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
            raise StoreError(f"thresholds: {value!r} is not a whole percentage from 1 to 1000")
        found.add(value)
    return tuple(sorted(found))


# ---------------------------------------------------------------- the records


@dataclass(frozen=True, slots=True)
class SpendLimitInfo:
    """A spend limit as stored, with its scope's name: "" for the gateway, the organisation's
    name, or the key's public id (``key_…``). ``org_id`` and ``workspace_id`` are the scope's
    organisation's (0 and "" for the gateway). ``amount_micros`` None: explicitly no limit (the
    spend is still counted)."""

    id: int
    public_id: str
    scope_type: str
    scope_id: int
    scope_name: str
    org_id: int
    workspace_id: str
    period: str
    amount_micros: int | None
    thresholds: tuple[int, ...] | None
    created_at: datetime
    updated_at: datetime
    scope_public_id: str = ""  # a person's "user_…" or a group's "group_…" (else "")

    @property
    def scope_label(self) -> str:
        """``gateway``, ``org:NAME``, ``key:KEY_ID``, ``user:EMAIL`` or ``group:NAME`` (the CLI's ``--scope``)."""
        return self.scope_type if self.scope_type == SCOPE_GATEWAY else f"{self.scope_type}:{self.scope_name}"

    def describe(self) -> str:
        """ "the monthly spend limit of organization 'acme' ($200.000000 a month, spl_…)"."""
        whose = {
            SCOPE_GATEWAY: "the gateway",
            SCOPE_ORG: f"organization '{self.scope_name}'",
            SCOPE_KEY: f"key {self.scope_name}",
            SCOPE_USER: f"user {self.scope_name}",
            SCOPE_GROUP: f"group '{self.scope_name}'",
        }.get(self.scope_type, f"{self.scope_type} {self.scope_name}")
        amount = "no limit" if self.amount_micros is None else f"${micros_to_usd(self.amount_micros)}"
        return f"the {self.period} spend limit of {whose} ({amount} a {PERIOD_NOUNS[self.period]}, {self.public_id})"


@dataclass(frozen=True, slots=True)
class PeriodSpend:
    """A limit's current period: its bounds (UTC), what it spent and what is held on it."""

    start: datetime
    end: datetime
    spent_micros: int = 0
    reserved_micros: int = 0
    exhausted: bool = False


@dataclass(frozen=True, slots=True)
class Member:
    """A key that limits may apply to (``effective``): its row id and public id (``key_…``), its
    organisation's row id and workspace id."""

    key_id: int
    public_id: str
    org_id: int
    workspace_id: str


@dataclass(frozen=True, slots=True)
class _Cap:
    limit_id: int
    period: str
    cap: int  # NO_CAP for "no limit"


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Every limit, by scope: what ``holds`` reads."""

    gateway: tuple[_Cap, ...] = ()
    by_org: dict[int, tuple[_Cap, ...]] = field(default_factory=dict)
    by_key: dict[int, tuple[_Cap, ...]] = field(default_factory=dict)
    by_user: dict[int, tuple[_Cap, ...]] = field(default_factory=dict)
    by_group: dict[int, tuple[_Cap, ...]] = field(default_factory=dict)
    newest_user: int = 0  # the highest ``users.id`` when it was read: a newer person's caps aren't in it

    @property
    def empty(self) -> bool:
        return not (self.gateway or self.by_org or self.by_key or self.by_user or self.by_group)


def _new_public_id() -> str:
    return "spl_01" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(22))


_KEY_ORG = orgs.alias("key_org")
_USER_ORG = orgs.alias("user_org")
_GROUP_ORG = orgs.alias("group_org")
# A person's scope is named by their email, a group's by its name; the organisation of either is
# the one that pays for them (none: 0, "").
_INFO = select(
    spend_limits,
    func.coalesce(orgs.c.name, api_keys.c.public_id, users.c.email, idp_groups.c.name, "").label("scope_name"),
    func.coalesce(orgs.c.id, _KEY_ORG.c.id, _USER_ORG.c.id, _GROUP_ORG.c.id, 0).label("scope_org"),
    func.coalesce(orgs.c.public_id, _KEY_ORG.c.public_id, _USER_ORG.c.public_id, _GROUP_ORG.c.public_id, "").label(
        "scope_workspace"
    ),
    func.coalesce(users.c.public_id, idp_groups.c.public_id, "").label("scope_public_id"),
).select_from(
    spend_limits.outerjoin(orgs, and_(spend_limits.c.scope_type == SCOPE_ORG, orgs.c.id == spend_limits.c.scope_id))
    .outerjoin(api_keys, and_(spend_limits.c.scope_type == SCOPE_KEY, api_keys.c.id == spend_limits.c.scope_id))
    .outerjoin(_KEY_ORG, _KEY_ORG.c.id == api_keys.c.org_id)
    .outerjoin(users, and_(spend_limits.c.scope_type == SCOPE_USER, users.c.id == spend_limits.c.scope_id))
    .outerjoin(_USER_ORG, _USER_ORG.c.id == users.c.org_id)
    .outerjoin(idp_groups, and_(spend_limits.c.scope_type == SCOPE_GROUP, idp_groups.c.id == spend_limits.c.scope_id))
    .outerjoin(_GROUP_ORG, _GROUP_ORG.c.id == idp_groups.c.org_id)
)


def _info(row: Any) -> SpendLimitInfo:
    return SpendLimitInfo(
        id=row.id,
        public_id=row.public_id,
        scope_type=row.scope_type,
        scope_id=row.scope_id,
        scope_name=row.scope_name or "",
        org_id=int(row.scope_org or 0),
        workspace_id=row.scope_workspace or "",
        scope_public_id=row.scope_public_id or "",
        period=row.period,
        amount_micros=row.amount_micros,
        thresholds=parse_thresholds(row.thresholds),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def insert_limit(
    conn: Any,
    scope_type: str,
    scope_id: int,
    period: str,
    amount_micros: int | None,
    thresholds: str | None,
    now: datetime,
) -> None:
    """Insert a new limit row on ``conn`` (in the caller's transaction: a new person's caps are
    made with the person, so no snapshot ever holds the one without the other)."""
    conn.execute(
        insert(spend_limits).values(
            public_id=_new_public_id(),
            scope_type=scope_type,
            scope_id=scope_id,
            period=period,
            amount_micros=amount_micros,
            thresholds=thresholds,
            created_at=now,
            updated_at=now,
        )
    )


class SpendLimits:
    """The spend limits of the database behind ``engine`` (module docstring). Thread-safe; one
    per process (``store.Store.spend``), shared by the ledger (``holds``, ``refusal``), the
    admin API and CLI (the rest) and the alerts loop (``alerting``)."""

    def __init__(self, engine: Engine, *, zone: tzinfo = UTC, clock: Callable[[], float] = time.monotonic) -> None:
        self._engine = engine
        self._writer = write_engine(engine)
        self.zone = zone
        self._clock = clock
        self._snapshot: _Snapshot | None = None
        self._next_refresh = 0.0
        self._force_retry_at = 0.0  # a failed read for a new person: the next one not before this
        self._refreshing = threading.Lock()
        self._bounds: dict[str, tuple[int, int]] = {}  # period -> its current (start, end), epoch micros
        self._prime()

    def _prime(self) -> None:
        """Read the snapshot now, so that the first request doesn't; a database that can't
        answer yet (not migrated, down) leaves it to the first request."""
        try:
            self._snapshot = self._load()
        except Exception as exc:
            log.debug("spend limits not read at start (read on first use): %s", exc)
            return
        self._next_refresh = self._clock() + REFRESH_S

    # ------------------------------------------------------------ the hot path

    def holds(
        self, org_id: int, key_id: int, now: datetime, user_id: int | None = None, group_ids: Sequence[int] = ()
    ) -> tuple[SpendHold, ...]:
        """The counters a request of ``key_id`` (of ``org_id``; of person ``user_id`` in the
        groups ``group_ids``, for a person's key) must hold its worst case on at ``now``: one per
        limit of the gateway, the organisation, the key, the person and each of their groups, in
        lock order. No statement unless the snapshot is due (at most once a second)."""
        snapshot = self._snapshot
        # A person newer than the snapshot (signed in a moment ago, with the caps their groups give
        # them): read it again now, so their first requests are capped too (after a failed read,
        # not before the next refresh is due).
        newer = user_id is not None and (snapshot is None or user_id > snapshot.newest_user)
        due = self._clock() >= self._next_refresh
        if snapshot is None or due or (newer and self._clock() >= self._force_retry_at):
            snapshot = self._current(force_after=user_id if newer else None)
        if snapshot.empty:
            return ()
        caps = snapshot.gateway + snapshot.by_org.get(org_id, ()) + snapshot.by_key.get(key_id, ())
        if user_id is not None:
            caps += snapshot.by_user.get(user_id, ())
            for group_id in group_ids:
                caps += snapshot.by_group.get(group_id, ())
        if not caps:
            return ()
        at = to_epoch_micros(now)
        holds = []
        for cap in caps:
            start, end = self._period(cap.period, at, now)
            holds.append(SpendHold(cap.limit_id, start, end, cap.cap))
        holds.sort(key=lambda h: (h.limit_id, h.period_start))
        return tuple(holds)

    def _period(self, period: str, at: int, now: datetime) -> tuple[int, int]:
        known = self._bounds.get(period)
        if known is not None and known[0] <= at < known[1]:
            return known
        start, end = period_bounds(period, now, self.zone)
        bounds = self._bounds[period] = (to_epoch_micros(start), to_epoch_micros(end))
        return bounds

    def _current(self, *, force_after: int | None = None) -> _Snapshot:
        """The snapshot, reloaded if due. One greenlet reloads; the others keep the one they
        have meanwhile (a second old at most), or wait for the first. ``force_after``: a
        person's id the snapshot must know (newest_user at least): reloaded now, waiting for a
        reload under way."""
        if self._snapshot is not None and force_after is None:
            if not self._refreshing.acquire(blocking=False):
                return self._snapshot
        else:
            self._refreshing.acquire()
        try:
            stale = force_after is not None and (self._snapshot is None or self._snapshot.newest_user < force_after)
            if self._snapshot is None or stale or self._clock() >= self._next_refresh:
                try:
                    self._snapshot = self._load()
                except Exception as exc:
                    if self._snapshot is None:  # nothing to go on: the request can't be admitted
                        if is_unavailable(exc):
                            raise DatabaseUnavailableError() from exc
                        raise
                    log.warning("could not reload the spend limits (the last ones read still apply): %s", exc)
                    self._force_retry_at = self._clock() + REFRESH_S
                self._next_refresh = self._clock() + REFRESH_S
            return self._snapshot
        finally:
            self._refreshing.release()

    def _load(self) -> _Snapshot:
        gateway: list[_Cap] = []
        by_org: dict[int, list[_Cap]] = {}
        by_key: dict[int, list[_Cap]] = {}
        by_user: dict[int, list[_Cap]] = {}
        by_group: dict[int, list[_Cap]] = {}
        query = select(
            spend_limits.c.id,
            spend_limits.c.scope_type,
            spend_limits.c.scope_id,
            spend_limits.c.period,
            spend_limits.c.amount_micros,
        )
        with self._engine.connect() as conn:
            newest_user = int(conn.execute(select(func.coalesce(func.max(users.c.id), 0))).scalar() or 0)
            rows = conn.execute(query).all()
        for limit_id, scope_type, scope_id, period, amount in rows:
            cap = _Cap(limit_id, period, NO_CAP if amount is None else amount)
            if scope_type == SCOPE_GATEWAY:
                gateway.append(cap)
            elif scope_type == SCOPE_ORG:
                by_org.setdefault(scope_id, []).append(cap)
            elif scope_type == SCOPE_KEY:
                by_key.setdefault(scope_id, []).append(cap)
            elif scope_type == SCOPE_USER:
                by_user.setdefault(scope_id, []).append(cap)
            elif scope_type == SCOPE_GROUP:
                by_group.setdefault(scope_id, []).append(cap)
        return _Snapshot(
            tuple(gateway),
            {k: tuple(v) for k, v in by_org.items()},
            {k: tuple(v) for k, v in by_key.items()},
            {k: tuple(v) for k, v in by_user.items()},
            {k: tuple(v) for k, v in by_group.items()},
            newest_user,
        )

    def changed(self) -> None:
        """Reload the snapshot now (this process made a change: it applies to its next request)."""
        with self._refreshing:
            try:
                self._snapshot = self._load()
            except Exception as exc:
                log.warning("could not reload the spend limits (reloaded on the next request): %s", exc)
                self._next_refresh = 0.0
                return
            self._next_refresh = self._clock() + REFRESH_S

    def refusal(self, hold: SpendHold, amount_micros: int, now: datetime) -> InsufficientQuotaError:
        """The 402 of a request whose worst case ``amount_micros`` didn't fit in ``hold``'s
        period: it names the limit (scope, period, amount, id), what is left and when the period
        resets. When what the period spent leaves no room for a request that an empty period would
        take (not only what others hold), the period is marked exhausted: the 100 % alert
        (ezat_compat/alerts.py)."""
        limit = self.get_by_id(hold.limit_id)
        period = self.period_spend(hold.limit_id, hold.period_start, hold.period_end)
        if limit is None:  # deleted since the snapshot: the next request won't see it
            return InsufficientQuotaError("A spend limit that was just removed refused this request; retry it.")
        cap = limit.amount_micros if limit.amount_micros is not None else hold.cap
        if amount_micros <= cap < period.spent_micros + amount_micros and not period.exhausted:
            self._mark_exhausted(hold, now)
        left = max(cap - period.spent_micros - period.reserved_micros, 0)
        return InsufficientQuotaError(
            f"This request may cost up to ${micros_to_usd(amount_micros)} (its input plus max_tokens of output), "
            f"but {limit.describe()} has ${micros_to_usd(left)} left this {PERIOD_NOUNS[limit.period]} "
            f"(${micros_to_usd(period.spent_micros)} spent, ${micros_to_usd(period.reserved_micros)} held by "
            f"requests in flight); it resets at {rfc3339(period.end, self.zone)}. Ask your administrator to raise "
            "the limit (ezat-compat spend-limits set), or lower max_tokens."
        )

    def _mark_exhausted(self, hold: SpendHold, now: datetime) -> None:
        values = {
            "limit_id": hold.limit_id,
            "period_start": from_epoch_micros(hold.period_start),
            "period_end": from_epoch_micros(hold.period_end),
        }
        try:
            with self._writer.begin() as conn:
                changed = conn.execute(
                    update(spend_counters)
                    .where(
                        spend_counters.c.limit_id == hold.limit_id,
                        spend_counters.c.period_start == values["period_start"],
                        spend_counters.c.exhausted_at.is_(None),
                    )
                    .values(exhausted_at=now)
                ).rowcount
                if not changed:
                    exists = conn.execute(
                        select(spend_counters.c.limit_id).where(
                            spend_counters.c.limit_id == hold.limit_id,
                            spend_counters.c.period_start == values["period_start"],
                        )
                    ).first()
                    if exists is None:
                        conn.execute(
                            insert(spend_counters).values(**values, spent_micros=0, reserved_micros=0, exhausted_at=now)
                        )
        except IntegrityError:
            pass  # another worker made the row meanwhile: marked at its next refusal
        except Exception as exc:  # a refusal must be told even when the mark can't be written
            log.warning("could not mark spend limit %s exhausted: %s", hold.limit_id, exc)

    def check(
        self,
        org_id: int,
        key_id: int,
        amount_micros: int,
        now: datetime,
        user_id: int | None = None,
        group_ids: Sequence[int] = (),
    ) -> None:
        """Refuse (402, ``refusal``) when a limit of the gateway, ``org_id``, ``key_id`` or
        (a person's key) the person or one of their groups has no room for ``amount_micros``
        now; hold nothing (``Ledger.check_funds``)."""
        for hold in self.holds(org_id, key_id, now, user_id, group_ids):
            if hold.cap == NO_CAP:
                continue
            period = self.period_spend(hold.limit_id, hold.period_start, hold.period_end)
            if period.spent_micros + period.reserved_micros + amount_micros > hold.cap:
                raise self.refusal(hold, amount_micros, now)

    # ------------------------------------------------------------ reading

    def period_spend(self, limit_id: int, start: int, end: int) -> PeriodSpend:
        """The counter of ``limit_id``'s period [``start``, ``end``) (epoch micros); zeros when
        nothing was held on it yet."""
        query = select(
            spend_counters.c.spent_micros, spend_counters.c.reserved_micros, spend_counters.c.exhausted_at
        ).where(spend_counters.c.limit_id == limit_id, spend_counters.c.period_start == from_epoch_micros(start))
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        bounds = (from_epoch_micros(start), from_epoch_micros(end))
        if row is None:
            return PeriodSpend(*bounds)
        return PeriodSpend(*bounds, row.spent_micros, row.reserved_micros, row.exhausted_at is not None)

    def current(self, limits: Sequence[SpendLimitInfo], now: datetime) -> dict[int, PeriodSpend]:
        """Each limit's current period (by ``SpendLimitInfo.id``), read in one statement."""
        bounds = {limit.id: period_bounds(limit.period, now, self.zone) for limit in limits}
        found: dict[int, PeriodSpend] = {i: PeriodSpend(*b) for i, b in bounds.items()}
        if not bounds:
            return found
        keys = [(i, b[0]) for i, b in bounds.items()]
        query = select(spend_counters).where(tuple_(spend_counters.c.limit_id, spend_counters.c.period_start).in_(keys))
        with self._engine.connect() as conn:
            for row in conn.execute(query):
                start, end = bounds[row.limit_id]
                found[row.limit_id] = PeriodSpend(
                    start, end, row.spent_micros, row.reserved_micros, row.exhausted_at is not None
                )
        return found

    def get(self, public_id: str) -> SpendLimitInfo:
        """The limit ``spl_…``; ``StoreError`` if there is none."""
        with self._engine.connect() as conn:
            row = conn.execute(_INFO.where(spend_limits.c.public_id == public_id)).first()
        if row is None:
            raise StoreError(f"There is no spend limit {public_id!r}; `spend-limits list` shows the ids (spl_…).")
        return _info(row)

    def get_by_id(self, limit_id: int) -> SpendLimitInfo | None:
        with self._engine.connect() as conn:
            row = conn.execute(_INFO.where(spend_limits.c.id == limit_id)).first()
        return None if row is None else _info(row)

    def list_limits(self, scope_types: Sequence[str] | None = None) -> list[SpendLimitInfo]:
        """Every limit (of ``scope_types`` when given), in scope order (gateway, orgs, keys),
        then by scope, then daily, weekly, monthly."""
        query = _INFO
        if scope_types:
            query = query.where(spend_limits.c.scope_type.in_(list(scope_types)))
        with self._engine.connect() as conn:
            found = [_info(row) for row in conn.execute(query)]
        return sorted(
            found, key=lambda s: (SCOPE_TYPES.index(s.scope_type), s.scope_name, PERIODS.index(s.period), s.id)
        )

    def applying(self, org_id: int, key_id: int) -> list[SpendLimitInfo]:
        """The limits that apply to a request of key ``key_id`` of ``org_id`` (read now, not
        from the snapshot)."""
        query = _INFO.where(
            (spend_limits.c.scope_type == SCOPE_GATEWAY)
            | and_(spend_limits.c.scope_type == SCOPE_ORG, spend_limits.c.scope_id == org_id)
            | and_(spend_limits.c.scope_type == SCOPE_KEY, spend_limits.c.scope_id == key_id)
        )
        with self._engine.connect() as conn:
            return [_info(row) for row in conn.execute(query)]

    def members(self, public_ids: Sequence[str] | None = None) -> list[Member]:
        """The keys that aren't revoked (those of ``public_ids`` when given), by public id."""
        query = (
            select(api_keys.c.id, api_keys.c.public_id, api_keys.c.org_id, orgs.c.public_id.label("workspace_id"))
            .select_from(api_keys.join(orgs, orgs.c.id == api_keys.c.org_id))
            .where(api_keys.c.revoked_at.is_(None))
            .order_by(api_keys.c.public_id)
        )
        if public_ids is not None:
            query = query.where(api_keys.c.public_id.in_(list(public_ids)))
        with self._engine.connect() as conn:
            return [Member(r.id, r.public_id, r.org_id, r.workspace_id or "") for r in conn.execute(query)]

    def key_spend(self, key_id: int, start: datetime, end: datetime) -> int:
        """What key ``key_id`` spent from ``start`` to ``end`` (settled requests, the ledger)."""
        query = select(func.coalesce(func.sum(ledger.c.cost_micros), 0)).where(
            ledger.c.key_id == key_id, ledger.c.created_at >= start, ledger.c.created_at < end
        )
        with self._engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    # ------------------------------------------------------------ changes

    def scope_id(self, scope_type: str, name: str = "") -> int:
        """The row id of a scope named as the CLI names it: the gateway (0), an organisation by
        name, a key by public id (``key_…``); ``StoreError`` naming an unknown one."""
        if scope_type == SCOPE_GATEWAY:
            return 0
        with self._engine.connect() as conn:
            if scope_type == SCOPE_ORG:
                found = conn.execute(select(orgs.c.id).where(orgs.c.name == name)).scalar()
                if found is None:
                    raise StoreError(f"There is no organization named {name!r}.")
                return int(found)
            if scope_type == SCOPE_KEY:
                found = conn.execute(select(api_keys.c.id).where(api_keys.c.public_id == name)).scalar()
                if found is None:
                    raise StoreError(f"There is no key {name!r}; `keys list` shows the ids (key_…).")
                return int(found)
            if scope_type == SCOPE_USER:
                found = conn.execute(
                    select(users.c.id).where(
                        (users.c.public_id == name) | (users.c.email == name) | (users.c.subject == name)
                    )
                ).scalar()
                if found is None:
                    raise StoreError(f"There is no user {name!r}; `users list` shows who has signed in.")
                return int(found)
            if scope_type == SCOPE_GROUP:
                found = conn.execute(
                    select(idp_groups.c.id).where((idp_groups.c.name == name) | (idp_groups.c.public_id == name))
                ).scalar()
                if found is None:
                    raise StoreError(f"There is no group {name!r}; `groups list` shows them.")
                return int(found)
        raise StoreError(
            f"scope must be one of gateway, org:NAME, key:KEY_ID, user:EMAIL, group:NAME; got {scope_type!r}"
        )

    def set_limit(
        self,
        scope_type: str,
        scope_id: int,
        period: str,
        amount_micros: int | None,
        *,
        thresholds: Sequence[int] | None = None,
        now: datetime | None = None,
    ) -> tuple[SpendLimitInfo | None, SpendLimitInfo]:
        """Set the limit of (scope, period) to ``amount_micros`` (None: explicitly no limit),
        creating it or overwriting it in place (its id, its periods' spend and alerts stay).
        Returns (before, after); before is None for a new limit. ``StoreError`` for a bad value.
        Applies in this process at once, on the others within ``REFRESH_S``."""
        if scope_type not in SCOPE_TYPES:
            raise StoreError(f"scope must be one of {', '.join(SCOPE_TYPES)}; got {scope_type!r}")
        if period not in PERIODS:
            raise StoreError(f"period must be one of {', '.join(PERIODS)}; got {period!r}")
        if amount_micros is not None:
            if isinstance(amount_micros, bool) or not isinstance(amount_micros, int) or amount_micros < 0:
                raise StoreError(f"amount must be a non-negative number of micro-USD, got {amount_micros!r}")
            if amount_micros % MICROS_PER_CENT:
                raise StoreError("a spend limit is a whole number of cents (e.g. 200 or 199.99 USD)")
            if amount_micros >= NO_CAP:
                raise StoreError("the amount is too large")
        stored_thresholds = None if thresholds is None else ",".join(map(str, check_thresholds(thresholds)))
        now = now or datetime.now(UTC)
        where = (
            spend_limits.c.scope_type == scope_type,
            spend_limits.c.scope_id == scope_id,
            spend_limits.c.period == period,
        )
        for _attempt in range(2):
            before = self._find(*where)
            try:
                with self._writer.begin() as conn:
                    if before is None:
                        insert_limit(conn, scope_type, scope_id, period, amount_micros, stored_thresholds, now)
                    else:
                        values: dict[str, Any] = {"amount_micros": amount_micros, "updated_at": now}
                        if thresholds is not None:
                            values["thresholds"] = stored_thresholds
                        conn.execute(update(spend_limits).where(*where).values(**values))
            except IntegrityError:
                continue  # set at the same time elsewhere: overwrite that one
            after = self._find(*where)
            assert after is not None
            self.changed()
            return before, after
        raise StoreError("the spend limit changed while it was being set; try again")

    def _find(self, *where: Any) -> SpendLimitInfo | None:
        with self._engine.connect() as conn:
            row = conn.execute(_INFO.where(*where)).first()
        return None if row is None else _info(row)

    def delete(self, public_id: str) -> SpendLimitInfo:
        """Remove the limit ``spl_…`` with its periods' counters and alerts; returns what it
        was. Requests holding on it settle without it. ``StoreError`` if there is none."""
        before = self.get(public_id)
        with self._writer.begin() as conn:
            conn.execute(delete(spend_alerts).where(spend_alerts.c.limit_id == before.id))
            conn.execute(delete(spend_counters).where(spend_counters.c.limit_id == before.id))
            conn.execute(delete(spend_limits).where(spend_limits.c.id == before.id))
        self.changed()
        return before

    # ------------------------------------------------------------ alerts (ezat_compat/alerts.py)

    def claim_alert(self, limit_id: int, period_start: datetime, threshold: int, now: datetime) -> bool:
        """Claim the alert of ``threshold`` for the period: True for the one caller (of every
        worker and node) that inserted its mark, False when it was claimed before."""
        try:
            with self._writer.begin() as conn:
                conn.execute(
                    insert(spend_alerts).values(
                        limit_id=limit_id, period_start=period_start, threshold=threshold, claimed_at=now, attempts=0
                    )
                )
        except IntegrityError:
            return False
        return True

    def alert_attempted(
        self, limit_id: int, period_start: datetime, threshold: int, attempts: int, delivered_at: datetime | None
    ) -> None:
        """Record an alert's delivery attempts and, once it was taken, when."""
        with self._writer.begin() as conn:
            conn.execute(
                update(spend_alerts)
                .where(
                    spend_alerts.c.limit_id == limit_id,
                    spend_alerts.c.period_start == period_start,
                    spend_alerts.c.threshold == threshold,
                )
                .values(attempts=attempts, delivered_at=delivered_at)
            )

    def claimed_alerts(self, limit_ids: Sequence[int], period_starts: Sequence[datetime]) -> set[tuple[int, int]]:
        """The (limit_id, threshold) pairs already claimed for the given current periods."""
        if not limit_ids:
            return set()
        keys = list(zip(limit_ids, period_starts, strict=True))
        query = select(spend_alerts.c.limit_id, spend_alerts.c.threshold).where(
            tuple_(spend_alerts.c.limit_id, spend_alerts.c.period_start).in_(keys)
        )
        with self._engine.connect() as conn:
            return {(row.limit_id, row.threshold) for row in conn.execute(query)}
