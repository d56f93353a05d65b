"""Readiness (``GET /readyz``) for load balancers, and the drain flag.

Ready means: the database answers, Redis answers (when ``redis_url`` is set), no settlement
waits in the usage journal (``backlog``: the node is not ready until the replay is done), and
the node is not draining. The checks are cheap and bounded (a ``SELECT`` with a 2 s connect timeout, a
Redis ``PING`` with 1 s timeouts), run by one caller at a time and cached for ``cache_s``:
a caller that finds a check running gets the previous result at once, so a probe never hangs
behind a dead database. ``/healthz`` stays liveness (no database).

Draining (``ezat_compat.server.drain.start_draining()``, for the shutdown code) makes it answer 503
from that moment on, while every other route keeps serving.

A failing check also opens an outage in ``Outages`` (logged once, with its cause) and a
passing one closes it; ``outage_of`` tells which dependency an exception of a request is an
outage of, so the request handlers log it there instead of once per request.

A SQLite database file is probed through the worker's own connection (``hot``: the hot path
the gateway's stores share), never through a handle of the probe's own: POSIX locks belong to
the process, so a second handle opened and closed on the file drops the worker's locks, and
the next admin command would delete the WAL the worker still writes into.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limits.errors import StorageError
from sqlalchemy import Engine, exc, make_url, text

from ezat_compat.server.drain import draining
from ezat_compat.server.logs import Outages, describe
from ezat_compat.store.hotpath import HotPath

if TYPE_CHECKING:
    import redis

DB_TIMEOUT_S = 2  # libpq's connect_timeout counts whole seconds, at least 2
REDIS_TIMEOUT_S = 1.0
PROBE_SQL = "SELECT 1 FROM alembic_version LIMIT 1"
OK = "ok"
NOT_CONFIGURED = "not configured"


def outage_of(error: BaseException) -> str | None:
    """``"database"`` or ``"redis"`` when ``error`` (or what caused it) says that store can't
    be reached; None for anything else."""
    seen: BaseException | None = error
    for _ in range(6):
        if seen is None:
            return None
        if isinstance(seen, exc.OperationalError | exc.InterfaceError | exc.DisconnectionError | exc.TimeoutError):
            return "database"
        if isinstance(seen, StorageError) or _redis_unreachable(seen):
            return "redis"
        seen = seen.__cause__ or seen.__context__
    return None


def _redis_unreachable(error: BaseException) -> bool:
    """A redis-py connection error or timeout (none without redis-py loaded: no Redis used)."""
    module = sys.modules.get("redis")
    return module is not None and isinstance(error, module.ConnectionError | module.TimeoutError)


def note_outage(readiness: Readiness, exc: BaseException) -> bool:
    """An outage of the database or Redis is logged once per incident (``Outages``), not per
    request; True when ``exc`` is one."""
    what = outage_of(exc)
    if what is None:
        return False
    if what == "redis" and not readiness.redis_url:
        what = "rate-limit counters"
    readiness.outages.failed(what, exc)
    return True


class Readiness:
    """The checks behind ``/readyz`` for one process. ``hot``: the process's hot path on the
    database (a SQLite file is probed through it); ``backlog``: how many usage journal files
    wait to be replayed (``Ledger.pending``). ``probe_database`` / ``probe_redis``
    replace the real checks in tests (they raise when the store is unreachable)."""

    def __init__(
        self,
        database_url: str,
        redis_url: str,
        outages: Outages,
        *,
        cache_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        probe_database: Callable[[], None] | None = None,
        probe_redis: Callable[[], None] | None = None,
        hot: HotPath | None = None,
        backlog: Callable[[], int] | None = None,
        probe_engine: Callable[[], Engine] | None = None,
    ) -> None:
        self.database_url = database_url
        self._probe_engine = probe_engine  # the store's engine for the probe (``Store.probe_engine``)
        self._hot = hot
        self._backlog = backlog
        self.redis_url = redis_url
        self.outages = outages
        self.cache_s = cache_s
        self.clock = clock
        self._probe_database = probe_database or self._select
        self._probe_redis = probe_redis or (self._ping if redis_url else None)
        self._redis: redis.Redis | None = None
        self._lock = threading.Lock()
        self._result: dict[str, str] | None = None
        self._expires = 0.0

    def status(self) -> tuple[int, dict[str, Any]]:
        """``(200, body)`` when ready, else ``(503, body)``; the body names each check."""
        checks = self.checks()
        drain = draining()
        ready = not drain and all(v in (OK, NOT_CONFIGURED) for v in checks.values())
        body: dict[str, Any] = {"status": "ready" if ready else "not ready", **checks, "draining": drain}
        return (200 if ready else 503), body

    def checks(self) -> dict[str, str]:
        result = self._result
        if result is not None and self.clock() < self._expires:
            return result
        # One check at a time; the others get the last result without waiting for it.
        got = self._lock.acquire(False) if result is not None else self._lock.acquire(timeout=3 * DB_TIMEOUT_S)
        if not got:
            return result or {"database": "unknown: a check is still running", "redis": "unknown"}
        try:
            if self._result is not None and self.clock() < self._expires:
                return self._result
            fresh = {"database": self._check("database", self._probe_database)}
            fresh["redis"] = self._check("redis", self._probe_redis) if self._probe_redis else NOT_CONFIGURED
            if self._backlog is not None:
                fresh["journal"] = self._journal()
            self._result, self._expires = fresh, self.clock() + self.cache_s
            return fresh
        finally:
            self._lock.release()

    def _check(self, what: str, probe: Callable[[], None]) -> str:
        try:
            probe()
        except Exception as error:
            self.outages.failed(what, error)
            return "unreachable: " + describe(error)
        self.outages.recovered(what)
        return OK

    def _journal(self) -> str:
        assert self._backlog is not None
        try:
            waiting = self._backlog()
        except OSError as error:
            return "unreadable: " + describe(error)
        return OK if not waiting else f"replaying: {waiting} file(s) of settlements wait for the database"

    def _select(self) -> None:
        url = make_url(self.database_url)
        path = url.database if url.get_backend_name() == "sqlite" and url.database != ":memory:" else None
        if path and not os.path.exists(path):  # connecting would create an empty file
            raise FileNotFoundError(f"no database file at {os.path.abspath(path)}")
        if path and self._hot is not None:  # the worker's one connection on the file
            self._hot.read(PROBE_SQL, {})
            return
        if self._probe_engine is None:
            raise RuntimeError("no engine to probe the database with")
        with self._probe_engine().connect() as conn:  # PostgreSQL: its own connection, bounded waits
            conn.execute(text(PROBE_SQL)).all()

    def _ping(self) -> None:
        if self._redis is None:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            self._redis = redis.Redis.from_url(
                self.redis_url,
                socket_timeout=REDIS_TIMEOUT_S,
                socket_connect_timeout=REDIS_TIMEOUT_S,
                retry=Retry(NoBackoff(), 0),
            )
        self._redis.ping()

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
