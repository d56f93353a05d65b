"""The statements every request runs — authenticate, reserve, settle — on the cheapest path
each database allows.

SQLite: the ``sqlite3`` module on one connection per process, guarded by a lock. Each call is
a few C calls that never yield to gevent, so greenlets can't interleave inside a transaction;
SQLAlchemy's execution machinery cost four times the database work here (bench/RESULTS.md).
PostgreSQL: the same SQL through the engine's pool (psycopg yields on I/O, so one shared
connection would not do).

The SQL is written once, with ``:name`` parameters that both ``sqlite3`` and SQLAlchemy's
``text()`` understand, against the tables of ``store/tables.py`` (times are epoch micros).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Engine, text

from ezat_compat.store.db import SQLITE_BUSY_TIMEOUT_S, write_engine

AUTH_SQL = (
    "SELECT k.id, k.public_id, k.models, k.spend_limit_micros, k.rpm, k.tpm, k.expires_at, k.revoked_at, "
    "o.id, o.name, o.suspended FROM api_keys k JOIN orgs o ON o.id = k.org_id WHERE k.key_hash = :key_hash"
)
RESERVE_ORG_SQL = (
    "UPDATE orgs SET reserved_micros = reserved_micros + :amount "
    "WHERE id = :org AND balance_micros - reserved_micros >= :amount"
)
RESERVE_KEY_SQL = (
    "UPDATE api_keys SET reserved_micros = reserved_micros + :amount WHERE id = :key "
    "AND (spend_limit_micros IS NULL OR spent_micros + reserved_micros + :amount <= spend_limit_micros)"
)
INSERT_RESERVATION_SQL = (
    "INSERT INTO reservations (request_id, org_id, key_id, amount_micros, created_at) "
    "VALUES (:request_id, :org, :key, :amount, :created_at)"
)
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
INSERT_LEDGER_SQL = (
    f"INSERT INTO ledger ({', '.join(LEDGER_COLUMNS)}) VALUES ({', '.join(':' + c for c in LEDGER_COLUMNS)}) "
    "ON CONFLICT (request_id) DO NOTHING RETURNING id"
)
TAKE_RESERVATION_SQL = "DELETE FROM reservations WHERE request_id = :request_id RETURNING amount_micros"
SETTLE_ORG_SQL = (
    "UPDATE orgs SET balance_micros = balance_micros - :cost, reserved_micros = reserved_micros - :held "
    "WHERE id = :org_id"
)
SETTLE_KEY_SQL = (
    "UPDATE api_keys SET spent_micros = spent_micros + :cost, reserved_micros = reserved_micros - :held "
    "WHERE id = :key_id"
)

# What reserve() reports when the money isn't there (nothing is held then).
REFUSED_BY_ORG = "org"
REFUSED_BY_KEY = "key"


class HotPath(Protocol):
    def auth_row(self, key_hash: str) -> Sequence[Any] | None:
        """The columns of ``AUTH_SQL`` for the key, or None."""

    def reserve(self, params: Mapping[str, Any]) -> str | None:
        """Hold ``amount`` for ``org``/``key``: None when held, else who refused it."""

    def settle(self, row: Mapping[str, Any], cost: int) -> bool:
        """Insert the ledger row and move the money; False if the request was settled before."""


class SQLiteHotPath:
    """One ``sqlite3`` connection per process (created after fork), one lock around it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(
                self.path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def auth_row(self, key_hash: str) -> Sequence[Any] | None:
        with self._lock:
            row: Sequence[Any] | None = self._connection().execute(AUTH_SQL, {"key_hash": key_hash}).fetchone()
            return row

    def reserve(self, params: Mapping[str, Any]) -> str | None:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute(RESERVE_ORG_SQL, params).rowcount != 1:
                    conn.execute("ROLLBACK")
                    return REFUSED_BY_ORG
                if conn.execute(RESERVE_KEY_SQL, params).rowcount != 1:
                    conn.execute("ROLLBACK")
                    return REFUSED_BY_KEY
                conn.execute(INSERT_RESERVATION_SQL, params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return None

    def settle(self, row: Mapping[str, Any], cost: int) -> bool:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute(INSERT_LEDGER_SQL, row).fetchone() is None:
                    conn.execute("ROLLBACK")
                    return False  # settled before: the row exists, nothing else changes
                taken = conn.execute(TAKE_RESERVATION_SQL, row).fetchone()
                params = {
                    "cost": cost,
                    "held": taken[0] if taken else 0,
                    "org_id": row["org_id"],
                    "key_id": row["key_id"],
                }
                conn.execute(SETTLE_ORG_SQL, params)
                conn.execute(SETTLE_KEY_SQL, params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return True


class EngineHotPath:
    """The same statements through a SQLAlchemy engine (PostgreSQL)."""

    _AUTH = text(AUTH_SQL)
    _RESERVE_ORG = text(RESERVE_ORG_SQL)
    _RESERVE_KEY = text(RESERVE_KEY_SQL)
    _INSERT_RESERVATION = text(INSERT_RESERVATION_SQL)
    _INSERT_LEDGER = text(INSERT_LEDGER_SQL)
    _TAKE_RESERVATION = text(TAKE_RESERVATION_SQL)
    _SETTLE_ORG = text(SETTLE_ORG_SQL)
    _SETTLE_KEY = text(SETTLE_KEY_SQL)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = write_engine(engine)

    def auth_row(self, key_hash: str) -> Sequence[Any] | None:
        with self._engine.connect() as conn:
            return conn.execute(self._AUTH, {"key_hash": key_hash}).first()

    def reserve(self, params: Mapping[str, Any]) -> str | None:
        with self._writer.connect() as conn, conn.begin() as tx:
            if conn.execute(self._RESERVE_ORG, params).rowcount != 1:
                tx.rollback()
                return REFUSED_BY_ORG
            if conn.execute(self._RESERVE_KEY, params).rowcount != 1:
                tx.rollback()
                return REFUSED_BY_KEY
            conn.execute(self._INSERT_RESERVATION, params)
        return None

    def settle(self, row: Mapping[str, Any], cost: int) -> bool:
        with self._writer.begin() as conn:
            if conn.execute(self._INSERT_LEDGER, row).first() is None:
                return False
            held = conn.execute(self._TAKE_RESERVATION, row).scalar() or 0
            params = {"cost": cost, "held": held, "org_id": row["org_id"], "key_id": row["key_id"]}
            conn.execute(self._SETTLE_ORG, params)
            conn.execute(self._SETTLE_KEY, params)
        return True


_HOT_PATHS: weakref.WeakKeyDictionary[Engine, HotPath] = weakref.WeakKeyDictionary()
_HOT_PATHS_LOCK = threading.Lock()


def make_hot_path(engine: Engine) -> HotPath:
    """The engine's hot path, one per engine (``Accounts`` and ``Ledger`` share it, and so one
    SQLite connection per process): ``SQLiteHotPath`` for a file database, else ``EngineHotPath``."""
    with _HOT_PATHS_LOCK:
        hot = _HOT_PATHS.get(engine)
        if hot is None:
            database = engine.url.database
            if (
                engine.dialect.name == "sqlite"
                and database
                and database != ":memory:"
                and not database.startswith("file:")
            ):
                hot = SQLiteHotPath(database)
            else:
                hot = EngineHotPath(engine)
            _HOT_PATHS[engine] = hot
        return hot
