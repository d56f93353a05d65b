"""Engines and schema migration for SQLite (the default) and PostgreSQL (to scale out).

- ``make_engine(url)``: one engine per process. Create it after gunicorn forks (or call
  ``engine.dispose(close=False)`` in the child): pooled connections must not cross a fork.
- ``write_engine(engine)``: the same engine flagged for writing. Run every transaction that
  writes through it: on SQLite its transactions start with ``BEGIN IMMEDIATE``, so writers from
  several processes queue on the busy timeout instead of failing with "database is locked"
  when a read lock is upgraded. Read-only transactions use the plain engine and never block.
- ``migrate(engine_or_url)``: create or upgrade the schema with Alembic; idempotent, and safe
  when several processes start at once.
- Operations (``ezat-compat db …`` and start-up): ``schema_state`` / ``require_current_schema``
  (admin commands never migrate), ``prepare_database`` (``serve``/``demo``: migrate, one-line
  errors), ``upgrade_sql`` (Alembic offline mode), ``backup_sqlite`` (the online backup API).
"""

from __future__ import annotations

import io
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from ezat_compat.datafiles import FILE_MODE, private_file

if TYPE_CHECKING:
    from alembic.config import Config

# This release's migrations (``migrations/versions``), oldest first: what a database's stamp is
# checked against without loading Alembic (a start, an admin command). Alembic is imported only
# to migrate or print SQL; tests/integration/test_store.py holds this equal to its chain.
REVISIONS: tuple[str, ...] = tuple(f"{n:04d}" for n in range(1, 14))
VERSION_TABLE = "alembic_version"  # where Alembic stamps the revision (its default)

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


