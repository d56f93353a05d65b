"""Per-key rate limits: requests per minute and tokens per minute, with ``limits``.

Both are exact: whichever workers and nodes serve them, a key never gets more than its
budget admitted in one minute.

- rpm: the package's ``FixedWindowRateLimiter``: each key has one counter per window,
  incremented atomically — a key with ``rpm = 10`` hit by 30 parallel requests gets exactly
  10 through.
- tpm: tokens are reserved at admission, as money is — the request's input upper bound plus
  its output limit (``max_tokens``) — by one atomic increment of the key's counter for the
  current minute (windows aligned to the clock: ``tpm/<key>/<minute>``); an increment that
  passes the limit is taken back and the request refused, so the admitted tokens never exceed
  the limit. When the request ends, ``settle_tokens`` moves the counter to the real count
  (failed requests count nothing). A request whose own worst case is over the limit can never
  fit and is refused as too large. (OpenAI counts ``max_tokens`` toward TPM the same way.)

Storage:

- With ``redis_url``: the package's Redis storage, exact across every worker of every node.
- Without: ``SQLiteCounterStorage`` (scheme ``ezat-sqlite://``), counters in a small SQLite
  file of their own (created 0600, ``datafiles``) shared by every gunicorn worker of the
  machine. Each increment is one upsert; increments that arrive together share one
  transaction (``GroupCommit``).

Call ``admit(ctx, tokens)`` after authentication and before any work: it raises
``RateLimitError`` (429, with ``retry_after`` in whole seconds) and returns the ``TokenHold``
to pass to ``settle_tokens(hold, used)`` when the request ends. Keys without ``rpm`` and
``tpm`` cost nothing: no storage round trip at all.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import redis
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.errors import StorageError
from limits.storage import RedisStorage, Storage
from limits.strategies import FixedWindowRateLimiter

from ezat_compat.datafiles import private_file
from ezat_compat.errors import GatewayError, RateLimitError
from ezat_compat.locks import thread_lock
from ezat_compat.store.accounts import AuthContext
from ezat_compat.store.db import enable_wal
from ezat_compat.store.hotpath import Execute, GroupCommit

SCHEME = "ezat-sqlite"
REDIS_TIMEOUT_S = 2.0
SQLITE_BUSY_TIMEOUT_S = 10.0

_UPSERT = """
INSERT INTO counters (key, value, expires_at) VALUES (?1, ?2, ?3)
ON CONFLICT (key) DO UPDATE SET
    value = CASE WHEN counters.expires_at <= ?4 THEN excluded.value ELSE counters.value + excluded.value END,
    expires_at = CASE WHEN counters.expires_at <= ?4 THEN excluded.expires_at ELSE counters.expires_at END
RETURNING value
"""


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
    ((value,),) = execute(_UPSERT, params).fetchall()
    return int(value), True


def _incr_many_tx(execute: Execute, params: list[tuple[str, int, float, float]]) -> tuple[list[int], bool]:
    return [int(execute(_UPSERT, one).fetchall()[0][0]) for one in params], True


def _reset_after_fork(storage: SQLiteCounterStorage) -> None:
    """Have a forked child drop ``storage``'s inherited connection (without keeping it alive)."""
    ref = weakref.ref(storage)

    def after_in_child() -> None:
        alive = ref()
        if alive is not None:
            alive._after_fork()

    os.register_at_fork(after_in_child=after_in_child)


@dataclass(frozen=True, slots=True)
class TokenHold:
    """Tokens reserved for one admitted request in one minute's counter (``RateLimits.admit``)."""

    key: str
    tokens: int


@lru_cache(maxsize=4096)
def _item(kind: str, amount: int, window_s: int) -> RateLimitItem:
    return RateLimitItemPerSecond(amount, window_s, namespace=kind)


