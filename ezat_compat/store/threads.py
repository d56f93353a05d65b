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
from ezat_compat.store.expiry import ExpiringStore, reading
from ezat_compat.store.hotpath import Execute, Rider
from ezat_compat.store.tables import message_threads, to_epoch_micros

log = logging.getLogger(__name__)

RIDE = "thread"  # a thread's turn riding with its ledger row (``Rider.kind``)
_COLUMNS = ("org_id", "message_id", "previous_id", "root_id", "created_at", "expires_at", "fields", "messages")
INSERT_SQL = (
    f"INSERT INTO message_threads ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)}) "
    "ON CONFLICT (org_id, message_id) DO NOTHING"
)
# The turn ``message_id`` and every turn before it, newest first (``depth`` 0, 1, …); a link that
# is missing or expired ends the chain early, and the caller finds no ``root``.
CHAIN_SQL = text(
    "WITH RECURSIVE chain(message_id, previous_id, root_id, fields, messages, depth) AS ("
    " SELECT message_id, previous_id, root_id, fields, messages, 0 FROM message_threads"
    " WHERE org_id = :org_id AND message_id = :message_id AND expires_at > :now"
    " UNION ALL"
    " SELECT t.message_id, t.previous_id, t.root_id, t.fields, t.messages, c.depth + 1"
    " FROM message_threads t JOIN chain c ON t.org_id = :org_id AND t.message_id = c.previous_id"
    " WHERE t.expires_at > :now AND c.depth < :max_depth"
    ") SELECT message_id, previous_id, root_id, fields, messages FROM chain ORDER BY depth DESC"
)
MAX_TURNS = 10_000  # a chain longer than this is not followed (a guard, far above any real thread)


def put_tx(execute: Execute, row: dict[str, Any]) -> tuple[None, bool]:
    """Insert one turn (``INSERT_SQL``; ``row`` as ``ThreadStore.put`` makes it: plain JSON values,
    so it can wait in the usage journal with its settlement). A turn already kept stays as it is."""
    execute(INSERT_SQL, row)
    return None, True


@dataclass(frozen=True, slots=True)
class StoredThread:
    """A thread as of one of its turns."""

    root_id: str  # the reply id of its first turn (the routing session of every turn)
    fields: dict[str, Any]  # ``system`` and ``tools`` as the first turn gave them (absent: not given)
    messages: list[dict[str, Any]]  # the whole history: every turn's messages, then its reply


class ThreadStore(ExpiringStore):
    """The ``message_threads`` table. With a hot path, a turn rides with the request's ledger
    row (``put`` returns it)."""

    table = message_threads
    key = (message_threads.c.org_id, message_threads.c.message_id)

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
        row: dict[str, Any] = {
            "org_id": org_id,
            "message_id": message_id,
            "previous_id": previous_id,
            "root_id": root_id,
            "created_at": to_epoch_micros(datetime.fromtimestamp(now, UTC)),
            "expires_at": to_epoch_micros(datetime.fromtimestamp(now + self.ttl_s, UTC)),
            "fields": encode_json(fields).decode() if fields is not None else None,
            "messages": encode_json(messages).decode(),
        }
        self._purger.when_due(now)
        if self._hot is not None:
            return Rider(put_tx, row, failed, RIDE)
        try:
            with self._writer.begin() as conn:
                conn.execute(text(INSERT_SQL), row)
        except SQLAlchemyError as exc:
            failed(exc)
        return None

    def get(self, org_id: int, message_id: str, now: float) -> StoredThread | None:
        """The organisation's thread as of the turn that replied ``message_id``, or None: unknown,
        another organisation's, or a turn of it (that one or an earlier one) expired."""
        params = {
            "org_id": org_id,
            "message_id": message_id,
            "now": to_epoch_micros(datetime.fromtimestamp(now, UTC)),
            "max_depth": MAX_TURNS,
        }
        try:
            with self._engine.connect() as conn:
                rows = conn.execute(CHAIN_SQL, params).all()
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        if not rows or rows[0].previous_id is not None:  # the first turn is not in reach
            return None
        first = rows[0]
        messages: list[dict[str, Any]] = []
        for row in rows:
            messages.extend(loads(row.messages))
        fields = loads(first.fields) if first.fields is not None else {}
        return StoredThread(first.root_id, fields, messages)
