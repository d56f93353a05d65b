"""Storage quotas per organisation: what its stored responses and message threads may hold
(docs/responses.md, "Stored responses"; docs/config.md, ``[responses]``).

Every stored row (a response, a thread's turn) records its size, ``stored_bytes``: the UTF-8
bytes of what it keeps. ``storage_usage`` holds each organisation's running totals, bytes and
rows, changed in the transaction of the write that changes them (a put, a delete, a purge of
expired rows), so a request reads its organisation's use with one look-up by key, never a SUM.

An organisation at or past either limit is refused before anything is done for the request
(``CountedStore.over_quota``, called by the dialects' ``prepare``, before admission; an
organisation found under its quota is not read again for a second): a
Responses request that would be stored answers 400 ``storage_quota_exceeded`` naming ``store``,
a thread's turn 400 ``thread_unsupported_request`` naming ``thread`` (the SDKs' tool runners
then go on without threads). The check reads the totals before the request; requests in flight
together can each add one response or turn past the limit (a soft limit: a request's own size
is known only once it is answered). Reading, continuing without storing, and deleting work at
the quota, and free it.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, select, text, tuple_
from sqlalchemy.exc import SQLAlchemyError

from ezat_compat.errors import InvalidRequestError, ThreadUnsupportedError
from ezat_compat.store.expiry import ExpiringStore, Purger, reading
from ezat_compat.store.hotpath import Execute, HotPath

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# The defaults of ``[responses] org_quota_mb`` and ``org_quota_count`` (0: no limit).
DEFAULT_QUOTA_MB = 1024.0
DEFAULT_QUOTA_COUNT = 200_000
QUOTA_MB_SETTING = "[responses] org_quota_mb"
QUOTA_COUNT_SETTING = "[responses] org_quota_count"
UNDER_FOR_S = 1.0  # an organisation found under its quota is not read again for this long
UNDER_KEPT = 10_000  # organisations remembered so (then forgotten all at once)

# Add to (or, negative, take from) an organisation's totals; never below zero.
USAGE_ADD_SQL = (
    "INSERT INTO storage_usage (org_id, stored_bytes, stored_count) VALUES (:org_id, "
    "CASE WHEN :delta_bytes > 0 THEN :delta_bytes ELSE 0 END, CASE WHEN :delta_count > 0 THEN :delta_count ELSE 0 END) "
    "ON CONFLICT (org_id) DO UPDATE SET "
    "stored_bytes = CASE WHEN storage_usage.stored_bytes + :delta_bytes > 0 "
    "THEN storage_usage.stored_bytes + :delta_bytes ELSE 0 END, "
    "stored_count = CASE WHEN storage_usage.stored_count + :delta_count > 0 "
    "THEN storage_usage.stored_count + :delta_count ELSE 0 END"
)
USAGE_SQL = "SELECT stored_bytes, stored_count FROM storage_usage WHERE org_id = :org_id"


def add_usage(execute: Execute, org_id: int, delta_bytes: int, delta_count: int) -> None:
    """Change ``org_id``'s totals in the caller's transaction (nothing to do for a zero change)."""
    if delta_bytes or delta_count:
        execute(USAGE_ADD_SQL, {"org_id": org_id, "delta_bytes": delta_bytes, "delta_count": delta_count})


@dataclass(frozen=True, slots=True)
class StorageQuota:
    """What one organisation may keep: ``max_bytes`` of stored responses and threads' turns and
    ``max_count`` of them; 0 is no limit."""

    max_bytes: int = int(DEFAULT_QUOTA_MB * MIB)
    max_count: int = DEFAULT_QUOTA_COUNT

    @property
    def limited(self) -> bool:
        return self.max_bytes > 0 or self.max_count > 0


def quota_of(settings: Any) -> StorageQuota:
    """The quota ``[responses]`` sets: ``org_quota_mb`` (MiB, default 1024) and
    ``org_quota_count`` (default 200,000); the defaults for settings that lack them."""
    megabytes = getattr(settings, "org_quota_mb", DEFAULT_QUOTA_MB)
    count = getattr(settings, "org_quota_count", DEFAULT_QUOTA_COUNT)
    return StorageQuota(int(float(megabytes) * MIB), int(count))


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """Which limit an organisation has reached: the setting, its limit and the use, as text."""

    setting: str
    limit: str
    used: str

    def says(self) -> str:
        """The middle of the client's message: what is used, the limit and its setting."""
        return (
            f"this organisation's stored responses and threads hold {self.used}, "
            f"its quota is {self.limit} ({self.setting})"
        )


def _mb(size: int) -> str:
    return f"{size / MIB:.1f} MB"


def refusal(quota: StorageQuota, used_bytes: int, used_count: int) -> QuotaRefusal | None:
    """The limit ``used_bytes`` / ``used_count`` has reached, or None while both are under."""
    if quota.max_bytes > 0 and used_bytes >= quota.max_bytes:
        return QuotaRefusal(QUOTA_MB_SETTING, f"{quota.max_bytes / MIB:g} MB", _mb(used_bytes))
    if quota.max_count > 0 and used_count >= quota.max_count:
        return QuotaRefusal(QUOTA_COUNT_SETTING, f"{quota.max_count} stored objects", f"{used_count} stored objects")
    return None


