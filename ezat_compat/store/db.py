"""Engines and schema migration for SQLite (the default) and PostgreSQL (to scale out).

- ``make_engine(url)``: one engine per process. Create it after gunicorn forks (or call
  ``engine.dispose(close=False)`` in the child): pooled connections must not cross a fork.
- ``write_engine(engine)``: the same engine flagged for writing. Run every transaction that
  writes through it: on SQLite its transactions start with ``BEGIN IMMEDIATE``, so writers from
  several processes queue on the busy timeout instead of failing with "database is locked"
  when a read lock is upgraded. Read-only transactions use the plain engine and never block.
- ``migrate(engine_or_url)``: create or upgrade the schema with Alembic; idempotent, and safe
  when several processes start at once.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.engine import URL

SQLITE_BUSY_TIMEOUT_S = 10.0
MIGRATE_BUSY_TIMEOUT_MS = 120_000
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
WRITE_OPTION = "ezat_write"
# pg_advisory_xact_lock key that serialises migrations (any constant shared by every process).
_PG_MIGRATE_LOCK = 0x657A_6174_6D69_6772  # "ezatmigr"


def make_engine(url: str, *, pool_size: int = 10, max_overflow: int = 20) -> Engine:
    """Create the engine for ``url`` (``sqlite:///path.db`` or ``postgresql+psycopg://…``).

    SQLite: WAL journal, ``synchronous=NORMAL``, foreign keys on, a 10 s busy timeout,
    ``check_same_thread`` off, transactions begun by SQLAlchemy (deferred ``BEGIN`` for reads,
    ``BEGIN IMMEDIATE`` through ``write_engine``). PostgreSQL: a pool of ``pool_size``
    (+``max_overflow``) connections with ``pool_pre_ping`` and bounded connect and checkout
    waits; keep workers × (pool_size + max_overflow) under the server's ``max_connections``.
    Dispose of the engine when done.
    """
    parsed = make_url(url)
    pool = {"pool_size": pool_size, "max_overflow": max_overflow, "pool_timeout": 30}
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, pool)
    if parsed.get_backend_name() == "postgresql":
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in parsed.query:
            connect_args["connect_timeout"] = 10
        if "application_name" not in parsed.query:
            connect_args["application_name"] = "ezat-compat"
        return create_engine(parsed, **pool, pool_pre_ping=True, pool_recycle=3600, connect_args=connect_args)
    raise ValueError(
        f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
        "use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
    )


def _sqlite_engine(parsed: URL, pool: dict[str, Any]) -> Engine:
    memory = parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory"
    pool_args = {} if memory else pool
    engine = create_engine(
        parsed, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}, **pool_args
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        # SQLAlchemy, not the sqlite3 module, emits BEGIN (see _on_begin).
        dbapi_connection.isolation_level = None
        enable_wal(dbapi_connection)
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")
        dbapi_connection.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "BEGIN")

    return engine


def enable_wal(conn: sqlite3.Connection, timeout_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
    """Put the database of ``conn`` (autocommit mode) in WAL mode.

    Switching a new file to WAL takes an exclusive lock without waiting on the busy timeout,
    so processes that open a new database at once retry here for up to ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # in-memory databases answer "memory": fine
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def write_engine(engine: Engine) -> Engine:
    """``engine`` flagged for writes: use ``write_engine(engine).begin()`` for every write
    transaction (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: unchanged). Build it once and keep it."""
    return engine.execution_options(**{WRITE_OPTION: True})


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def alembic_config(connection: Connection | None = None) -> Config:
    """The Alembic configuration, built in code (no alembic.ini on disk). With ``connection``,
    the migration environment runs on it, inside its transaction."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def migrate(engine_or_url: Engine | str) -> None:
    """Create or upgrade the schema to the newest revision. Call it on start (``serve`` does).

    Idempotent. Processes that call it at once are serialised: on SQLite by holding the
    database's write lock (``BEGIN IMMEDIATE``, waiting up to 2 minutes) for the whole
    migration, on PostgreSQL by ``pg_advisory_xact_lock``; the schema changes and the version
    stamp commit together, so a migration that fails leaves nothing half done.
    """
    engine = make_engine(engine_or_url) if isinstance(engine_or_url, str) else engine_or_url
    try:
        with write_engine(engine).connect() as conn:
            if is_sqlite(engine):
                raw = conn.connection.driver_connection
                assert isinstance(raw, sqlite3.Connection)
                raw.execute(f"PRAGMA busy_timeout = {MIGRATE_BUSY_TIMEOUT_MS}")
            try:
                with conn.begin():
                    if engine.dialect.name == "postgresql":
                        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATE_LOCK})
                    command.upgrade(alembic_config(conn), "head")
            finally:
                if is_sqlite(engine):
                    raw = conn.connection.driver_connection
                    assert isinstance(raw, sqlite3.Connection)
                    raw.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
    finally:
        if isinstance(engine_or_url, str):
            engine.dispose()
