"""The usage rollup: the ledger summed per minute, hour and day, so that the admin API's usage and
cost reports read thousands of rows, not millions (``admin/reports.py``; bench/reports.py).

Three tables (``store/tables.py``: ``usage_1m``, ``usage_1h``, ``usage_1d``) hold, per bucket
start (UTC), organisation, key and canonical model, the number of ledger rows and the sums of
their token counts and cost (integer micro-USD): exactly what ``ezat-compat usage --json`` lists,
summed. They are kept by a *fold*, never on a request's path:

- ``Rollup.fold`` takes the ledger rows after the watermark (``usage_rollup.folded_id``) in id
  order, at most ``max_rows`` of them, and adds them to the three tables, advancing the watermark,
  in one transaction. The ledger's ids are its insertion order, so a row that arrives late (a
  settlement replayed from the usage journal, with its old ``created_at``) is folded into its old
  bucket all the same. The watermark and the sums commit together: a fold cut short folds nothing,
  and the next one starts where the last committed one ended (idempotent, exactly once).
- PostgreSQL hands out ids when a row is inserted, not when its transaction commits: an id may
  become visible after a higher one. The fold runs on one snapshot (REPEATABLE READ) and records
  the ids below its new watermark that it did not see as *holes* (``usage_rollup_holes``); each
  later fold folds the holes that have appeared and forgets those older than ``HOLE_TTL`` (an id
  whose transaction rolled back, or a duplicate settlement's, never appears). At most
  ``MAX_GAP_HOLES`` ids are recorded per gap, the highest (the last handed out before the row
  after it: in-flight transactions are recent), so a sequence that jumped costs nothing. On SQLite
  the writer holds the database's write lock, so there are none.
- Folds never overlap: on SQLite the write transaction (``BEGIN IMMEDIATE``), on PostgreSQL a
  session advisory lock taken before the snapshot. A fold that can't get it within ``wait_s``
  returns ``busy`` (someone else is folding).

Who folds: every gateway worker runs ``start()`` (gunicorn's ``post_worker_init``): a background
loop (a greenlet under gevent) that folds ``FOLD_BATCH`` rows at a time while rows wait, then
looks again every ``FOLD_EVERY_S``; a look that finds nothing new costs two indexed reads. And a
report folds what is new first (``catch_up``, at most ``REPORT_FOLD_MAX`` rows), so it counts
every row settled before it was asked; ``refreshed_at`` is when a fold last reached the ledger's
end.

Reading: ``totals(Slice)`` sums the rows of one bucket width's table over a range, grouped by any
of bucket, organisation, key and model, filtered, ordered and cut to a page in SQL. A range read
without buckets is tiled with the coarsest tables that fit (days in the middle, hours at the edges).
A page of (bucket, group) rows ranked by a metric is found on that metric alone, then only its rows
are summed in full (``_query``). On PostgreSQL a read gets the memory to aggregate a month of hours without
spilling to disk (``_PG_READ_SETTINGS``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Select,
    Table,
    and_,
    bindparam,
    cast,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.exc import OperationalError

from ezat_compat.procid import pid
from ezat_compat.store.db import SQLITE_BUSY_TIMEOUT_S, is_sqlite, write_engine
from ezat_compat.store.tables import (
    api_keys,
    from_epoch_micros,
    orgs,
    to_epoch_micros,
    usage_1d,
    usage_1h,
    usage_1m,
    usage_rollup,
    usage_rollup_holes,
)

log = logging.getLogger("ezat_compat")

MINUTE = 60_000_000  # a bucket width in microseconds
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WIDTHS: dict[str, int] = {"1m": MINUTE, "1h": HOUR, "1d": DAY}
TABLES: dict[str, Table] = {"1m": usage_1m, "1h": usage_1h, "1d": usage_1d}
METRICS = ("requests", "input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens", "cost_micros")
TOKENS = ("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens")  # total_tokens sums these
DIMENSIONS = ("org", "key", "model")  # what ``Slice.group`` may name
ORDERS = ("time", "total_tokens", *METRICS)  # what ``Slice.order_by`` may name

FOLD_BATCH = 2_000  # ledger rows per background fold transaction (SQLite: it holds the write lock, and a
# gevent worker's loop, for its duration: tens of milliseconds)
FOLD_EVERY_S = 5.0  # how often an idle fold loop looks for new ledger rows
REPORT_FOLD_MAX = 50_000  # rows a report folds at most before reading (the loop keeps the backlog far below)
REPORT_FOLD_WAIT_S = 2.0  # how long a report waits for another process's fold to end
HOLE_TTL = timedelta(minutes=10)  # a hole not filled by then was an id whose transaction rolled back
MAX_GAP_HOLES = 1_000  # ids recorded per gap in the ids (the highest ones)
HOLES_PER_FOLD = 5_000  # recorded holes looked up per fold
STATE_ID = 1
_PG_FOLD_LOCK = 0x657A_6174_726F_6C6C  # pg_advisory_lock key of the fold ("ezatroll")
# PostgreSQL, for the transaction of one report's read: its hash aggregate kept in memory (the
# default 4 MB spills a month of hourly rows to disk: twice as slow) and no JIT compilation (it
# costs more than it saves on a read this size).
_PG_READ_SETTINGS = text("SET LOCAL work_mem = '64MB'; SET LOCAL jit = off")
_SQLITE_BUSY = f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}"  # the engine's own, restored


# ------------------------------------------------------------------ pure parts


def bucket_start(micros: int, width: int) -> int:
    """The start of the bucket of width ``width`` (micros) that holds epoch micros ``micros``
    (UTC: days start at midnight UTC)."""
    return micros - micros % width


def floor_to(moment: datetime, width: int) -> datetime:
    """``moment`` (aware) rounded down to a multiple of ``width`` micros since the epoch."""
    return from_epoch_micros(bucket_start(to_epoch_micros(moment), width))


def missing_ids(lo: int, hi: int, present: Iterable[int], per_gap: int = MAX_GAP_HOLES) -> list[int]:
    """The ids in ``(lo, hi]`` not in ``present`` (sorted ids within that range, ``hi`` among
    them), at most the ``per_gap`` highest of each run of missing ids."""
    found: list[int] = []
    previous = lo
    for current in present:
        if current - previous > 1:
            found.extend(range(max(previous + 1, current - per_gap), current))
        previous = current
    return found


def tiles(start: int, end: int) -> list[tuple[str, int, int]]:
    """``[start, end)`` (epoch micros, multiples of a minute) cut into the fewest pieces of the
    rollup's tables: ``(width, lo, hi)`` with ``lo``/``hi`` multiples of that width, whole days in
    the middle, whole hours next to them, minutes at the edges."""
    if start % MINUTE or end % MINUTE:
        raise ValueError("a range read from the rollup starts and ends on whole minutes")
    pieces: list[tuple[str, int, int]] = []

    def cut(lo: int, hi: int, widths: Sequence[str]) -> None:
        if lo >= hi:
            return
        name, *finer = widths
        width = WIDTHS[name]
        first = -(-lo // width) * width
        last = hi // width * width
        if not finer:
            pieces.append((name, lo, hi))
            return
        if first >= last:
            cut(lo, hi, finer)
            return
        cut(lo, first, finer)
        pieces.append((name, first, last))
        cut(last, hi, finer)

    cut(start, end, ("1d", "1h", "1m"))
    return sorted(pieces, key=lambda piece: piece[1])


@dataclass(frozen=True, slots=True)
class Slice:
    """What a report reads from the rollup.

    ``width``: the buckets ("1m", "1h", "1d") when ``by_bucket``; ``start``/``end``: the range,
    multiples of that width (of a minute without ``by_bucket``), ``end`` exclusive. ``group``:
    the dimensions a row is broken out by (``DIMENSIONS``), besides the bucket. Filters: ``org_ids``,
    ``key_ids`` (the tables' integer ids), ``models`` (canonical ids; "" is the model of a request
    that failed before routing); None = all. ``order_by``: ``ORDERS`` ("time": by bucket, then by
    ``then_by``), ``descending``; ties are broken by the bucket and the dimensions' values, so
    ``limit``/``offset`` pages never skip nor repeat a row. ``then_by``: what orders the rows of
    one bucket (highest first) when ``order_by`` is "time".
    """

    width: str
    start: datetime
    end: datetime
    by_bucket: bool = True
    group: tuple[str, ...] = ()
    org_ids: tuple[int, ...] | None = None
    key_ids: tuple[int, ...] | None = None
    models: tuple[str, ...] | None = None
    order_by: str = "time"
    descending: bool = False
    then_by: str = "total_tokens"
    limit: int | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        if self.width not in WIDTHS:
            raise ValueError(f"width must be one of {sorted(WIDTHS)}, got {self.width!r}")
        unknown = set(self.group) - set(DIMENSIONS)
        if unknown:
            raise ValueError(f"group may name {DIMENSIONS}, got {sorted(unknown)}")
        if self.order_by not in ORDERS or self.then_by not in ORDERS[1:]:
            raise ValueError(f"order_by must be one of {ORDERS}, got {self.order_by!r} then {self.then_by!r}")
        grain = WIDTHS[self.width] if self.by_bucket else MINUTE
        for moment in (self.start, self.end):
            if to_epoch_micros(moment) % grain:
                raise ValueError(f"{moment.isoformat()} is not a multiple of the slice's width")
        if self.end < self.start:
            raise ValueError("end is before start")


@dataclass(frozen=True, slots=True)
class Total:
    """One row of ``totals``: its bucket's start (None without buckets), the dimensions' values
    (None unless grouped by them) and the sums."""

    bucket: datetime | None
    org_id: int | None
    key_id: int | None
    model: str | None
    requests: int
    input_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_micros: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.cache_write_tokens + self.cache_read_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class FoldReport:
    """What one ``fold`` did: rows folded (holes that appeared included), holes recorded now,
    whether it reached the ledger's end, and ``busy`` when another fold held the lock."""

    folded: int = 0
    holes: int = 0
    caught_up: bool = False
    busy: bool = False


