"""The rate-limit counters' storage, owned by the process's store (``store.open_store``).

- With ``redis_url``: the ``limits`` package's Redis storage, exact across every worker of
  every node.
- Without: ``SQLiteCounterStorage`` (scheme ``ezat-sqlite://``), counters in a small SQLite
  file of their own (created 0600, ``datafiles``) shared by every gunicorn worker of the
  machine. Each increment is one upsert; increments that arrive together share one
  transaction (``GroupCommit``).

``Counters`` builds the one it is configured for on first use in each process (after the fork)
and closes it; ``limits.RateLimits`` counts with it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from limits.storage import RedisStorage, Storage

from ezat_compat.datafiles import private_file
from ezat_compat.locks import thread_lock
from ezat_compat.store.db import enable_wal
from ezat_compat.store.hotpath import Execute, GroupCommit

SCHEME = "ezat-sqlite"
REDIS_TIMEOUT_S = 2.0
SQLITE_BUSY_TIMEOUT_S = 10.0

# Add to a counter (a new window once the last one is over), then read it back in the same
# transaction, whose write lock no other writer shares: the value a RETURNING clause would give,
# for a third of its cost here (sqlite3 buffers a RETURNING statement's rows in a table of their
# own; bench/RESULTS.md, "The rate limits' counters").
_UPSERT = """
INSERT INTO counters (key, value, expires_at) VALUES (?1, ?2, ?3)
ON CONFLICT (key) DO UPDATE SET
    value = CASE WHEN counters.expires_at <= ?4 THEN excluded.value ELSE counters.value + excluded.value END,
    expires_at = CASE WHEN counters.expires_at <= ?4 THEN excluded.expires_at ELSE counters.expires_at END
