"""Message threads of native ``/v1/messages`` (beta ``message-threads-2026-08-12``), held by the
gateway (docs/native-messages.md, "Message threads").

A thread's turn sends only its new messages, ``thread: {"type": "continue", "previous_message_id":
"msg_…"}``, and the server keeps the rest. The gateway keeps it, not an upstream deployment: each
turn is a row keyed by its reply's id (per organisation) holding what that turn added, its new
messages and the reply, and the id of the turn it continued; the first turn's row holds the
thread's ``system`` and ``tools`` too. A continuation reads the chain back (one recursive
statement) and goes upstream as the whole request it stands for, to any deployment of the model:
failover, Bedrock, Vertex and Foundry need nothing from the upstream. Rows expire
``[responses] ttl_days`` after they are written; a chain with an expired or missing link is not
found, and the SDKs answer ``thread_not_found`` by resending the whole history under a new thread.
A chain is read back up to ``max_chain_bytes`` and ``MAX_TURNS`` turns (past them:
``LongThreadError``, checked before anything of it is parsed). Every turn counts against its
organisation's storage quota (``store/quota.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from ezat_compat.jsonfast import encode_json, loads
from ezat_compat.store.expiry import reading
from ezat_compat.store.hotpath import Execute, Rider
from ezat_compat.store.quota import CountedStore, add_usage
from ezat_compat.store.tables import message_threads, to_epoch_micros

log = logging.getLogger(__name__)

RIDE = "thread"  # a thread's turn riding with its ledger row (``Rider.kind``)
_COLUMNS = (
    "org_id",
    "message_id",
    "previous_id",
    "root_id",
    "created_at",
    "expires_at",
    "fields",
    "messages",
    "stored_bytes",
)
INSERT_SQL = (
    f"INSERT INTO message_threads ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)}) "
    "ON CONFLICT (org_id, message_id) DO NOTHING"
)
# The turn ``message_id`` and every turn before it (``depth`` 0, 1, …), each with the bytes of the
# chain up to it; the walk stops past ``max_depth`` turns or ``max_bytes``, and at a link that is
# missing or expired (the caller then finds no first turn).
CHAIN_SQL = text(
    "WITH RECURSIVE chain(message_id, previous_id, root_id, fields, messages, depth, total) AS ("
    " SELECT message_id, previous_id, root_id, fields, messages, 0, stored_bytes FROM message_threads"
    " WHERE org_id = :org_id AND message_id = :message_id AND expires_at > :now"
    " UNION ALL"
    " SELECT t.message_id, t.previous_id, t.root_id, t.fields, t.messages, c.depth + 1, c.total + t.stored_bytes"
    " FROM message_threads t JOIN chain c ON t.org_id = :org_id AND t.message_id = c.previous_id"
    " WHERE t.expires_at > :now AND c.depth < :max_depth AND c.total <= :max_bytes"
    ") SELECT previous_id, root_id, fields, messages, depth, total FROM chain"
)
MAX_TURNS = 10_000  # a chain longer than this is not followed (a guard, far above any real thread)
MAX_CHAIN_BYTES = 64 * 1024 * 1024  # the default bound of a thread's history read back for a continue


def put_tx(execute: Execute, row: dict[str, Any]) -> tuple[None, bool]:
    """Insert one turn (``INSERT_SQL``; ``row`` as ``ThreadStore.put`` makes it: plain JSON values,
    so it can wait in the usage journal with its settlement) and count it in its organisation's
    totals. A turn already kept stays as it is, counted once."""
    if "stored_bytes" not in row:  # journaled before 0007
        size = len(str(row["messages"]).encode()) + len(str(row.get("fields") or "").encode())
        row = {**row, "stored_bytes": size}
    if execute(INSERT_SQL, row).rowcount == 1:
        add_usage(execute, row["org_id"], row["stored_bytes"], 1)
    return None, True


class LongThreadError(Exception):
    """A thread whose history is over ``limit`` bytes (``max_chain_bytes``) or ``MAX_TURNS`` turns."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


