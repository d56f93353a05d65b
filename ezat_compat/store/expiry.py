"""Rows kept until an ``expires_at`` (stored responses, message threads): purged in bounded
batches, read errors mapped as every reader maps them."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import ClassVar

from sqlalchemy import Column, Engine, Table, delete, select, tuple_
from sqlalchemy.exc import SQLAlchemyError

from ezat_compat.store.db import write_engine
from ezat_compat.store.hotpath import DatabaseUnavailableError, HotPath, is_unavailable

log = logging.getLogger(__name__)


def reading(exc: Exception) -> Exception:
    """A database that can't answer is 503 with retry-after (``DatabaseUnavailableError``)."""
    return DatabaseUnavailableError() if is_unavailable(exc) else exc


class Purger:
    """Deletes up to ``batch`` expired rows of ``table`` at most every ``every_s`` seconds
    (``when_due``), or at once (``purge``). The rows go by their whole ``key``, found through
    ``expires_at``'s index: a bounded batch of index searches however large the table (by the
    key's second column alone, each purge scanned the whole table, and took another
    organisation's live row of the same id)."""

    def __init__(
        self, writer: Engine, table: Table, key: tuple[Column[str] | Column[int], ...], *, every_s: float, batch: int
    ) -> None:
        self._writer = writer
        self._table = table
        self._key = key
        self._every_s = every_s
        self._batch = batch
        self._next = -math.inf

    def when_due(self, now: float) -> None:
        if now >= self._next:
            self._next = now + self._every_s
            self.purge(now)

    def purge(self, now: float) -> int:
        """How many rows went (a failure is logged, and 0)."""
        table = self._table
        expired = select(*self._key).where(table.c.expires_at <= datetime.fromtimestamp(now, UTC)).limit(self._batch)
        try:
            with self._writer.begin() as conn:
                gone = conn.execute(delete(table).where(tuple_(*self._key).in_(expired.scalar_subquery())))
        except SQLAlchemyError as exc:
            log.warning("%s: purge failed (%s)", table.name, exc)
            return 0
        return int(gone.rowcount or 0)


class ExpiringStore:
    """A table of an organisation's rows kept for ``ttl_s`` (``ResponseStore``, ``ThreadStore``:
    each names its ``table`` and the ``key`` of a row): the engine it reads through, the writer
    and hot path it writes through, its ``Purger``. One per process (after the fork, like the
    engine)."""

    table: ClassVar[Table]
    key: ClassVar[tuple[Column[str] | Column[int], ...]]

    def __init__(
        self,
        engine: Engine,
        ttl_s: float,
        *,
        hot: HotPath | None = None,
        purge_every_s: float = 60.0,
        purge_batch: int = 500,
    ) -> None:
        """``hot``: the gateway's hot path on the same database; a write then rides with the
        request's ledger row (on SQLite sharing its group transaction). Without one, writes go
        through ``engine``'s writer."""
        self._engine = engine
        self._hot = hot
        self._writer = write_engine(engine)
        self.ttl_s = ttl_s
        self._purger = Purger(self._writer, self.table, self.key, every_s=purge_every_s, batch=purge_batch)
        self._prepare()

    def _prepare(self) -> None:
        """What a store builds once, from its engine (its statements), after the above."""

    def purge(self, now: float) -> int:
        """Delete up to ``purge_batch`` expired rows; how many went (errors logged)."""
        return self._purger.purge(now)