"""
_VALUE = "SELECT value FROM counters WHERE key = ?"


class SQLiteCounterStorage(Storage):
    """A ``limits`` storage for fixed windows in a SQLite file, shared by every process that
    opens the same file: ``SQLiteCounterStorage("ezat-sqlite:///var/lib/ezat/limits.db")``.

    Implements what ``FixedWindowRateLimiter`` needs (``incr``, ``get``, ``get_expiry``,
    ``clear``, ``reset``, ``check``). ``clock`` (seconds since
    the epoch) decides when windows expire; tests inject one to skip time.
    Each process opens its own connection on first use; a forked child drops the one it
    inherited. Threads of a process share the connection under a lock.
    """

    STORAGE_SCHEME = [SCHEME]

    def __init__(
        self,
        uri: str,
        wrap_exceptions: bool = False,
        clock: Callable[[], float] = time.time,
        **options: float | str | bool,
    ) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        prefix = f"{SCHEME}://"
        if not uri.startswith(prefix) or len(uri) == len(prefix):
            raise ValueError(f"expected {prefix}/PATH/TO/FILE, got {uri!r}")
        self.path = uri[len(prefix) :]
        self._clock = clock
        self._lock = thread_lock()  # held around sqlite3 calls only: never across a switch
        self._conn: sqlite3.Connection | None = None
        self._inherited: list[sqlite3.Connection] = []  # never closed: a fork's child must not touch them
        self._group = GroupCommit(self._connection, lambda: self._lock)
        _reset_after_fork(self)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return sqlite3.Error

    def _after_fork(self) -> None:
        # Runs in a forked child before any other thread exists: the parent's connection and
        # lock (maybe held by a parent thread at the fork) are left alone.
        if self._conn is not None:
            self._inherited.append(self._conn)
        self._conn = None
        self._lock = thread_lock()

    def _connection(self) -> sqlite3.Connection:
        """This process's connection; call with ``self._lock`` held."""
        if self._conn is None:
            private_file(self.path)  # 0600 before SQLite opens it: its -wal and -shm take its mode
            conn = sqlite3.connect(
                self.path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            try:
                enable_wal(conn)
                conn.execute("PRAGMA synchronous=OFF")  # counters: losing the last writes on power loss is fine
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, value INTEGER NOT NULL,"
                    " expires_at REAL NOT NULL) WITHOUT ROWID"
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        """Add ``amount`` to the key's counter, starting a new window of ``expiry`` seconds if
        the last one is over; returns the new count. Atomic across processes."""
        now = self._clock()
        return self._group.run(_incr_tx, (key, amount, now + expiry, now))

    def incr_many(self, counts: Sequence[tuple[str, int, int]]) -> list[int]:
        """``incr`` for each (key, expiry, amount), all in one transaction: the new counts."""
        now = self._clock()
        return self._group.run(_incr_many_tx, [(key, amount, now + expiry, now) for key, expiry, amount in counts])

    def get(self, key: str) -> int:
        """The key's count in its current window (0 when there is none)."""
        with self._lock:
            row = (
                self._connection()
                .execute("SELECT value FROM counters WHERE key = ? AND expires_at > ?", (key, self._clock()))
                .fetchone()
            )
        return int(row[0]) if row else 0

    def get_expiry(self, key: str) -> float:
        """When the key's current window ends (epoch seconds); now if there is none."""
        now = self._clock()
        with self._lock:
            row = (
                self._connection()
                .execute("SELECT expires_at FROM counters WHERE key = ? AND expires_at > ?", (key, now))
                .fetchone()
            )
        return float(row[0]) if row else now

    def check(self) -> bool:
        try:
            with self._lock:
                self._connection().execute("SELECT 1").fetchone()
        except sqlite3.Error:
            return False
        return True

    def reset(self) -> int | None:
        """Forget every counter; returns how many there were."""
        with self._lock:
            return self._connection().execute("DELETE FROM counters").rowcount

    def clear(self, key: str) -> None:
        with self._lock:
            self._connection().execute("DELETE FROM counters WHERE key = ?", (key,))

    def close(self) -> None:
        """Close this process's connection (it reopens on next use)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None


def _incr_tx(execute: Execute, params: tuple[str, int, float, float]) -> tuple[int, bool]:
    execute(_UPSERT, params)
    ((value,),) = execute(_VALUE, params[:1]).fetchall()
    return int(value), True


def _incr_many_tx(execute: Execute, params: list[tuple[str, int, float, float]]) -> tuple[list[int], bool]:
    return [_incr_tx(execute, one)[0] for one in params], True


def _reset_after_fork(storage: SQLiteCounterStorage) -> None:
    """Have a forked child drop ``storage``'s inherited connection (without keeping it alive)."""
    ref = weakref.ref(storage)

    def after_in_child() -> None:
        alive = ref()
        if alive is not None:
            alive._after_fork()

    os.register_at_fork(after_in_child=after_in_child)


class Counters:
    """The counters' storage of one process: Redis at ``redis_url``, else the SQLite file at
    ``embedded_path``; built on first use (``storage()``), closed by ``close()``. ``clock``
    drives the embedded storage's windows (tests skip time with it); ``key_prefix`` namespaces
    the Redis keys."""

    def __init__(
        self,
        redis_url: str | None,
        embedded_path: str,
        *,
        clock: Callable[[], float] = time.time,
        key_prefix: str = "ezat",
    ) -> None:
        self.redis_url = redis_url or None
        self.embedded_path = embedded_path
        self._clock = clock
        self._key_prefix = key_prefix
        self._storage: Storage | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> Storage | None:
        """The storage, once something has counted with it (None before)."""
        return self._storage

    def storage(self) -> Storage:
        if self._storage is None:
            with self._lock:
                if self._storage is None:
                    if self.redis_url:
                        self._storage = RedisStorage(
                            self.redis_url,
                            key_prefix=self._key_prefix,
                            wrap_exceptions=True,
                            socket_timeout=REDIS_TIMEOUT_S,
                            socket_connect_timeout=REDIS_TIMEOUT_S,
                        )
                    else:
                        self._storage = SQLiteCounterStorage(
                            f"{SCHEME}://{self.embedded_path}", wrap_exceptions=True, clock=self._clock
                        )
        return self._storage

    def close(self) -> None:
        """Release the storage's connections (it is built again on next use)."""
        storage, self._storage = self._storage, None
        if isinstance(storage, SQLiteCounterStorage):
            storage.close()
        elif isinstance(storage, RedisStorage):
            # ``limits`` types the connection as its protocol of the commands it sends, which has no
            # ``close``; what ``RedisStorage`` builds from a ``redis://`` URL is a ``redis.Redis`` client.
            import redis  # only with Redis configured: a gateway without it never imports it

            connection = storage.get_connection()
            if isinstance(connection, redis.Redis):
                connection.close()
