"""The statements every request runs — authenticate, reserve, settle — on the cheapest path
each database allows, plus the sweep that shares their arithmetic.

Each statement is SQL text written once below, with ``:name`` parameters that both ``sqlite3``
and SQLAlchemy's ``text()`` understand, against the tables of ``store/tables.py`` (times are
epoch micros). The transactions that use them are written once too (``reserve_tx``, ``settle_tx``,
``sweep_tx``), and a hot path runs them on one of two backends:

- ``SQLiteHotPath``: the ``sqlite3`` module on one connection per process (opened again after
  a fork), guarded by a lock. Each call is a few C calls that never yield to gevent, so
  greenlets can't interleave inside a transaction; SQLAlchemy's execution machinery cost four
  times the database work here (bench/RESULTS.md). Writes that arrive together share one
  transaction (group commit, ``SQLiteHotPath.write``): the COMMIT — the WAL pages of the
  org's and key's rows and of the tables' tails — is most of a write's cost.
- ``EngineHotPath``: the same SQL through a SQLAlchemy engine's pool (PostgreSQL: psycopg
  yields on I/O, so one shared connection would not do; and in-memory SQLite).

Nothing here is shared behind the caller's back: the composition root builds one hot path per
engine with ``make_hot_path(engine)``, passes it to ``Accounts`` and ``Ledger``, and closes it
when it disposes of the engine.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy import Engine, TextClause, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import OperationalError as SAOperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from ezat_compat.errors import OverloadedError
from ezat_compat.locks import thread_lock
from ezat_compat.periods import MAX_MICROS
from ezat_compat.procid import after_fork
from ezat_compat.store.db import SQLITE_BUSY_TIMEOUT_S, write_engine

# The key, its organisation and, for a person's key, the person (disabled? their groups and the
# models those allow): one row, one indexed lookup per table.
_AUTH_COLUMNS = (
    "k.id, k.public_id, k.models, k.spend_limit_micros, k.rpm, k.tpm, k.expires_at, k.revoked_at, k.blocked_at, "
    "o.id, o.name, o.suspended, o.models, o.rpm, o.tpm, k.user_id, u.disabled_at, u.models, u.group_ids, u.public_id, "
    "u.rpm, u.tpm, u.group_rpm, u.group_tpm"
)
_AUTH_JOINS = "JOIN orgs o ON o.id = k.org_id LEFT JOIN users u ON u.id = k.user_id"
AUTH_SQL = f"SELECT {_AUTH_COLUMNS} FROM api_keys k {_AUTH_JOINS} WHERE k.key_hash = :key_hash"
# Only when AUTH_SQL finds nothing: a rotated key's previous secret, until its grace window ends.
AUTH_GRACE_SQL = (
    f"SELECT {_AUTH_COLUMNS} FROM api_key_grace g JOIN api_keys k ON k.id = g.key_id {_AUTH_JOINS} "
    "WHERE g.key_hash = :key_hash AND g.expires_at > :now"
)
# A key by its row id (a JWT bearer's person's key: people/bearer.py).
AUTH_BY_ID_SQL = f"SELECT {_AUTH_COLUMNS} FROM api_keys k {_AUTH_JOINS} WHERE k.id = :key_id"
RESERVE_ORG_SQL = (
    "UPDATE orgs SET reserved_micros = reserved_micros + :amount "
    "WHERE id = :org AND balance_micros - reserved_micros >= :amount"
)
RESERVE_KEY_SQL = (
    "UPDATE api_keys SET reserved_micros = reserved_micros + :amount WHERE id = :key "
    "AND (spend_limit_micros IS NULL OR spent_micros + reserved_micros + :amount <= spend_limit_micros)"
)
INSERT_RESERVATION_SQL = (
    "INSERT INTO reservations (request_id, org_id, key_id, amount_micros, created_at, worker, endpoint, model, "
    "canonical_model, spend_holds) VALUES (:request_id, :org, :key, :amount, :created_at, :worker, :endpoint, "
    ":model, :canonical_model, :spend_holds)"
)
# Hold :amount on a spend limit's counter of one period (store/spend.py), creating the period's row,
# only if what it spent and holds plus :amount stays within :cap (no cap: ``NO_CAP``). A row
# changed (rowcount 1) means held. The SELECT's WHERE also settles SQLite's upsert parsing.
RESERVE_SPEND_SQL = (
    "INSERT INTO spend_counters (limit_id, period_start, period_end, spent_micros, reserved_micros) "
    "SELECT :limit_id, :period_start, :period_end, 0, :amount WHERE :amount <= :cap "
    "ON CONFLICT (limit_id, period_start) DO UPDATE SET reserved_micros = spend_counters.reserved_micros + "
    "excluded.reserved_micros WHERE spend_counters.spent_micros + spend_counters.reserved_micros + "
    "excluded.reserved_micros <= :cap"
)
# The reservations of the workers whose tags start with :prefix (store/workers.py), but not :keep's.
WORKER_RESERVATIONS_SQL = (
    "SELECT request_id, org_id, key_id, endpoint, model, canonical_model FROM reservations "
    "WHERE substr(worker, 1, :length) = :prefix AND worker <> :keep ORDER BY org_id, key_id, request_id"
)
RESERVING_WORKERS_SQL = "SELECT DISTINCT worker FROM reservations WHERE substr(worker, 1, :length) = :prefix"
LEDGER_COLUMNS = (
    "request_id",
    "created_at",
    "org_id",
    "key_id",
    "endpoint",
    "model",
    "canonical_model",
    "deployment",
    "input_tokens",
    "cache_write_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_micros",
    "status",
    "estimated",
)
# The person (``user_id``) is the key's, read in the same statement: every way a row is written
# (a settle, a replayed journal, a dead worker's release) names them, and none has to carry it.
INSERT_LEDGER_SQL = (
    f"INSERT INTO ledger ({', '.join(LEDGER_COLUMNS)}, user_id) VALUES ({', '.join(':' + c for c in LEDGER_COLUMNS)}, "
    "(SELECT user_id FROM api_keys WHERE id = :key_id)) "
    "ON CONFLICT (request_id) DO NOTHING"  # inserted: rowcount 1 (a RETURNING clause costs a third more here)
)
TAKE_RESERVATION_SQL = "DELETE FROM reservations WHERE request_id = :request_id RETURNING amount_micros, spend_holds"
TAKE_STALE_RESERVATIONS_SQL = (
    "DELETE FROM reservations WHERE created_at < :cutoff RETURNING org_id, key_id, amount_micros, spend_holds"
)
# Debit ``cost`` and release ``held``: a settle, or (cost 0) the sweep of a stale reservation.
SETTLE_ORG_SQL = (
    "UPDATE orgs SET balance_micros = balance_micros - :cost, reserved_micros = reserved_micros - :held "
    "WHERE id = :org_id"
)
SETTLE_KEY_SQL = (
    "UPDATE api_keys SET spent_micros = spent_micros + :cost, reserved_micros = reserved_micros - :held "
    "WHERE id = :key_id"
)
# The same for one spend-limit period the reservation held on: in the period it was made in.
SETTLE_SPEND_SQL = (
    "UPDATE spend_counters SET spent_micros = spent_micros + :cost, reserved_micros = reserved_micros - :held "
    "WHERE limit_id = :limit_id AND period_start = :period_start"
)
# A settle whose reservation is gone (the six-hour sweep took it): its cost counts in the periods,
# current at :at, of the limits of the gateway, its org, its key, its person and their groups that
# have a row for them.
SETTLE_SPEND_LATE_SQL = (
    "UPDATE spend_counters SET spent_micros = spent_micros + :cost WHERE period_start <= :at AND period_end > :at "
    "AND limit_id IN (SELECT id FROM spend_limits WHERE scope_type = 'gateway' "
    "OR (scope_type = 'org' AND scope_id = :org_id) OR (scope_type = 'key' AND scope_id = :key_id) "
    "OR (scope_type = 'user' AND scope_id = (SELECT user_id FROM api_keys WHERE id = :key_id)) "
    "OR (scope_type = 'group' AND (SELECT ',' || u.group_ids || ',' FROM users u JOIN api_keys k ON k.user_id = u.id "
    "WHERE k.id = :key_id) LIKE '%,' || CAST(scope_id AS VARCHAR(12)) || ',%'))"
)

# What reserve() reports when the money isn't there (nothing is held then); a spend limit's
# refusal is the ``SpendHold`` that couldn't be held.
REFUSED_BY_ORG = "org"
REFUSED_BY_KEY = "key"
NO_CAP = MAX_MICROS  # the cap of a limit whose amount is "no limit": its spend is counted, never refused


@dataclass(frozen=True, slots=True)
class SpendHold:
    """One spend limit's period a reservation holds on (store/spend.py makes them): the limit's
    row id, the period's bounds in epoch micros and the cap (micro-USD; ``NO_CAP``)."""

    limit_id: int
    period_start: int
    period_end: int
    cap: int