_COLUMNS = ("org_id", "key_id", "model")  # the tables' column of each of ``DIMENSIONS``


def _grouped(part: Slice) -> list[str]:
    """The columns ``part`` groups by besides the bucket, in the tables' key order. A key belongs
    to one organisation: grouping by the key groups by both, so that the database aggregates
    the rows in the order it reads them (bucket, org_id, key_id, model)."""
    wanted = set(part.group) | ({"org"} if "key" in part.group else set())
    return [column for dimension, column in zip(DIMENSIONS, _COLUMNS, strict=True) if dimension in wanted]


# ------------------------------------------------------------------ the fold's statements

_DIMENSION_COLUMNS = "org_id, key_id, canonical_model"


def _fold_sql(table: Table, width: int, where: str) -> str:
    """Add the ledger rows matching ``where`` to ``table`` (buckets of ``width`` micros)."""
    bucket = f"created_at - created_at % {int(width)}"
    sums = ", ".join(f"SUM({name})" for name in TOKENS) + ", SUM(cost_micros)"
    updates = ", ".join(f"{name} = {table.name}.{name} + excluded.{name}" for name in METRICS)
    return (
        f"INSERT INTO {table.name} (bucket, org_id, key_id, model, {', '.join(METRICS)}) "
        f"SELECT {bucket}, {_DIMENSION_COLUMNS}, COUNT(*), {sums} FROM ledger WHERE {where} "
        f"GROUP BY {bucket}, {_DIMENSION_COLUMNS} "
        f"ON CONFLICT (bucket, org_id, key_id, model) DO UPDATE SET {updates}"
    )


