"""Kept thinking blocks: where a reply's ``thinking``/``redacted_thinking`` blocks wait for the
client's next tool round (Chat Completions reference, "Reasoning"; the pure rules are in
``translate/thinking.py``).

One entry per tool call id the client sees, scoped to the organisation, holding the blocks as
JSON text (a signature comes back byte for byte), for ``[gateway] thinking_ttl_s`` seconds.
Two implementations with one interface (``ThinkingStash``), chosen by ``make_thinking_stash``:

- ``DbThinkingStash``: the ``thinking_stash`` table of the gateway's database (SQLite or
  PostgreSQL), so every worker, every node on the same database and the gateway after a restart
  find the blocks. Expired rows are ignored on read; each process deletes at most
  ``purge_batch`` of them per ``purge_every_s`` (on a ``put``).
- ``RedisThinkingStash``: one string per id with an expiry, when ``redis_url`` is set.

It is a cache, so its failures never fail a request: a backend error is logged (at most every
10 s) and ``get`` finds nothing (the caller then sends the request without thinking) or ``put``
keeps nothing. Callers pass ``now`` as wall-clock epoch seconds (``time.time()``): processes and
nodes compare each other's expiry times.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Engine, delete, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from ezat_compat.redis_pool import bounded_client
from ezat_compat.store.db import write_engine
from ezat_compat.store.tables import thinking_stash

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

Blocks = list[dict[str, Any]]

MAX_BLOCKS_CHARS = 8 * 1024 * 1024  # larger sets of blocks are not kept: that round runs without thinking
READ_CHUNK = 500  # ids per query (SQLite's bound-parameter limit is far above)
_WARN_EVERY_S = 10.0


class ThinkingStash(Protocol):
    def put(self, org_id: int, tool_ids: Sequence[str], blocks: Blocks, now: float) -> None:
        """Keep ``blocks`` (a reply's thinking, as received) under each of ``tool_ids`` (the ids
        the client sees for that reply's tool calls) for the organisation, until ``now + ttl_s``.
        A later ``put`` for the same id replaces it."""
        ...

    def get(self, org_id: int, tool_ids: Sequence[str], now: float) -> dict[str, Blocks]:
        """The blocks kept for those of ``tool_ids`` that the organisation put and that haven't
        expired at ``now``; ids not found are absent."""
        ...


def tool_key(tool_id: str) -> str:
    """The stored key of a client tool id: its SHA-256 in hex (ids may be any length)."""
    return hashlib.sha256(tool_id.encode("utf-8", "surrogatepass")).hexdigest()


def encode_blocks(blocks: Blocks) -> str:
    """Blocks as JSON text (ASCII escapes: every string, signatures included, decodes back to
    exactly the value received, on any backend)."""
    return json.dumps(blocks, ensure_ascii=True, separators=(",", ":"))


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class _Warner:
    """Logs a backend failure at most every ``_WARN_EVERY_S`` (real time) per instance."""

    def __init__(self) -> None:
        self._warned_at = -math.inf

    def warn(self, what: str, exc: Exception) -> None:
        at = time.monotonic()
        if not at < self._warned_at + _WARN_EVERY_S:
            self._warned_at = at
            log.warning("thinking stash: %s failed (%s); thinking is not kept or found meanwhile", what, exc)


def _entries(tool_ids: Sequence[str], blocks: Blocks, ttl_s: float) -> tuple[dict[str, str], str] | None:
    """{key: tool id} and the JSON text to keep, or None when there is nothing to keep."""
    if not tool_ids or not blocks or ttl_s <= 0:
        return None
    text = encode_blocks(blocks)
    if len(text) > MAX_BLOCKS_CHARS:
        log.info("thinking stash: %d characters of thinking not kept (over %d)", len(text), MAX_BLOCKS_CHARS)
        return None
    return {tool_key(t): t for t in tool_ids}, text


# ---------------------------------------------------------------- in the database


class DbThinkingStash:
    """The stash in the ``thinking_stash`` table: one upsert transaction per ``put``, one
    query per 500 ids per ``get``. Build one per process, after gunicorn forks (like the
    engine)."""

    def __init__(self, engine: Engine, ttl_s: float, *, purge_every_s: float = 60.0, purge_batch: int = 1000) -> None:
        self._engine = engine
        self._writer = write_engine(engine)
        self._ttl_s = ttl_s
        self._purge_every_s = purge_every_s
        self._purge_batch = purge_batch
        self._next_purge = -math.inf
        self._warner = _Warner()
        dialect = engine.dialect.name
        if dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"no thinking stash for the {dialect} dialect")
        self._insert = sqlite.insert if dialect == "sqlite" else postgresql.insert

    def put(self, org_id: int, tool_ids: Sequence[str], blocks: Blocks, now: float) -> None:
        entries = _entries(tool_ids, blocks, self._ttl_s)
        if entries is None:
            return
        keys, text = entries
        expires_at = datetime.fromtimestamp(now + self._ttl_s, UTC)
        stmt = self._insert(thinking_stash).values(
            [{"org_id": org_id, "tool_key": key, "blocks": text, "expires_at": expires_at} for key in keys]
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[thinking_stash.c.org_id, thinking_stash.c.tool_key],
            set_={"blocks": stmt.excluded.blocks, "expires_at": stmt.excluded.expires_at},
        )
        try:
            with self._writer.begin() as conn:
                conn.execute(stmt)
        except SQLAlchemyError as exc:
            self._warner.warn("put", exc)
            return
        if now >= self._next_purge:
            self._next_purge = now + self._purge_every_s
            self.purge(now)

    def get(self, org_id: int, tool_ids: Sequence[str], now: float) -> dict[str, Blocks]:
        wanted = {tool_key(t): t for t in tool_ids}
        found: dict[str, Blocks] = {}
        if not wanted:
            return found
        moment = datetime.fromtimestamp(now, UTC)
        decoded: dict[str, Blocks] = {}
        try:
            with self._engine.connect() as conn:
                for chunk in _chunks(list(wanted), READ_CHUNK):
                    rows = conn.execute(
                        select(thinking_stash.c.tool_key, thinking_stash.c.blocks).where(
                            thinking_stash.c.org_id == org_id,
                            thinking_stash.c.tool_key.in_(chunk),
                            thinking_stash.c.expires_at > moment,
                        )
                    )
                    for key, text in rows:
                        if text not in decoded:
                            decoded[text] = json.loads(text)
                        found[wanted[key]] = decoded[text]
        except SQLAlchemyError as exc:
            self._warner.warn("get", exc)
            return {}
        return found

    def purge(self, now: float) -> int:
        """Delete up to ``purge_batch`` rows expired at ``now``; returns how many went."""
        expired = (
            select(thinking_stash.c.org_id, thinking_stash.c.tool_key)
            .where(thinking_stash.c.expires_at <= datetime.fromtimestamp(now, UTC))
            .limit(self._purge_batch)
        )
        try:
            with self._writer.begin() as conn:
                gone = conn.execute(
                    delete(thinking_stash).where(
                        tuple_(thinking_stash.c.org_id, thinking_stash.c.tool_key).in_(expired.scalar_subquery())
                    )
                )
        except SQLAlchemyError as exc:
            self._warner.warn("purge", exc)
            return 0
        return int(gone.rowcount or 0)


# ---------------------------------------------------------------- in Redis


class RedisThinkingStash:
    """The stash in Redis: one string per id, ``<prefix><org id>:<tool key>``, holding
    ``<expiry epoch seconds>\\n<blocks JSON>`` with a Redis expiry of ``ttl_s``. ``put`` is one
    pipelined round trip, ``get`` one ``MGET``. For Redis Cluster, put a hash tag in ``prefix``
    (``"{ezat:th}:"``) so one ``MGET`` stays on one slot."""

    def __init__(self, client: redis.Redis, ttl_s: float, *, prefix: str = "ezat:th:") -> None:
        from redis import RedisError  # here: a gateway without Redis never imports it

        self._errors = RedisError
        self._redis = client
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._warner = _Warner()

    def key(self, org_id: int, tool_id: str) -> str:
        """The Redis key of one kept entry."""
        return f"{self._prefix}{org_id}:{tool_key(tool_id)}"

    def put(self, org_id: int, tool_ids: Sequence[str], blocks: Blocks, now: float) -> None:
        entries = _entries(tool_ids, blocks, self._ttl_s)
        if entries is None:
            return
        _, text = entries
        value = f"{now + self._ttl_s!r}\n{text}"
        ttl_ms = max(1, math.ceil(self._ttl_s * 1000))
        try:
            pipe = self._redis.pipeline(transaction=False)
            for tool_id in dict.fromkeys(tool_ids):
                pipe.set(self.key(org_id, tool_id), value, px=ttl_ms)
            pipe.execute()
        except self._errors as exc:
            self._warner.warn("put", exc)

    def get(self, org_id: int, tool_ids: Sequence[str], now: float) -> dict[str, Blocks]:
        ids = list(dict.fromkeys(tool_ids))
        if not ids:
            return {}
        try:
            values = self._redis.mget([self.key(org_id, t) for t in ids])
        except self._errors as exc:
            self._warner.warn("get", exc)
            return {}
        found: dict[str, Blocks] = {}
        decoded: dict[str, Blocks] = {}
        for tool_id, raw in zip(ids, values, strict=True):
            if raw is None:
                continue
            value = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            expiry, _, text = value.partition("\n")
            try:
                if float(expiry) <= now:
                    continue
                if text not in decoded:
                    decoded[text] = json.loads(text)
            except ValueError:  # not ours: treated as absent
                continue
            found[tool_id] = decoded[text]
        return found


# ---------------------------------------------------------------- the factory


def make_thinking_stash(engine: Engine, redis_url: str, ttl_s: float, *, prefix: str = "ezat:th:") -> ThinkingStash:
    """``RedisThinkingStash`` when ``redis_url`` is set, else ``DbThinkingStash`` on ``engine``
    (the gateway's engine, migrated). ``ttl_s`` is ``[gateway] thinking_ttl_s``.

    The Redis client is ``redis_pool.bounded_client``'s: lazy, every wait bounded.
    """
    if not redis_url:
        return DbThinkingStash(engine, ttl_s)
    return RedisThinkingStash(bounded_client(redis_url), ttl_s, prefix=prefix)