class RateLimits:
    """The per-key rpm/tpm limiter of one process. Create it once per process (after the fork).

    ``redis_url`` (or None/"" for the embedded SQLite counters at ``embedded_path``). The
    keyword arguments are test hooks: ``window_s`` shortens the minute, ``clock`` drives the
    embedded storage's windows and the ``retry_after`` arithmetic, ``key_prefix`` namespaces
    the Redis keys.
    """

    def __init__(
        self,
        redis_url: str | None,
        embedded_path: str,
        *,
        window_s: int = 60,
        clock: Callable[[], float] = time.time,
        key_prefix: str = "ezat",
    ) -> None:
        self.redis_url = redis_url or None
        self.embedded_path = embedded_path
        self.window_s = window_s
        self._clock = clock
        self._key_prefix = key_prefix
        self._storage: Storage | None = None
        self._limiter: FixedWindowRateLimiter | None = None
        self._init_lock = threading.Lock()

    @property
    def storage(self) -> Storage | None:
        """The storage, once the first limited key has used it (None before)."""
        return self._storage

    def _get_limiter(self) -> FixedWindowRateLimiter:
        if self._limiter is None:
            with self._init_lock:
                if self._limiter is None:
                    storage: Storage
                    if self.redis_url:
                        storage = RedisStorage(
                            self.redis_url,
                            key_prefix=self._key_prefix,
                            wrap_exceptions=True,
                            socket_timeout=REDIS_TIMEOUT_S,
                            socket_connect_timeout=REDIS_TIMEOUT_S,
                        )
                    else:
                        storage = SQLiteCounterStorage(
                            f"{SCHEME}://{self.embedded_path}", wrap_exceptions=True, clock=self._clock
                        )
                    self._storage = storage
                    self._limiter = FixedWindowRateLimiter(storage)
        return self._limiter

    def count_request(self, ctx: AuthContext) -> None:
        """Count one request against the key's rpm now (429 past it), before work that comes
        ahead of ``admit`` (loading a stored conversation); then call ``admit(…, counted=True)``."""
        if ctx.rpm is None:
            return
        try:
            item = _item("rpm", ctx.rpm, self.window_s)
            if not self._get_limiter().hit(item, str(ctx.key_id)):
                raise self._rpm_refused(ctx, ctx.rpm, item, str(ctx.key_id))
        except StorageError as exc:
            raise GatewayError("The rate-limit store is unreachable; try again shortly.") from exc

    def admit(self, ctx: AuthContext, tokens: int = 0, *, counted: bool = False) -> TokenHold | None:
        """Reserve ``tokens`` of the key's tpm, then count one request against its rpm (unless
        ``counted``: ``count_request`` did).

        Returns the hold to settle when the request ends (None when nothing was reserved).
        Raises ``RateLimitError`` (429) with ``retry_after`` (whole seconds, at least 1) when
        the key's requests or tokens for this minute don't leave room, or when ``tokens`` alone
        exceed the key's tpm (no ``retry_after``: it will never fit); ``GatewayError`` (500)
        when the limit storage can't be reached. A refused request holds nothing. Returns at
        once for unlimited keys.
        """
        rpm = None if counted else ctx.rpm
        if rpm is None and ctx.tpm is None:
            return None
        ident = str(ctx.key_id)
        hold: TokenHold | None = None
        tokens = max(0, tokens)
        try:
            limiter = self._get_limiter()
            embedded = self._storage if isinstance(self._storage, SQLiteCounterStorage) else None
            if embedded is not None and ctx.tpm is not None and rpm is not None and tokens:
                hold = self._reserve_tokens_and_hit(embedded, ctx, ctx.tpm, rpm, tokens, ident)
            else:
                if ctx.tpm is not None:
                    hold = self._reserve_tokens(ctx, ctx.tpm, tokens)
                if rpm is not None:
                    item = _item("rpm", rpm, self.window_s)
                    if not limiter.hit(item, ident):
                        raise self._rpm_refused(ctx, rpm, item, ident)
        except StorageError as exc:
            raise GatewayError("The rate-limit store is unreachable; try again shortly.") from exc
        except RateLimitError:
            if hold is not None:
                self.settle_tokens(hold, 0)
            raise
        return hold

    def _rpm_refused(self, ctx: AuthContext, rpm: int, item: RateLimitItem, ident: str) -> RateLimitError:
        wait = self._retry_after(item, ident)
        return RateLimitError(
            f"Rate limit reached for requests per minute ({rpm}): key {ctx.key_public_id} may send "
            f"{rpm} requests per minute. Try again in {wait} s.",
            retry_after=wait,
        )

    def _reserve_tokens_and_hit(
        self, storage: SQLiteCounterStorage, ctx: AuthContext, tpm: int, rpm: int, tokens: int, ident: str
    ) -> TokenHold:
        """``_reserve_tokens`` then the rpm hit, as one transaction of the embedded counters (the
        same outcomes: refused tokens are taken back and leave no hit; a refused hit counts, as
        the package's fixed window counts it, and its tokens are taken back)."""
        self._too_large(ctx, tpm, tokens)
        key, ends = self._tpm_key(ctx.key_id)
        item = _item("rpm", rpm, self.window_s)
        hit_key = item.key_for(ident)
        used, hits = storage.incr_many([(key, self.window_s, tokens), (hit_key, item.get_expiry(), 1)])
        if used > tpm:
            storage.incr_many([(key, self.window_s, -tokens), (hit_key, item.get_expiry(), -1)])
            raise self._tpm_refused(ctx, tpm, tokens, used, ends)
        if hits > rpm:
            storage.incr(key, self.window_s, amount=-tokens)  # the refused request holds no tokens
            raise self._rpm_refused(ctx, rpm, item, ident)
        return TokenHold(key, tokens)

    def _too_large(self, ctx: AuthContext, tpm: int, tokens: int) -> None:
        if tokens > tpm:
            raise RateLimitError(
                f"Request too large for tokens per minute ({tpm}): key {ctx.key_public_id} may use {tpm} tokens per "
                f"minute and this request may use up to {tokens} (its input plus max_tokens). Reduce max_tokens "
                "or the input."
            )

    def _tpm_refused(self, ctx: AuthContext, tpm: int, tokens: int, used: int, ends: float) -> RateLimitError:
        left = max(0, tpm - (used - tokens))
        state = f"has {left} of its {tpm} tokens left for this minute and this request may use up to {tokens}"
        return self._tpm_error(ctx, tpm, state, ends)

    def _tpm_error(self, ctx: AuthContext, tpm: int, state: str, ends: float) -> RateLimitError:
        wait = max(1, math.ceil(ends - self._clock()))
        return RateLimitError(
            f"Rate limit reached for tokens per minute ({tpm}): key {ctx.key_public_id} {state}. "
            f"Try again in {wait} s.",
            retry_after=wait,
        )

    def _tpm_key(self, key_id: int) -> tuple[str, float]:
        """The storage key of this minute's token counter, and when that minute ends."""
        window = int(self._clock() // self.window_s)
        return f"tpm/{key_id}/{window}", float((window + 1) * self.window_s)

    def _reserve_tokens(self, ctx: AuthContext, tpm: int, tokens: int) -> TokenHold | None:
        storage = self._storage
        assert storage is not None
        self._too_large(ctx, tpm, tokens)
        key, ends = self._tpm_key(ctx.key_id)
        if tokens == 0:  # nothing to reserve (an unbilled request): refused only once the minute is used up
            if storage.get(key) < tpm:
                return None
            raise self._tpm_error(ctx, tpm, f"has used its {tpm} tokens for this minute", ends)
        used = storage.incr(key, self.window_s, amount=tokens)
        if used <= tpm:
            return TokenHold(key, tokens)
        storage.incr(key, self.window_s, amount=-tokens)  # taken back: the refused request holds nothing
        raise self._tpm_refused(ctx, tpm, tokens, used, ends)

    def settle_tokens(self, hold: TokenHold | None, used: int) -> None:
        """Move a request's reservation to the tokens it really used (prompt + completion; 0
        for a failed request). A hold of an earlier minute changes nothing that is still
        counted. No-op for ``None``."""
        if hold is None:
            return
        delta = max(0, used) - hold.tokens
        if delta == 0:
            return
        storage = self._storage
        assert storage is not None
        try:
            storage.incr(hold.key, self.window_s, amount=delta)
        except StorageError as exc:
            raise GatewayError("The rate-limit store is unreachable; try again shortly.") from exc

    def _retry_after(self, item: RateLimitItem, ident: str) -> int:
        assert self._storage is not None
        reset = self._storage.get_expiry(item.key_for(ident))
        return max(1, math.ceil(reset - self._clock()))

    def close(self) -> None:
        """Release the storage's connections (tests, shutdown)."""
        storage = self._storage
        if isinstance(storage, SQLiteCounterStorage):
            storage.close()
        elif isinstance(storage, RedisStorage):
            # ``limits`` types the connection as its protocol of the commands it sends, which has no
            # ``close``; what ``RedisStorage`` builds from a ``redis://`` URL is a ``redis.Redis`` client.
            connection = storage.get_connection()
            if isinstance(connection, redis.Redis):
                connection.close()