def _folder(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _sqlite_engine(parsed: URL, pool: dict[str, Any]) -> Engine:
    memory = parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory"
    pool_args = {} if memory else pool
    # 0600 before SQLite opens it (its -wal and -shm take its mode); a missing folder is the
    # operator's mistake, refused when SQLite can't open the file, never created here.
    database = parsed.database
    if not memory and database and not database.startswith("file:") and os.path.isdir(_folder(database)):
        private_file(database)
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
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@contextmanager
def locked_connection(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction that holds the migration lock: on SQLite the
    database's write lock (``BEGIN IMMEDIATE``, waiting up to 2 minutes), on PostgreSQL
    ``pg_advisory_xact_lock``. The transaction commits when the block ends without error."""
    with write_engine(engine).connect() as conn:
        raw: sqlite3.Connection | None = None
        if is_sqlite(engine):
            driver = conn.connection.driver_connection
            assert isinstance(driver, sqlite3.Connection)
            raw = driver
            raw.execute(f"PRAGMA busy_timeout = {MIGRATE_BUSY_TIMEOUT_MS}")
        try:
            with conn.begin():
                if engine.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATE_LOCK})
                yield conn
        finally:
            if raw is not None:
                raw.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")


def migrate(engine_or_url: Engine | str) -> None:
    """Create or upgrade the schema to the newest revision. Call it on start (``serve`` does).

    Idempotent. Processes that call it at once are serialised (``locked_connection``); the
    schema changes and the version stamp commit together, so a migration that fails leaves
    nothing half done. A schema newer than this release knows raises ``SchemaError``.
    """
    engine = make_engine(engine_or_url) if isinstance(engine_or_url, str) else engine_or_url
    try:
        with locked_connection(engine) as conn:
            state = _state_on(conn)
            if not state.known:
                raise SchemaError(state.describe())
            if state.up_to_date:
                return
            from alembic import command

            command.upgrade(alembic_config(conn), "head")
    finally:
        if isinstance(engine_or_url, str):
            engine.dispose()


# ---------------------------------------------------------------- operations (ezat-compat db …)


class SchemaError(Exception):
    """The database's schema can't be used by this command; the message says what to run."""


class DatabaseUnavailable(Exception):
    """The database can't be reached or opened; the message is one line with the cause."""


@dataclass(frozen=True)
class SchemaState:
    """Where a database's schema stands against this release's migrations."""

    current: tuple[str, ...]  # the revisions stamped in the database; () when it has no schema
    head: str  # the newest revision this release knows
    known: bool  # every stamped revision is one this release knows

    @property
    def up_to_date(self) -> bool:
        return self.current == (self.head,)

    def describe(self) -> str:
        """One line for the operator: where the schema stands and what to do."""
        revision = ",".join(self.current) or "none"
        if not self.known:
            return (
                f"the database's schema (revision {revision}) is newer than this release of ezat-compat knows "
                f"(newest: {self.head}): run the release that migrated it, or upgrade ezat-compat"
            )
        if not self.current:
            return "the database has no schema yet: run `ezat-compat db upgrade` (or start `ezat-compat serve`)"
        if not self.up_to_date:
            return (
                f"the database's schema (revision {revision}) is older than this release's ({self.head}): "
                "run `ezat-compat db upgrade`"
            )
        return f"the database's schema is up to date (revision {revision})"


def _state_on(conn: Connection) -> SchemaState:
    current: tuple[str, ...] = ()
    if inspect(conn).has_table(VERSION_TABLE):
        current = tuple(sorted(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()))
    return SchemaState(current=current, head=REVISIONS[-1], known=all(rev in REVISIONS for rev in current))


def describe_url(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(unparsable URL)"


def _unavailable(url: str, exc: BaseException) -> DatabaseUnavailable:
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return DatabaseUnavailable(f"cannot use the database {describe_url(url)}: {first}")


PROBE_TIMEOUT_S = 2  # libpq's connect_timeout counts whole seconds, at least 2


def probe_url(database_url: str) -> str:
    """The database URL with bounded waits for the readiness probe (PostgreSQL: connect and
    statement)."""
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        given = url.query.get("options", "")  # kept: e.g. the URL's own ``-csearch_path=…``
        given = given if isinstance(given, str) else " ".join(given)
        options = f"{given} -c statement_timeout={PROBE_TIMEOUT_S * 1000}".strip()
        url = url.update_query_dict({"connect_timeout": str(PROBE_TIMEOUT_S), "options": options})
    return url.render_as_string(hide_password=False)


def open_engine(url: str) -> Engine:
    """``make_engine(url)`` with one-line errors: an unsupported or unparsable URL raises
    ``DatabaseUnavailable`` (a ``ValueError`` of ``make_engine`` or SQLAlchemy's own)."""
    try:
        return make_engine(url)
    except ValueError as exc:
        raise DatabaseUnavailable(str(exc).splitlines()[0]) from None
    except (ArgumentError, NoSuchModuleError):
        raise DatabaseUnavailable(
            f"unsupported database URL {describe_url(url)!r}: use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        ) from None
    except ImportError as exc:
        raise DatabaseUnavailable(f"{describe_url(url)}: its driver is not installed ({exc.name})") from None


def check_url(url: str) -> None:
    """What ``open_engine`` refuses (an unparsable or unsupported URL, a driver not installed),
    without creating anything: a SQLite file is never made here (``check-config``)."""
    try:
        sqlite = make_url(url).get_backend_name() == "sqlite"
    except (ArgumentError, ValueError):
        sqlite = False  # open_engine says what is wrong with it
    if not sqlite:
        open_engine(url).dispose()  # PostgreSQL's engine connects on first use: nothing is made


def schema_state(engine: Engine) -> SchemaState:
    """Read the stamped revision (a read, no lock). Raises ``DatabaseUnavailable``."""
    try:
        with engine.connect() as conn:
            return _state_on(conn)
    except (DBAPIError, sqlite3.Error) as exc:
        raise _unavailable(engine.url.render_as_string(hide_password=False), exc) from None


def require_current_schema(engine: Engine) -> None:
    """For the admin commands, which never migrate: raise ``SchemaError`` (one line saying
    what to run) unless the schema is exactly this release's."""
    state = schema_state(engine)
    if not state.up_to_date:
        raise SchemaError(state.describe())


def prepare_database(url: str) -> None:
    """Create or migrate the database of ``url`` (``serve`` and ``demo`` on start), with
    one-line errors: ``DatabaseUnavailable`` when it can't be reached or the URL is not
    supported, ``SchemaError`` when its schema is newer than this release knows."""
    engine = open_engine(url)
    try:
        migrate(engine)
    except (DBAPIError, sqlite3.Error) as exc:
        raise _unavailable(url, exc) from None
    finally:
        engine.dispose()


def upgrade_sql(url: str, *, from_revision: str | None = None) -> str:
    """The SQL that brings a database at ``from_revision`` (None: an empty database) to the
    newest revision, in ``url``'s dialect (Alembic's offline mode), for a DBA to apply."""
    from alembic import command

    config = alembic_config()
    buffer = io.StringIO()
    config.output_buffer = buffer
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if from_revision is not None and from_revision not in REVISIONS:
        raise SchemaError(f"--from {from_revision!r}: not a revision of this release (see `ezat-compat db current`)")
    command.upgrade(config, f"{from_revision}:head" if from_revision else "head", sql=True)
    return buffer.getvalue()


def upgrade_sql_start(url: str) -> tuple[str | None, str]:
    """``db upgrade --sql`` without ``--from``: the revision the database of ``url`` is at (None:
    no schema, or it can't be read) and one line saying what the printed SQL will do to it.
    A SQLite file that doesn't exist is not created. ``SchemaError`` when the database's
    schema is newer than this release knows."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and (not parsed.database or not os.path.exists(parsed.database)):
        return None, f"{describe_url(url)} does not exist yet: the SQL below creates the schema on an empty database"
    try:
        engine = open_engine(url)
        try:
            state = schema_state(engine)
        finally:
            engine.dispose()
    except DatabaseUnavailable as exc:
        return None, (
            f"could not read the database's revision ({exc}): the SQL below creates the schema on an empty "
            "database; for an existing one pass --from REVISION (`ezat-compat db current` tells it)"
        )
    if not state.known:
        raise SchemaError(state.describe())
    if not state.current:
        return None, "the database has no schema yet: the SQL below creates it"
    revision = state.current[-1]
    if state.up_to_date:
        return revision, f"the database is at revision {revision}, this release's newest: there is nothing to apply"
    return revision, (
        f"the database is at revision {revision}: the SQL below upgrades it from {revision} to {state.head} "
        "(--from REVISION starts elsewhere)"
    )


def backup_sqlite(url: str, destination: str | os.PathLike[str]) -> int:
    """Copy the live SQLite database of ``url`` to ``destination`` with SQLite's online backup
    API: a consistent snapshot that includes every committed transaction, the WAL's too, while
    the gateway keeps writing (a plain ``cp`` of the file misses what is still in the WAL).
    The copy is made in one step (one read transaction: in WAL mode writers carry on, and no
    write can restart it, as it would a copy made in several steps), written next to
    ``destination`` and renamed into place when complete. Returns the copy's size in bytes.
    Refuses an existing destination. The copy holds key hashes and balances, so it is created
    0600 before SQLite writes a byte to it (whatever the umask), as the database itself is."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        raise SchemaError(
            f"db backup copies SQLite databases; for {describe_url(url)} use the server's own tools "
            "(PostgreSQL: pg_dump --format=custom)"
        )
    source_path = parsed.database
    if not source_path or source_path == ":memory:" or parsed.query.get("mode") == "memory":
        raise SchemaError("db backup: an in-memory database has nothing to copy")
    if not os.path.exists(source_path):
        raise DatabaseUnavailable(f"cannot use the database {describe_url(url)}: no such file")
    target = Path(destination)
    if target.exists():
        raise SchemaError(f"db backup: {target} already exists; choose a new path")
    partial = target.with_name(target.name + ".partial")
    _create_private_partial(partial)
    source = sqlite3.connect(source_path, timeout=SQLITE_BUSY_TIMEOUT_S)
    try:
        copy = sqlite3.connect(partial)
        try:
            source.backup(copy)
            check = copy.execute("PRAGMA integrity_check").fetchone()
            if not check or check[0] != "ok":
                raise DatabaseUnavailable(f"db backup: the copy failed its integrity check: {check}")
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        finally:
            copy.close()
    except sqlite3.Error as exc:
        partial.unlink(missing_ok=True)
        raise DatabaseUnavailable(f"db backup: {exc}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        source.close()
    os.replace(partial, target)
    return target.stat().st_size


def _create_private_partial(partial: Path) -> None:
    """Create the empty file the backup is written into, 0600 from the start (SQLite opens an
    empty file as an empty database and keeps its mode). ``O_EXCL``: a leftover ``.partial``
    (a backup to the same path running, or one killed) is refused, never reused or followed
    through a symlink."""
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    except FileExistsError:
        raise SchemaError(
            f"db backup: {partial} exists (another backup to this path is running, or one was "
            "interrupted); remove it and try again"
        ) from None
    except OSError as exc:
        raise DatabaseUnavailable(f"db backup: cannot create {partial}: {exc.strerror}") from None
    try:
        os.fchmod(fd, FILE_MODE)  # os.open's mode passes through the umask
    finally:
        os.close(fd)