@dataclass(frozen=True, slots=True)
class StoredThread:
    """A thread as of one of its turns."""

    root_id: str  # the reply id of its first turn (the routing session of every turn)
    fields: dict[str, Any]  # ``system`` and ``tools`` as the first turn gave them (absent: not given)
    messages: list[dict[str, Any]]  # the whole history: every turn's messages, then its reply


class ThreadStore(CountedStore):
    """The ``message_threads`` table. With a hot path, a turn rides with the request's ledger
    row (``put`` returns it)."""

    table = message_threads
    key = (message_threads.c.org_id, message_threads.c.message_id)

    def __init__(self, *args: Any, max_chain_bytes: int = MAX_CHAIN_BYTES, **kwargs: Any) -> None:
        """``CountedStore``'s arguments; ``max_chain_bytes``: the largest history a continue
        reads back (larger: ``LongThreadError``)."""
        self.max_chain_bytes = max_chain_bytes
        super().__init__(*args, **kwargs)

    def put(
        self,
        org_id: int,
        message_id: str,
        *,
        previous_id: str | None,
        root_id: str,
        fields: dict[str, Any] | None,
        messages: list[dict[str, Any]],
        now: float,
        failed: Callable[[BaseException], None],
    ) -> Rider | None:
        """Keep a turn: ``messages`` (its new messages, then its reply) continuing ``previous_id``
        (None: the first turn, with the thread's ``fields``). With a hot path the write is
        returned, to ride with the request's ledger row; else it is made here."""
        kept, kept_fields = encode_json(messages), encode_json(fields) if fields is not None else None
        row: dict[str, Any] = {
            "org_id": org_id,
            "message_id": message_id,
            "previous_id": previous_id,
            "root_id": root_id,
            "created_at": to_epoch_micros(datetime.fromtimestamp(now, UTC)),
            "expires_at": to_epoch_micros(datetime.fromtimestamp(now + self.ttl_s, UTC)),
            "fields": kept_fields.decode() if kept_fields is not None else None,
            "messages": kept.decode(),
            "stored_bytes": len(kept) + (len(kept_fields) if kept_fields is not None else 0),
        }
        self._purger.when_due(now)
        if self._hot is not None:
            return Rider(put_tx, row, failed, RIDE)
        try:
            with self._writer.begin() as conn:
                put_tx(lambda sql, params: conn.execute(text(sql), params), row)
        except SQLAlchemyError as exc:
            failed(exc)
        return None

    def get(self, org_id: int, message_id: str, now: float) -> StoredThread | None:
        """The organisation's thread as of the turn that replied ``message_id``, or None: unknown,
        another organisation's, or a turn of it (that one or an earlier one) expired.
        ``LongThreadError`` when its history is over ``max_chain_bytes`` or ``MAX_TURNS`` turns
        (found before any of it is parsed)."""
        params = {
            "org_id": org_id,
            "message_id": message_id,
            "now": to_epoch_micros(datetime.fromtimestamp(now, UTC)),
            "max_depth": MAX_TURNS,
            "max_bytes": self.max_chain_bytes,
        }
        try:
            with self._engine.connect() as conn:
                rows = sorted(conn.execute(CHAIN_SQL, params).all(), key=lambda r: -int(r.depth))
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        if not rows:
            return None
        first = rows[0]
        if int(first.total) > self.max_chain_bytes or (first.previous_id is not None and first.depth >= MAX_TURNS):
            raise LongThreadError(self.max_chain_bytes)
        if first.previous_id is not None:  # the first turn is not in reach
            return None
        messages: list[dict[str, Any]] = []
        for row in rows:
            messages.extend(loads(row.messages))
        fields = loads(first.fields) if first.fields is not None else {}
        return StoredThread(first.root_id, fields, messages)
