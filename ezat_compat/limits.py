"""Rate limits per key (or per person, all their keys together): requests and tokens per minute,
with ``limits``.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.errors import StorageError
from limits.storage import Storage
from limits.strategies import FixedWindowRateLimiter

from ezat_compat.errors import GatewayError, RateLimitError
from ezat_compat.store.accounts import AuthContext
from ezat_compat.store.counters import SCHEME, Counters, SQLiteCounterStorage

__all__ = ["SCHEME", "RateLimits", "SQLiteCounterStorage", "TokenHold"]


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

    It counts in ``counters`` (the process's store's, ``store.counters.Counters``); without
    them, in counters of its own at ``redis_url`` (or None/"" for the embedded SQLite counters
    at ``embedded_path``). The other keyword arguments are test hooks: ``window_s`` shortens
    the minute, ``clock`` drives the embedded storage's windows and the ``retry_after``
    arithmetic, ``key_prefix`` namespaces the Redis keys.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        embedded_path: str = "",
        *,
        counters: Counters | None = None,
        window_s: int = 60,
        clock: Callable[[], float] = time.time,
        key_prefix: str = "ezat",
    ) -> None:
        self._counters = counters or Counters(redis_url, embedded_path, clock=clock, key_prefix=key_prefix)
        self.redis_url = self._counters.redis_url
        self.embedded_path = self._counters.embedded_path
        self.window_s = window_s
        self._clock = clock
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
                    self._storage = storage = self._counters.storage()
                    self._limiter = FixedWindowRateLimiter(storage)
        return self._limiter

    def count_request(self, ctx: AuthContext) -> None:
        """Count one request against the key's rpm now (429 past it), before work that comes
        ahead of ``admit`` (loading a stored conversation); then call ``admit(…, counted=True)``."""
        if ctx.rpm is None:
            return
        try:
            item = _item("rpm", ctx.rpm, self.window_s)
            if not self._get_limiter().hit(item, ctx.rate_id):
                raise self._rpm_refused(ctx, ctx.rpm, item, ctx.rate_id)
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
        ident = ctx.rate_id
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
            f"Rate limit reached for requests per minute ({rpm}): {ctx.rate_subject} may send "
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
        key, ends = self._tpm_key(ident)
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
                f"Request too large for tokens per minute ({tpm}): {ctx.rate_subject} may use {tpm} tokens per "
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
            f"Rate limit reached for tokens per minute ({tpm}): {ctx.rate_subject} {state}. Try again in {wait} s.",
            retry_after=wait,
        )

    def _tpm_key(self, ident: str) -> tuple[str, float]:
        """The storage key of this minute's token counter of ``ident`` (``AuthContext.rate_id``),
        and when that minute ends."""
        window = int(self._clock() // self.window_s)
        return f"tpm/{ident}/{window}", float((window + 1) * self.window_s)

    def _reserve_tokens(self, ctx: AuthContext, tpm: int, tokens: int) -> TokenHold | None:
        storage = self._storage
        assert storage is not None
        self._too_large(ctx, tpm, tokens)
        key, ends = self._tpm_key(ctx.rate_id)
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
        self._counters.close()
        self._storage = None
        self._limiter = None