_RANGE = "id > :lo AND id <= :hi"
_FOLD_RANGE = [text(_fold_sql(TABLES[w], WIDTHS[w], _RANGE)) for w in WIDTHS]
_FOLD_IDS = [
    text(_fold_sql(TABLES[w], WIDTHS[w], "id IN :ids")).bindparams(bindparam("ids", expanding=True)) for w in WIDTHS
]
# The next ``n`` ledger rows after ``lo``: how many, and the last one's id.
_NEXT_BATCH = text("SELECT COUNT(*), MAX(id) FROM (SELECT id FROM ledger WHERE id > :lo ORDER BY id LIMIT :n) AS b")
_IDS_IN_RANGE = text("SELECT id FROM ledger WHERE id > :lo AND id <= :hi ORDER BY id")
_HEAD = text("SELECT MAX(id) FROM ledger")
_PRESENT = text("SELECT id FROM ledger WHERE id IN :ids").bindparams(bindparam("ids", expanding=True))


class Rollup:
    """The rollup of the ledger on ``engine`` (module docstring). Thread-safe; one per process."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = write_engine(engine)
        self._sqlite = is_sqlite(engine)
        self._loop_pid = 0  # the process whose fold loop runs (``start``)
        self._wake = threading.Event()

    # -------------------------------------------------------------- folding

    def fold(self, max_rows: int = FOLD_BATCH, *, wait_s: float = 0.1, now: datetime | None = None) -> FoldReport:
        """Fold at most ``max_rows`` new ledger rows (and the holes that appeared) in one
        transaction. Returns ``busy`` when another fold holds the lock beyond ``wait_s``.
        Database errors other than that propagate (the loop logs them)."""
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        if not self._has_work():
            return FoldReport(caught_up=True)
        with self._locked(wait_s) as conn:
            if conn is None:
                return FoldReport(busy=True)
            return self._fold_on(conn, max_rows, now or datetime.now(UTC))

    def catch_up(self, max_rows: int = REPORT_FOLD_MAX, *, wait_s: float = REPORT_FOLD_WAIT_S) -> bool:
        """Fold until the ledger's end or ``max_rows`` rows, in transactions of ``FOLD_BATCH``
        rows or more; True when the end was reached (what a report calls before reading)."""
        folded = 0
        while True:
            report = self.fold(max(FOLD_BATCH, min(max_rows - folded, 1_000_000)), wait_s=wait_s)
            folded += report.folded
            if report.caught_up:
                return True
            if report.busy or folded >= max_rows:
                return False

    def refreshed_at(self) -> datetime | None:
        """When the fold last reached the ledger's end (None: never yet)."""
        with self._engine.connect() as conn:
            value = conn.execute(
                select(usage_rollup.c.refreshed_at).where(usage_rollup.c.id == STATE_ID)
            ).scalar_one_or_none()
        return value if isinstance(value, datetime) else None

    def _has_work(self) -> bool:
        """New ledger rows or recorded holes (two indexed reads, no lock)."""
        with self._engine.connect() as conn:
            folded = conn.execute(select(usage_rollup.c.folded_id).where(usage_rollup.c.id == STATE_ID)).scalar()
            head = conn.execute(_HEAD).scalar()
            if (head or 0) > (folded or 0):
                return True
            return conn.execute(select(usage_rollup_holes.c.ledger_id).limit(1)).first() is not None

    @contextmanager
    def _locked(self, wait_s: float) -> Iterator[Connection | None]:
        """A connection in the fold's transaction, or None when another fold holds it beyond
        ``wait_s``. SQLite: ``BEGIN IMMEDIATE`` with a busy timeout of ``wait_s``; PostgreSQL:
        the session advisory lock, then a REPEATABLE READ transaction (one snapshot for the
        whole fold)."""
        with self._writer.connect() as conn:
            if self._sqlite:
                raw = conn.connection.driver_connection
                assert raw is not None
                raw.execute(f"PRAGMA busy_timeout = {max(0, int(wait_s * 1000))}")
                try:
                    try:
                        conn.begin()
                    except OperationalError as exc:
                        if "locked" in str(exc) or "busy" in str(exc):
                            yield None
                            return
                        raise
                    raw.execute(_SQLITE_BUSY)
                    yield conn
                    conn.commit()
                finally:
                    raw.execute(_SQLITE_BUSY)
                return
            if not self._pg_lock(conn, wait_s):
                yield None
                return
            try:
                conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    yield conn
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_FOLD_LOCK})
                conn.commit()

    @staticmethod
    def _pg_lock(conn: Connection, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": _PG_FOLD_LOCK}).scalar()
            conn.commit()
            if got:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _fold_on(self, conn: Connection, max_rows: int, now: datetime) -> FoldReport:
        state = conn.execute(select(usage_rollup.c.folded_id).where(usage_rollup.c.id == STATE_ID)).first()
        if state is None:  # a schema made from the tables (tests): the migration's row
            conn.execute(usage_rollup.insert().values(id=STATE_ID, folded_id=0, refreshed_at=None))
            lo = 0
        else:
            lo = int(state.folded_id)
        folded = self._fold_holes(conn, now)
        count, hi = conn.execute(_NEXT_BATCH, {"lo": lo, "n": max_rows}).one()
        count = int(count or 0)
        recorded = 0
        if count:
            hi = int(hi)
            if hi - lo != count:
                present = [int(row[0]) for row in conn.execute(_IDS_IN_RANGE, {"lo": lo, "hi": hi})]
                holes = missing_ids(lo, hi, present)
                if holes:
                    conn.execute(usage_rollup_holes.insert(), [{"ledger_id": h, "seen_at": now} for h in holes])
                    recorded = len(holes)
            for statement in _FOLD_RANGE:
                conn.execute(statement, {"lo": lo, "hi": hi})
            folded += count
        caught_up = count < max_rows or conn.execute(_HEAD).scalar() == hi
        values: dict[str, Any] = {"folded_id": hi if count else lo}
        if caught_up:
            values["refreshed_at"] = now
        conn.execute(usage_rollup.update().where(usage_rollup.c.id == STATE_ID).values(**values))
        return FoldReport(folded, recorded, caught_up)

    @staticmethod
    def _fold_holes(conn: Connection, now: datetime) -> int:
        """Fold the recorded holes that have appeared, forget them and the expired ones."""
        holes = [
            int(row[0])
            for row in conn.execute(
                select(usage_rollup_holes.c.ledger_id).order_by(usage_rollup_holes.c.ledger_id).limit(HOLES_PER_FOLD)
            )
        ]
        if not holes:
            return 0
        appeared = [int(row[0]) for row in conn.execute(_PRESENT, {"ids": holes})]
        if appeared:
            for statement in _FOLD_IDS:
                conn.execute(statement, {"ids": appeared})
            conn.execute(usage_rollup_holes.delete().where(usage_rollup_holes.c.ledger_id.in_(appeared)))
        conn.execute(usage_rollup_holes.delete().where(usage_rollup_holes.c.seen_at < now - HOLE_TTL))
        return len(appeared)

    # -------------------------------------------------------------- the background loop

    def start(self, every_s: float = FOLD_EVERY_S) -> None:
        """Start this process's fold loop (once per process: gunicorn's ``post_worker_init``): a
        background thread (a greenlet in a gevent worker) that folds while rows wait and looks
        again every ``every_s``. Never raises; a failing database is logged once per incident."""
        if self._loop_pid == pid():
            return
        self._loop_pid = pid()
        threading.Thread(target=self._loop, args=(every_s,), name="ezat-usage-rollup", daemon=True).start()

    def stop(self) -> None:
        """Stop the loop after its current fold (tests; a worker's ends with the process)."""
        self._loop_pid = 0
        self._wake.set()

    def _loop(self, every_s: float) -> None:
        owner = pid()
        failing = False
        while self._loop_pid == owner == pid():
            pause = every_s
            try:
                report = self.fold()
                if not report.caught_up and not report.busy:
                    pause = 0.0  # rows wait: the next batch at once, after the others had their turn
                failing = False
            except Exception as exc:
                if not failing:  # once per incident, not every round
                    log.warning("usage rollup: %s (retried every %g s)", exc, every_s)
                failing = True
            if pause:
                self._wake.wait(pause)
                self._wake.clear()
            else:
                time.sleep(0)

    # -------------------------------------------------------------- reading

    def key_ids(self, public_ids: Iterable[str]) -> tuple[int, ...]:
        """The integer ids of the keys ``key_…`` among ``public_ids`` (the others match none)."""
        wanted = sorted(set(public_ids))
        if not wanted:
            return ()
        with self._engine.connect() as conn:
            rows = conn.execute(select(api_keys.c.id).where(api_keys.c.public_id.in_(wanted)))
            return tuple(sorted(int(row[0]) for row in rows))

    def org_ids(self, refs: Iterable[str]) -> tuple[int, ...]:
        """The integer ids of the organisations whose workspace id (``wrkspc_…``) or name is
        among ``refs`` (the others match none)."""
        wanted = sorted(set(refs))
        if not wanted:
            return ()
        query = select(orgs.c.id).where(or_(orgs.c.public_id.in_(wanted), orgs.c.name.in_(wanted)))
        with self._engine.connect() as conn:
            return tuple(sorted({int(row[0]) for row in conn.execute(query)}))

    def public_ids(self, org_ids: Iterable[int], key_ids: Iterable[int]) -> tuple[dict[int, str], dict[int, str]]:
        """The workspace ids (``wrkspc_…``) of ``org_ids`` and the public ids (``key_…``) of
        ``key_ids``: what a report names them by."""
        orgs_wanted, keys_wanted = sorted(set(org_ids)), sorted(set(key_ids))
        found_orgs: dict[int, str] = {}
        found_keys: dict[int, str] = {}
        with self._engine.connect() as conn:
            if orgs_wanted:
                query = select(orgs.c.id, orgs.c.public_id, orgs.c.name).where(orgs.c.id.in_(orgs_wanted))
                found_orgs = {int(r.id): str(r.public_id or r.name) for r in conn.execute(query)}
            if keys_wanted:
                query = select(api_keys.c.id, api_keys.c.public_id).where(api_keys.c.id.in_(keys_wanted))
                found_keys = {int(r.id): str(r.public_id) for r in conn.execute(query)}
        return found_orgs, found_keys

    def totals(self, part: Slice) -> list[Total]:
        """The rows of ``part`` (``Slice``), in its order, its page only."""
        query = self._query(part)
        with self._engine.connect() as conn:
            if not self._sqlite:  # a report sums up to a few hundred thousand rows at once
                conn.execute(_PG_READ_SETTINGS)
            rows = conn.execute(query).all()
        # Columns: the bucket (when by bucket), the grouped dimensions in ``_grouped`` order, the sums.
        names = _grouped(part)
        at = {name: index + part.by_bucket for index, name in enumerate(names)}
        first = part.by_bucket + len(names)
        org, key, model = (at.get(c) if d in part.group else None for d, c in zip(DIMENSIONS, _COLUMNS, strict=True))
        buckets: dict[int, datetime] = {}
        found = []
        for r in rows:
            bucket = None
            if part.by_bucket:
                bucket = buckets.get(r[0])
                if bucket is None:
                    bucket = buckets[r[0]] = from_epoch_micros(int(r[0]))
            sums = r[first:]
            found.append(
                Total(
                    bucket,
                    None if org is None else r[org],
                    None if key is None else r[key],
                    None if model is None else r[model],
                    *(sums if None not in sums else (value or 0 for value in sums)),  # NULL: nothing summed
                )
            )
        return found

    @staticmethod
    def _query(part: Slice) -> Select[Any]:
        """The SQL of ``part``. A page of (bucket, group) rows ranked by a metric is read in two
        steps, in one statement: the page's rows ranked on that metric alone (one sum over the
        range, not six), then the six sums of those rows only, found by bucket."""
        start, end = to_epoch_micros(part.start), to_epoch_micros(part.end)
        pieces = [(part.width, start, end)] if part.by_bucket else tiles(start, end)
        grouped = _grouped(part)

        def piece(width: str, lo: int, hi: int) -> Select[Any]:
            table = TABLES[width]
            conditions = [table.c.bucket >= from_epoch_micros(lo), table.c.bucket < from_epoch_micros(hi)]
            if part.org_ids is not None:
                conditions.append(table.c.org_id.in_(part.org_ids))
            if part.key_ids is not None:
                conditions.append(table.c.key_id.in_(part.key_ids))
            if part.models is not None:
                conditions.append(table.c.model.in_(part.models))
            # The bucket as an integer (no type conversion) so that the union's pieces agree.
            bucket = literal_column(f"{table.name}.bucket") if part.by_bucket else literal(0)
            picked = [bucket.label("bucket"), *(table.c[c] for c in grouped), *(table.c[m] for m in METRICS)]
            return select(*picked).where(and_(*conditions))

        def rows(name: str) -> Any:
            if len(pieces) == 1:
                return piece(*pieces[0]).subquery(name)
            return union_all(*(piece(*p) for p in pieces)).subquery(name)

        def keys_of(source: Any) -> list[Any]:
            return ([source.c.bucket] if part.by_bucket else []) + [source.c[c] for c in grouped]

        def metric(source: Any, name: str) -> Any:
            if name == "total_tokens":
                return func.sum(sum((source.c[t] for t in TOKENS[1:]), source.c[TOKENS[0]]))
            return func.sum(source.c[name])

        def ties(source: Any) -> list[Any]:
            return ([source.c.bucket.asc()] if part.by_bucket else []) + [source.c[c].asc() for c in grouped]

        def paged(query: Select[Any]) -> Select[Any]:
            query = query if part.limit is None else query.limit(part.limit)
            return query.offset(part.offset) if part.offset else query

        direction = (lambda c: c.desc()) if part.descending else (lambda c: c.asc())
        source = rows("r")
        keys = keys_of(source)
        # As BIGINT: PostgreSQL's SUM of a bigint is a numeric (a Decimal to convert, row by row).
        sums = [cast(func.sum(source.c[m]), BigInteger).label(m) for m in METRICS]
        if part.order_by == "time" and part.by_bucket:
            order = [direction(source.c.bucket), metric(source, part.then_by).desc(), *ties(source)[1:]]
            return paged(select(*keys, *sums).group_by(*keys).order_by(*order))
        ranking = part.then_by if part.order_by == "time" else part.order_by
        if part.limit is None or not part.by_bucket or not keys:
            # Every row; or a range without buckets: a few rows per key and model, read in one go
            # (the second step's join would find a group's rows without the bucket's index).
            order = [direction(metric(source, ranking)), *ties(source)]
            return paged(select(*keys, *sums).group_by(*keys).order_by(*order))
        first = rows("ranked_rows")
        rank = metric(first, ranking).label("rank")
        ranked = paged(
            select(*keys_of(first), rank).group_by(*keys_of(first)).order_by(direction(rank), *ties(first))
        ).subquery("ranked")
        joined = source.join(ranked, and_(*(key == ranked.c[key.name] for key in keys)))
        order = [direction(ranked.c.rank), *ties(source)]
        return select(*keys, *sums).select_from(joined).group_by(*keys, ranked.c.rank).order_by(*order)
