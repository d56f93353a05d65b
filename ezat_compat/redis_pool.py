"""The Redis clients the gateway's shared state uses (cooldowns, the thinking stash), built only
when ``redis_url`` is set: a gateway or command without Redis never imports redis-py (a tenth of
a second of every process's start)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis


def bounded_client(redis_url: str) -> redis.Redis:
    """A client whose every wait is bounded: one-second socket timeouts, one immediate retry
    (redis-py's default is ten, with backoff: seconds per call while Redis is down), a pool of
    at most 64 connections per process that waits at most a second for a free one. Connects
    lazily (nothing happens until the first call), so it is safe to build before gunicorn forks."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = redis.BlockingConnectionPool.from_url(
        redis_url,
        max_connections=64,
        timeout=1.0,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 1),
    )
    return redis.Redis(connection_pool=pool)