def encode_holds(holds: Sequence[SpendHold]) -> str | None:
    """``reservations.spend_holds`` for ``holds``: "limit_id:period_start,…" (None: none)."""
    return ",".join(f"{h.limit_id}:{h.period_start}" for h in holds) if holds else None


def decode_holds(text: str | None) -> list[tuple[int, int]]:
    """The (limit_id, period_start) pairs of ``reservations.spend_holds``."""
    if not text:
        return []
    pairs = []
    for item in text.split(","):
        limit_id, _, start = item.partition(":")
        pairs.append((int(limit_id), int(start)))
    return pairs


T = TypeVar("T")
P = TypeVar("P")

DATABASE_RETRY_AFTER_S = 5


class DatabaseUnavailableError(OverloadedError):
    """The database doesn't answer (down, unreachable, locked beyond the busy timeout, not
    writable): 503 ``overloaded`` with ``retry-after`` for OpenAI clients, 529
    ``overloaded_error`` for Anthropic's. Chat Completions reference, "Errors" (503: no capacity right now)."""

    def __init__(self) -> None:
        super().__init__(
            "The gateway's database is unavailable right now; retry shortly.", retry_after=DATABASE_RETRY_AFTER_S
        )


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database can't be reached or used now (not that a statement
    is wrong): ``sqlite3.OperationalError``, SQLAlchemy's ``OperationalError``, a pool checkout
    timeout, a ``DBAPIError`` that invalidated its connection, psycopg's ``OperationalError``."""
    if isinstance(exc, sqlite3.OperationalError | SAOperationalError | PoolTimeoutError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return type(exc).__name__ == "OperationalError" and type(exc).__module__.startswith("psycopg")


def _unavailable(call: Callable[[], T]) -> T:
    """Run ``call``; the one place where the database's operational errors become
    ``DatabaseUnavailableError`` (other errors pass through unchanged)."""
    try:
        return call()
    except Exception as exc:
        if is_unavailable(exc):
            raise DatabaseUnavailableError() from exc
        raise


class Cursor(Protocol):
    """What both backends' ``execute`` return (``sqlite3.Cursor``, SQLAlchemy's ``CursorResult``)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Sequence[Any]: ...


Execute = Callable[[str, Mapping[str, Any] | Sequence[Any]], Cursor]
# A transaction's body: runs statements through ``execute`` and returns (result, commit?).
Work = Callable[[Execute, P], tuple[T, bool]]


@dataclass(frozen=True, slots=True)
class Rider:
    """A write that rides in another write's transaction, after it (``HotPath.write``): a
    record kept with a ledger row (a stored response) costs one statement, not a transaction
    of its own. Its failure is its own: ``failed`` is told of it and the other write is kept;
    a database that fails fails both."""

    work: Work[Any, Any]
    params: Any
    failed: Callable[[BaseException], None]
    # Names ``work`` in the usage journal (``Ledger.settle_durably``): a rider whose write the
    # database couldn't take waits there with its settlement (``params`` plain JSON then).
    # "" for a rider that is not journaled.
    kind: str = ""


class HotPath(Protocol):
    """Runs the statements above; the transactions below say what to run. Thread-safe. When
    the database can't be reached or used, both raise ``DatabaseUnavailableError``."""

    def read(self, sql: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        """The first row of a read-only statement, or None."""

    def write(self, work: Work[P, T], params: P, rider: Rider | None = None) -> T:
        """Run ``work(execute, params)`` in one write transaction; commit it if ``work`` says so,
        roll it back otherwise or when it raises. A ``rider`` runs after it (its outcome goes
        to ``rider.failed`` only), on SQLite in the same transaction."""

    def close(self) -> None:
        """Release what the hot path opened itself (never the engine: that is the caller's)."""


@dataclass(slots=True, eq=False)
class _Queued:
    """One write waiting for its turn in a group transaction."""

    work: Work[Any, Any]
    params: Any
    done: threading.Event | None = None  # set when the write ran (None for the leader's own)
    result: Any = None
    error: BaseException | None = None


class GroupCommit:
    """Write transactions on one ``sqlite3`` connection, grouped: the writes that arrive
    together share one BEGIN IMMEDIATE … COMMIT (the COMMIT — writing the touched pages to the
    WAL — is most of a small write's cost).

    The first writer becomes the leader, lets the other greenlets that are ready run once
    (``time.sleep(0)``, gevent's cooperative yield once patched) and then runs every write
    queued by then in ONE transaction — so one write's refusal (``commit`` False) or error
    undoes only its own statements: when one declines or fails, the group is undone and run
    again with each write in its own savepoint — and wakes their writers with their results; a
    failing database fails the whole group. A write alone runs exactly as a
    transaction of its own. A writer interrupted while it waits (a timeout, a kill) leaves the
    queue untouched by its write: it was either not taken yet, and is withdrawn, or finished.

    ``connection`` and ``lock`` give this process's connection and the lock that guards it
    (both may be replaced after a fork; a forked child starts with an empty queue).
    """

    def __init__(self, connection: Callable[[], sqlite3.Connection], lock: Callable[[], Any]) -> None:
        self._connection = connection
        self._lock = lock
        self._queue: list[_Queued] = []
        self._queue_lock = thread_lock()  # held for a list operation: never across a switch
        self._leading = False
        after_fork(self, GroupCommit._forked)

    def _forked(self) -> None:
        # In a forked child, before any other thread exists: an empty queue and a lock no
        # parent's thread can hold.
        self._queue, self._queue_lock, self._leading = [], thread_lock(), False

    def run(self, work: Work[P, T], params: P, rider: Rider | None = None) -> T:
        """``work(execute, params)`` in a write transaction (maybe shared); its result, or its
        exception (the database's own errors unchanged). ``rider`` is queued with it, right
        after it: the two are always in one group, so in one transaction."""
        item = _Queued(work, params)
        ridden = _Queued(rider.work, rider.params) if rider is not None else None
        with self._queue_lock:
            lead = not self._leading
            if lead:
                self._leading = True
            else:
                item.done = threading.Event()
            self._queue.append(item)
            if ridden is not None:
                self._queue.append(ridden)  # done with ``item``: taken in the same batch
        try:
            if lead:
                try:
                    time.sleep(0)  # the greenlets that are ready run now; those that write queue up
                except BaseException as exc:
                    self._withdraw(item, ridden, cause=exc)
                    self._lead()
                    raise
                self._lead()
            else:
                assert item.done is not None
                try:
                    item.done.wait()
                except BaseException as exc:
                    self._withdraw(item, ridden, cause=exc)
                    raise
        finally:
            if rider is not None and ridden is not None and ridden.error is not None:
                rider.failed(ridden.error)
        if item.error is not None:
            raise item.error
        result: T = item.result
        return result

    @property
    def queued(self) -> int:
        """How many writes wait (tests)."""
        return len(self._queue)

    def _withdraw(self, item: _Queued, ridden: _Queued | None = None, *, cause: BaseException) -> None:
        """Take back a write not run yet (and its rider: that one fails with ``cause``)."""
        with self._queue_lock:
            if item in self._queue:
                self._queue.remove(item)
            if ridden is not None and ridden in self._queue:
                self._queue.remove(ridden)
                ridden.error = cause

    def _lead(self) -> None:
        """Run the queued writes, group after group, until the queue is empty; then step down."""
        while True:
            with self._queue_lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._leading = False
                    return
            try:
                self._run(batch)
            finally:
                for item in batch:
                    if item.done is not None:
                        item.done.set()

    def _run(self, batch: list[_Queued]) -> None:
        """One transaction for ``batch``; every item ends with a result or an error.

        A group runs first as one plain transaction: the writes almost always all keep their
        work. Only when one declines or fails is that undone whole and the group run again with
        each write in its own savepoint (two statements more a write, paid only then)."""
        with self._lock():
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
            except BaseException as exc:
                for item in batch:
                    item.error = exc
                return
            try:
                if len(batch) == 1:
                    item = batch[0]
                    item.result, commit = item.work(conn.execute, item.params)
                    conn.execute("COMMIT" if commit else "ROLLBACK")
                    return
                if self._run_all(conn, batch):
                    conn.execute("COMMIT")
                    return
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                for item in batch:
                    self._run_one(conn, item)
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                for item in batch:  # nothing of the group was kept
                    item.result, item.error = None, item.error or exc

    @staticmethod
    def _run_all(conn: sqlite3.Connection, batch: list[_Queued]) -> bool:
        """Every write of ``batch`` in the open transaction, without savepoints; False as soon
        as one declines or fails with an error of its own (the caller undoes them all and runs
        them again one savepoint each); the database failing raises."""
        for item in batch:
            try:
                item.result, commit = item.work(conn.execute, item.params)
            except sqlite3.OperationalError:
                raise
            except Exception:
                return False
            if not commit:
                return False
        return True

    @staticmethod
    def _run_one(conn: sqlite3.Connection, item: _Queued) -> None:
        """One write of a group, in a savepoint: kept, or undone alone when it declines or
        fails with an error of its own (a database that fails is the whole group's)."""
        conn.execute("SAVEPOINT group_write")
        try:
            item.result, commit = item.work(conn.execute, item.params)
        except sqlite3.OperationalError:
            raise
        except Exception as exc:
            conn.execute("ROLLBACK TO group_write")
            conn.execute("RELEASE group_write")
            item.error = exc
            return
        if not commit:
            conn.execute("ROLLBACK TO group_write")
        conn.execute("RELEASE group_write")


class SQLiteHotPath:
    """One ``sqlite3`` connection per process (opened again after a fork), one lock around it;
    writes grouped (``GroupCommit``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._inherited: list[sqlite3.Connection] = []  # a parent's, never closed in a forked child
        self._lock = thread_lock()  # held around sqlite3 calls only: never across a switch
        self.group = GroupCommit(self._connection, lambda: self._lock)
        after_fork(self, SQLiteHotPath._forked)

    def _forked(self) -> None:
        # In a forked child: the parent's connection is set aside (closing it could release the
        # parent's locks on the file) and the next use opens the child's own.
        if self._conn is not None:
            self._inherited.append(self._conn)
        self._conn = None
        self._lock = thread_lock()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                self.path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._conn = conn
        return self._conn

    def read(self, sql: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        return _unavailable(lambda: self._read(sql, params))

    def write(self, work: Work[P, T], params: P, rider: Rider | None = None) -> T:
        return _unavailable(lambda: self.group.run(work, params, rider))

    def _read(self, sql: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        with self._lock:
            row: Sequence[Any] | None = self._connection().execute(sql, params).fetchone()
            return row

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None


class EngineHotPath:
    """The same statements through a SQLAlchemy engine (PostgreSQL, in-memory SQLite); writes
    through ``write_engine``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = write_engine(engine)
        self._clauses: dict[str, TextClause] = {}

    def _clause(self, sql: str) -> TextClause:
        clause = self._clauses.get(sql)
        if clause is None:
            clause = self._clauses[sql] = text(sql)
        return clause

    def read(self, sql: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        return _unavailable(lambda: self._read(sql, params))

    def write(self, work: Work[P, T], params: P, rider: Rider | None = None) -> T:
        """``work`` in its transaction; then ``rider`` in one of its own, whatever became of
        ``work`` (a pool's connections are not shared: one transaction can't take both)."""
        if rider is None:
            return _unavailable(lambda: self._write(work, params))
        try:
            result = _unavailable(lambda: self._write(work, params))
        except Exception:
            self._ride(rider)
            raise
        self._ride(rider)
        return result

    def _ride(self, rider: Rider) -> None:
        try:
            _unavailable(lambda: self._write(rider.work, rider.params))
        except Exception as exc:
            rider.failed(exc)

    def _read(self, sql: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        with self._engine.connect() as conn:
            return conn.execute(self._clause(sql), params).first()

    def _write(self, work: Work[P, T], params: P) -> T:
        with self._writer.connect() as conn, conn.begin() as tx:
            result, commit = work(lambda sql, values: conn.execute(self._clause(sql), values), params)
            if not commit:
                tx.rollback()
        return result

    def close(self) -> None:
        """Nothing to release: the engine is the caller's to dispose of."""


def make_hot_path(engine: Engine) -> HotPath:
    """A new hot path for ``engine``: ``sqlite3`` directly for a SQLite file, else the engine.

    Call it once in the composition root, pass the result to both ``Accounts(engine, hot)`` and
    ``Ledger(engine, hot)`` (so one SQLite connection per process), and ``close()`` it next to
    ``engine.dispose()``. Like the engine, build it after gunicorn forks (a forked child leaves
    the SQLite connection it inherited alone and opens its own on first use).
    """
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
        return SQLiteHotPath(database)
    return EngineHotPath(engine)


# ------------------------------------------------------------ the transactions, written once
# Run them with ``hot.write(reserve_tx, params)`` etc.; each returns (result, commit?).


def reserve_tx(execute: Execute, params: Mapping[str, Any]) -> tuple[str | SpendHold | None, bool]:
    """Hold ``amount`` for ``org``/``key`` and on each of ``holds`` (``SpendHold``s, their
    ``encode_holds`` in ``spend_holds``), and record ``request_id`` (``created_at`` in epoch
    micros): None when held, else who refused it (``REFUSED_BY_ORG``/``REFUSED_BY_KEY``, or the
    ``SpendHold`` whose period has no room). Lock order: the org, the key, then the limits'
    counters by (limit, period) — the order of settle and the sweep."""
    if execute(RESERVE_ORG_SQL, params).rowcount != 1:
        return REFUSED_BY_ORG, False
    if execute(RESERVE_KEY_SQL, params).rowcount != 1:
        return REFUSED_BY_KEY, False
    holds: Sequence[SpendHold] = params["holds"]
    if holds:
        amount = params["amount"]
        for hold in holds:
            values = {
                "limit_id": hold.limit_id,
                "period_start": hold.period_start,
                "period_end": hold.period_end,
                "cap": hold.cap,
                "amount": amount,
            }
            if execute(RESERVE_SPEND_SQL, values).rowcount != 1:
                return hold, False
    execute(INSERT_RESERVATION_SQL, params)
    return None, True


def settle_tx(execute: Execute, row: Mapping[str, Any]) -> tuple[bool, bool]:
    """Insert the ledger row (the ``LEDGER_COLUMNS``), take its reservation and debit its
    ``cost_micros``: True; False, changing nothing, if the request was settled before."""
    if execute(INSERT_LEDGER_SQL, row).rowcount != 1:
        return False, False  # settled before: the row exists, nothing else changes
    taken = execute(TAKE_RESERVATION_SQL, row).fetchone()
    params = {
        "cost": row["cost_micros"],
        "held": taken[0] if taken else 0,
        "org_id": row["org_id"],
        "key_id": row["key_id"],
    }
    execute(SETTLE_ORG_SQL, params)
    execute(SETTLE_KEY_SQL, params)
    if taken is None:
        if params["cost"]:  # swept meanwhile: count the cost in the periods current now
            execute(SETTLE_SPEND_LATE_SQL, {**params, "at": row["created_at"]})
    elif taken[1]:
        for limit_id, period_start in sorted(decode_holds(taken[1])):
            execute(SETTLE_SPEND_SQL, {**params, "limit_id": limit_id, "period_start": period_start})
    return True, True


HELD_SQL = "SELECT 1 FROM reservations WHERE request_id = :request_id"


def release_if_held_tx(execute: Execute, row: Mapping[str, Any]) -> tuple[bool, bool]:
    """``settle_tx`` of ``row`` (a failure at no cost) only if its request still holds a
    reservation: for a reserve whose outcome is unknown (the database went away while it
    committed). True when it held one and is settled now; nothing changes otherwise."""
    if execute(HELD_SQL, row).fetchone() is None:
        return False, False
    return settle_tx(execute, row)


def sweep_tx(execute: Execute, cutoff_micros: int) -> tuple[int, bool]:
    """Release the reservations made before ``cutoff_micros`` (epoch); returns how many."""
    taken = execute(TAKE_STALE_RESERVATIONS_SQL, {"cutoff": cutoff_micros}).fetchall()
    by_org: dict[int, int] = defaultdict(int)
    by_key: dict[int, int] = defaultdict(int)
    by_period: dict[tuple[int, int], int] = defaultdict(int)
    for org_id, key_id, amount, holds in taken:
        by_org[org_id] += amount
        by_key[key_id] += amount
        for pair in decode_holds(holds):
            by_period[pair] += amount
    # Lock order: orgs, then keys, then spend counters, each by id (the order of reserve and settle).
    for org_id in sorted(by_org):
        execute(SETTLE_ORG_SQL, {"cost": 0, "held": by_org[org_id], "org_id": org_id})
    for key_id in sorted(by_key):
        execute(SETTLE_KEY_SQL, {"cost": 0, "held": by_key[key_id], "key_id": key_id})
    for (limit_id, period_start), held in sorted(by_period.items()):
        execute(SETTLE_SPEND_SQL, {"cost": 0, "held": held, "limit_id": limit_id, "period_start": period_start})
    return len(taken), True


def release_worker_tx(execute: Execute, params: Mapping[str, Any]) -> tuple[list[str], bool]:
    """Settle every reservation of the workers whose tags start with ``prefix`` (except ``keep``)
    as a gateway failure: a ledger row of ``status`` (``row`` gives its other columns), cost 0,
    the hold released. Returns the request ids settled."""
    prefix = params["prefix"]
    held = execute(WORKER_RESERVATIONS_SQL, {"length": len(prefix), "prefix": prefix, "keep": params["keep"]})
    settled = []
    for request_id, org_id, key_id, endpoint, model, canonical_model in held.fetchall():
        row = {
            **params["row"],
            "request_id": request_id,
            "org_id": org_id,
            "key_id": key_id,
            "endpoint": endpoint or "chat.completions",
            "model": model or "",
            "canonical_model": canonical_model or "",
        }
        if settle_tx(execute, row)[0]:
            settled.append(request_id)
    return settled, True