class StorageQuotaError(InvalidRequestError):
    """A Responses request that would be stored, from an organisation at its storage quota: 400
    ``storage_quota_exceeded`` naming ``store``. Delete stored responses, let them expire, or
    send ``"store": false``; retrying as is won't help."""

    code = "storage_quota_exceeded"

    def __init__(self, over: QuotaRefusal) -> None:
        super().__init__(
            f"store: {over.says()}; delete stored responses (DELETE /openai/v1/responses/{{id}}), "
            'let them expire, or send "store": false',
            param="store",
        )


class ThreadQuotaError(ThreadUnsupportedError):
    """A thread's turn from an organisation at its storage quota: 400 ``thread_unsupported_request``
    (the SDKs' tool runners go on without threads), naming the quota."""

    def __init__(self, over: QuotaRefusal) -> None:
        super().__init__(f"thread: {over.says()}; resend this turn with the full message history, without thread")
        self.param = "thread"


class CountingPurger(Purger):
    """A ``Purger`` whose deletes take the rows' sizes off their organisations' totals, in the
    same transaction, and tell ``purged`` the keys of the rows that went (to delete what goes
    with them)."""

    def __init__(self, *args: Any, purged: Callable[[Connection, list[tuple[Any, ...]]], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._purged = purged

    def purge(self, now: float) -> int:
        table = self._table
        moment = datetime.fromtimestamp(now, UTC)
        expired = select(*self._key).where(table.c.expires_at <= moment).limit(self._batch)
        try:
            with self._writer.begin() as conn:
                gone = conn.execute(
                    delete(table)
                    .where(tuple_(*self._key).in_(expired.scalar_subquery()))
                    .returning(*self._key, table.c.stored_bytes)
                ).all()
                if gone:
                    self._purged(conn, [tuple(row[:-1]) for row in gone])
                take_off(conn, [(row[0], row[-1]) for row in gone])
        except SQLAlchemyError as exc:
            log.warning("%s: purge failed (%s)", table.name, exc)
            return 0
        return len(gone)


def take_off(conn: Connection, gone: Any) -> None:
    """Take deleted rows, (org_id, stored_bytes) each, off their organisations' totals (by
    organisation id, the order every writer of the totals keeps)."""
    freed: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for org_id, size in gone:
        freed[int(org_id)][0] += int(size or 0)
        freed[int(org_id)][1] += 1
    statement = text(USAGE_ADD_SQL)
    for org_id in sorted(freed):
        size, count = freed[org_id]
        conn.execute(statement, {"org_id": org_id, "delta_bytes": -size, "delta_count": -count})


class CountedStore(ExpiringStore):
    """An ``ExpiringStore`` whose rows count against their organisation's ``StorageQuota``: its
    table has ``stored_bytes``; its writes keep ``storage_usage`` (``add_usage``, ``take_off``)."""

    def __init__(
        self,
        engine: Engine,
        ttl_s: float,
        *,
        hot: HotPath | None = None,
        purge_every_s: float = 60.0,
        purge_batch: int = 500,
        quota: StorageQuota | None = None,
    ) -> None:
        """``quota``: what each organisation may keep (``quota_of(settings)``; the defaults when
        None)."""
        self.quota = quota if quota is not None else StorageQuota()
        self._under: dict[int, float] = {}  # organisation -> until when it is taken to be under its quota
        super().__init__(engine, ttl_s, hot=hot, purge_every_s=purge_every_s, purge_batch=purge_batch)
        self._purger = CountingPurger(
            self._writer, self.table, self.key, every_s=purge_every_s, batch=purge_batch, purged=self._purged
        )

    def _purged(self, conn: Connection, keys: list[tuple[Any, ...]]) -> None:
        """Rows of these keys were purged (in ``conn``'s transaction): delete what goes with them."""

    def usage(self, org_id: int) -> tuple[int, int]:
        """``org_id``'s totals: (bytes, rows) of its stored responses and threads' turns."""
        params = {"org_id": org_id}
        if self._hot is not None:
            row = self._hot.read(USAGE_SQL, params)
        else:
            try:
                with self._engine.connect() as conn:
                    row = conn.execute(text(USAGE_SQL), params).first()
            except SQLAlchemyError as exc:
                raise reading(exc) from exc
        return (int(row[0]), int(row[1])) if row is not None else (0, 0)

    def over_quota(self, org_id: int, now: float | None = None) -> QuotaRefusal | None:
        """The limit of its quota the organisation has reached, or None (one read by key; none
        at all when the quota has no limit). Call it before doing anything for a request that
        would be stored. With ``now``, an organisation found under its quota is taken to be so
        for ``UNDER_FOR_S`` (a request of a busy organisation reads nothing); one at its quota
        is read again each time, so a delete frees it at once."""
        if not self.quota.limited:
            return None
        if now is not None and self._under.get(org_id, -math.inf) > now:
            return None
        used_bytes, used_count = self.usage(org_id)
        over = refusal(self.quota, used_bytes, used_count)
        if now is not None and over is None:
            if len(self._under) >= UNDER_KEPT:
                self._under.clear()
            self._under[org_id] = now + UNDER_FOR_S
        return over
