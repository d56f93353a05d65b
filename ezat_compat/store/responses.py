"""Stored responses of the Responses API (docs/responses.md, "Stored responses").

A response created with ``store`` (the default) is kept per organisation for ``[responses]
ttl_days``: ``GET /openai/v1/responses/{id}`` returns it, ``…/input_items`` lists its input,
``DELETE`` removes it, ``previous_response_id`` continues from it (its whole conversation,
then its output, then the new input), and an ``item_reference`` to one of its output items
stands for that item (``outputs``). Another organisation's id, an expired or deleted one are
simply not found. Expired rows are ignored on read and purged in bounded batches on ``put``.

A response keeps only what it adds: its own input and its response object, with the id of the
response it continued (``previous_id``). A continue reads the chain back in one statement
(``CHAIN_SQL``: at most ``MAX_LINKS`` links and ``max_chain_bytes`` of them, else it is refused
before anything is parsed; one more for long inputs kept in parts), so storage grows with what
each turn sends, not with the whole conversation again. Continuing a response keeps the
responses before it as long as it (``RENEW_SQL``: their expiry moves with the newest one's, at
most once per ``RENEW_FRACTION`` of the time to live); deleting one of them ends the chain there
(``BrokenChainError``).

Each response's input is stored with an index (``store/input_index.py``): where each chunk of
items starts in the JSON text and each item's own id, so ``input_page`` reads one page (a
``substr`` of a short input, the part or two of a long one that hold it: ``response_parts``),
whatever the input's length. Rows stored before migration 0007 hold the whole
conversation and no index: they are read whole, as before, until they expire.

Every row counts against its organisation's storage quota (``store/quota.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, TextClause, delete, func, select, text, tuple_
from sqlalchemy.exc import SQLAlchemyError

from ezat_compat.jsonfast import encode_json, loads
from ezat_compat.store.expiry import reading
from ezat_compat.store.hotpath import Execute, Rider
from ezat_compat.store.input_index import InputIndex, stored_input
from ezat_compat.store.quota import CountedStore, add_usage, take_off
from ezat_compat.store.tables import response_parts, responses, to_epoch_micros
from ezat_compat.translate.item_references import item_key

log = logging.getLogger(__name__)

DAY_S = 86400.0
MAX_LINKS = 10_000  # a chain longer than this is not followed (a guard far above any real conversation)
MAX_CHAIN_BYTES = 64 * 1024 * 1024  # the default bound of a conversation read back for a continue
RENEW_FRACTION = 16  # a continue moves its chain's expiry when it is this part of the TTL behind

_COLUMNS = (
    "org_id",
    "response_id",
    "created_at",
    "expires_at",
    "context",
    "input_start",
    "response",
    "encrypted",
    "previous_id",
    "input_count",
    "input_chunks",
    "input_ids",
    "stored_bytes",
)
# The statements of a put, as SQL text for a hot path (SQLite's and PostgreSQL's ON CONFLICT
# alike; times in epoch micros, as the table's UtcMicros columns store them).
INSERT_SQL = (
    f"INSERT INTO responses ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)}) "
    "ON CONFLICT (org_id, response_id) DO NOTHING"
)
SIZE_SQL = "SELECT stored_bytes FROM responses WHERE org_id = :org_id AND response_id = :response_id"
REPLACE_SQL = (
    f"UPDATE responses SET {', '.join(f'{c} = :{c}' for c in _COLUMNS[2:])} "
    "WHERE org_id = :org_id AND response_id = :response_id"
)
# The responses a continue continues (its ``previous_id`` and every one before it): their expiry
# becomes the new response's when it is behind it by more than ``renew_by``.
_WALK = (
    "WITH RECURSIVE chain(response_id, previous_id, depth) AS ("
    " SELECT response_id, previous_id, 0 FROM responses WHERE org_id = :org_id AND response_id = :previous_id"
    " UNION ALL"
    " SELECT r.response_id, r.previous_id, c.depth + 1 FROM responses r JOIN chain c"
    " ON r.org_id = :org_id AND r.response_id = c.previous_id WHERE c.depth < :max_links"
    ") SELECT response_id FROM chain"
)
RENEW_SQL = (
    "UPDATE responses SET expires_at = :expires_at WHERE org_id = :org_id AND expires_at < :renew_before "
    f"AND response_id IN ({_WALK})"
)
# A long input's parts (``store/input_index.py``), each a row of ``response_parts``.
INSERT_PART_SQL = (
    "INSERT INTO response_parts (org_id, response_id, part, text) VALUES (:org_id, :response_id, :part, :text)"
)
DELETE_PARTS_SQL = "DELETE FROM response_parts WHERE org_id = :org_id AND response_id = :response_id"
# A response and every one before it, each with its depth (0: the response asked for) and the
# bytes of the chain up to it: the walk stops past ``max_links`` links or ``max_bytes``, and at a
# link that is missing or expired (the caller then finds no first response).
CHAIN_SQL = text(
    "WITH RECURSIVE chain(response_id, previous_id, input_start, context, response, encrypted, depth, total) AS ("
    " SELECT response_id, previous_id, input_start, context, response, encrypted, 0, stored_bytes FROM responses"
    " WHERE org_id = :org_id AND response_id = :response_id AND expires_at > :now"
    " UNION ALL"
    " SELECT r.response_id, r.previous_id, r.input_start, r.context, r.response, r.encrypted, c.depth + 1,"
    " c.total + r.stored_bytes FROM responses r JOIN chain c ON r.org_id = :org_id AND r.response_id = c.previous_id"
    " WHERE r.expires_at > :now AND c.depth < :max_links AND c.total <= :max_bytes"
    ") SELECT response_id, previous_id, input_start, context, response, encrypted, depth, total FROM chain"
)


RIDE = "response"  # a stored response riding with its ledger row (``Rider.kind``)


def _completed(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with the columns a put made before 0007 lacks (a rider journaled then, replayed
    now): no link, no index, its size counted from its text."""
    if "stored_bytes" in row:
        return dict(row)
    size = len(str(row["context"]).encode()) + len(str(row["response"]).encode())
    return {
        **row,
        "previous_id": None,
        "input_count": None,
        "input_chunks": None,
        "input_ids": None,
        "stored_bytes": size,
    }


def put_tx(execute: Execute, row: Mapping[str, Any]) -> tuple[None, bool]:
    """Keep one stored response (``row`` as ``ResponseStore.put`` makes it for a hot path: plain
    JSON values, so it can wait in the usage journal with its settlement): inserted, or put in
    place of the one of that id; its organisation's totals changed by the difference; a continue's
    chain kept as long as it (``RENEW_SQL``). Written again (a journal replayed twice), the totals
    stay right."""
    row = _completed(row)
    if execute(INSERT_SQL, row).rowcount == 1:
        add_usage(execute, row["org_id"], row["stored_bytes"], 1)
    else:
        old = execute(SIZE_SQL, row).fetchone()
        execute(REPLACE_SQL, row)
        execute(DELETE_PARTS_SQL, row)
        add_usage(execute, row["org_id"], row["stored_bytes"] - int(old[0] if old else 0), 0 if old else 1)
    key = {"org_id": row["org_id"], "response_id": row["response_id"]}
    for n, part in enumerate(row.get("parts") or ()):
        execute(INSERT_PART_SQL, {**key, "part": n, "text": part})
    if row["previous_id"] is not None and "renew_before" in row:
        execute(RENEW_SQL, row)
    return None, True


# ---------------------------------------------------------------- what a read gives


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]  # the response object, sealed reasoning included
    context: list[dict[str, Any]]  # every input item sent to produce it
    input_start: int  # where this request's own input begins in ``context``
    encrypted: bool  # the client asked for reasoning.encrypted_content

    @property
    def input(self) -> list[dict[str, Any]]:
        return self.context[self.input_start :]

    def continuation(self) -> list[dict[str, Any]]:
        """The conversation a ``previous_response_id`` of this response continues."""
        return self.context + list(self.response.get("output") or ())


class ChainError(Exception):
    """A stored response whose conversation can't be read back for a continue."""


class BrokenChainError(ChainError):
    """A response before it in its conversation was deleted or has expired."""


class LongChainError(ChainError):
    """Its conversation is over ``limit`` bytes (``max_chain_bytes``) or ``MAX_LINKS`` responses."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


@dataclass(frozen=True, slots=True)
class InputPage:
    """One page of a response's own input: (n, item) in the order asked (``n`` the item's place
    in that input, from 0), and whether more follow it."""

    items: list[tuple[int, dict[str, Any]]]
    has_more: bool


# ---------------------------------------------------------------- the store


class ResponseStore(CountedStore):
    """The ``responses`` table. With a hot path, ``put``'s writes share the ledger's group
    transactions on SQLite."""

    table = responses
    key = (responses.c.org_id, responses.c.response_id)

    def __init__(self, *args: Any, max_chain_bytes: int = MAX_CHAIN_BYTES, **kwargs: Any) -> None:
        """``CountedStore``'s arguments; ``max_chain_bytes``: the largest conversation a continue
        reads back (larger: ``LongChainError``)."""
        self.max_chain_bytes = max_chain_bytes
        super().__init__(*args, **kwargs)

    def _prepare(self) -> None:
        dialect = self._engine.dialect.name
        if dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"no response store for the {dialect} dialect")
        self._clauses: dict[str, TextClause] = {}

    def _purged(self, conn: Connection, keys: list[tuple[Any, ...]]) -> None:
        """The parts of the responses purged go with them."""
        conn.execute(
            delete(response_parts).where(tuple_(response_parts.c.org_id, response_parts.c.response_id).in_(keys))
        )

    def _clause(self, sql: str) -> TextClause:
        clause = self._clauses.get(sql)
        if clause is None:
            clause = self._clauses[sql] = text(sql)
        return clause

    def put(
        self,
        org_id: int,
        response: dict[str, Any],
        context: list[dict[str, Any]],
        input_start: int,
        encrypted: bool,
        now: float,
        *,
        response_json: bytes | None = None,
        failed: Callable[[BaseException], None] | None = None,
        previous_id: str | None = None,
        pause: Callable[[], None] | None = None,
    ) -> Rider | None:
        """Keep ``response`` (its ``id``) for the organisation until ``now + ttl_s``: ``context``
        its conversation, its own input from ``input_start``; with ``previous_id`` (a continue),
        ``context`` is its own input alone and the rest is ``previous_id``'s chain, which is
        kept as long as this one. ``response_json``: its JSON when the caller has already
        written it; ``pause``: called while a long input is indexed. With ``failed`` and a hot
        path, the write is not made here: it is returned, to ride in another write's
        transaction (``HotPath.write``: the request's ledger row), ``failed`` told if it fails."""
        data = response_json if response_json is not None else encode_json(response)
        kept = stored_input(context, input_start, pause) if pause is not None else stored_input(context, input_start)
        micros = to_epoch_micros(datetime.fromtimestamp(now, UTC))
        expires = to_epoch_micros(datetime.fromtimestamp(now + self.ttl_s, UTC))
        ids_size = len(kept.ids) if kept.ids.isascii() else len(kept.ids.encode())
        row: dict[str, Any] = {
            "org_id": org_id,
            "response_id": response["id"],
            "created_at": micros,
            "expires_at": expires,
            "context": "" if kept.parts else kept.text,  # a long one in ``parts``
            "input_start": input_start,
            "response": data.decode(),
            "encrypted": encrypted,
            "previous_id": previous_id,
            "input_count": kept.count,
            "input_chunks": kept.chunks,
            "input_ids": kept.ids,
            "stored_bytes": kept.size + len(data) + len(kept.chunks) + ids_size,
        }
        if kept.parts:
            row["parts"] = kept.parts
        if previous_id is not None:
            row["renew_before"] = expires - int(self.ttl_s * 1_000_000 / RENEW_FRACTION)
            row["max_links"] = MAX_LINKS
        self._purger.when_due(now)
        hot = self._hot
        if hot is None:
            with self._writer.begin() as conn:
                put_tx(lambda sql, params: conn.execute(self._clause(sql), params), row)
        elif failed is not None:
            return Rider(put_tx, row, failed, RIDE)
        else:
            hot.write(put_tx, row)
        return None

    def _live(self, org_id: int, response_id: str, now: float) -> Any:
        return (
            responses.c.org_id == org_id,
            responses.c.response_id == response_id,
            responses.c.expires_at > datetime.fromtimestamp(now, UTC),
        )

    def get(self, org_id: int, response_id: str, now: float, *, context: bool = True) -> StoredResponse | None:
        """The organisation's response ``response_id``, or None (unknown, expired or another's).
        ``context=False``: the response alone (its ``context`` empty): a retrieve never reads the
        conversation. With it, the whole conversation is read back (``CHAIN_SQL``): a chain with
        a link deleted or expired raises ``BrokenChainError``, one over ``max_chain_bytes`` or
        ``MAX_LINKS`` ``LongChainError``."""
        if not context:
            query = select(responses.c.response, responses.c.encrypted).where(*self._live(org_id, response_id, now))
            try:
                with self._engine.connect() as conn:
                    found = conn.execute(query).first()
            except SQLAlchemyError as exc:
                raise reading(exc) from exc
            return None if found is None else StoredResponse(loads(found.response), [], 0, bool(found.encrypted))
        params = {
            "org_id": org_id,
            "response_id": response_id,
            "now": to_epoch_micros(datetime.fromtimestamp(now, UTC)),
            "max_links": MAX_LINKS,
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
        if int(first.total) > self.max_chain_bytes or (first.previous_id is not None and first.depth >= MAX_LINKS):
            raise LongChainError(self.max_chain_bytes)
        if first.previous_id is not None:
            raise BrokenChainError(response_id)
        texts = self._whole(org_id, [(r.response_id, r.context) for r in rows])
        conversation: list[dict[str, Any]] = []
        for row in rows[:-1]:
            conversation.extend(loads(texts[row.response_id]))
            conversation.extend(loads(row.response).get("output") or ())
        last = rows[-1]
        start = len(conversation) + int(last.input_start)
        conversation.extend(loads(texts[last.response_id]))
        return StoredResponse(loads(last.response), conversation, start, bool(last.encrypted))

    def _whole(self, org_id: int, contexts: list[tuple[str, str]]) -> dict[str, str]:
        """Each response's ``context`` whole, by id: a long one (kept in parts, ``context`` empty)
        put back together from its parts (one statement for all)."""
        texts = dict(contexts)
        parted = [rid for rid, kept in contexts if not kept]
        if not parted:
            return texts
        query = (
            select(response_parts.c.response_id, response_parts.c.text)
            .where(response_parts.c.org_id == org_id, response_parts.c.response_id.in_(parted))
            .order_by(response_parts.c.response_id, response_parts.c.part)
        )
        try:
            with self._engine.connect() as conn:
                found = conn.execute(query).all()
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        pieces: dict[str, list[str]] = {rid: [] for rid in parted}
        for rid, piece in found:
            pieces[rid].append(piece)
        texts.update((rid, "".join(parts)) for rid, parts in pieces.items())
        return texts

    def input_page(
        self,
        org_id: int,
        response_id: str,
        now: float,
        *,
        descending: bool,
        limit: int,
        after: str | None = None,
        before: str | None = None,
    ) -> InputPage | None:
        """One page of the response's own input (``InputIndex.page`` says which), or None when
        the organisation has no such live response. Two reads: its index (with ``after`` /
        ``before``, its items' ids), then the page's items by ``substr``; a row stored before
        0007 is read whole."""
        live = self._live(org_id, response_id, now)
        cursors = after is not None or before is not None
        columns = [responses.c.input_start, responses.c.input_count, responses.c.input_chunks]
        if cursors:
            columns.append(responses.c.input_ids)
        try:
            with self._engine.connect() as conn:
                head = conn.execute(select(*columns).where(*live)).first()
                if head is None:
                    return None
                if head.input_count is None:
                    return self._old_page(conn, live, response_id, descending, limit, after, before)
                index = InputIndex(
                    head.input_chunks,
                    head.input_ids if cursors else "",
                    start=int(head.input_start),
                    count=int(head.input_count),
                    key=item_key(response_id),
                )
                lo, hi, more = index.page(descending=descending, limit=limit, after=after, before=before)
                items: list[dict[str, Any]] = []
                if hi > lo:
                    begin, end, first = index.span(lo, hi)
                    piece = self._piece(conn, live, org_id, response_id, index, begin, end)
                    place = index.start + lo - first
                    items = loads(f"[{piece}]")[place : place + hi - lo]
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        numbered = list(zip(range(lo, hi), items, strict=True))
        return InputPage(numbered[::-1] if descending else numbered, more)

    @staticmethod
    def _piece(
        conn: Connection, live: Any, org_id: int, response_id: str, index: InputIndex, begin: int, end: int
    ) -> str:
        """``text[begin:end]`` of the response's input: a ``substr`` of its ``context``, or the
        parts that hold it."""
        if not index.parted:
            piece: str = conn.execute(
                select(func.substr(responses.c.context, begin + 1, end - begin)).where(*live)
            ).scalar_one()
            return piece
        first, last, at = index.parts_of(begin, end)
        found = conn.execute(
            select(response_parts.c.text)
            .where(
                response_parts.c.org_id == org_id,
                response_parts.c.response_id == response_id,
                response_parts.c.part.between(first, last),
            )
            .order_by(response_parts.c.part)
        ).scalars()
        return "".join(found)[begin - at : end - at]

    @staticmethod
    def _old_page(
        conn: Connection,
        live: Any,
        response_id: str,
        descending: bool,
        limit: int,
        after: str | None,
        before: str | None,
    ) -> InputPage:
        """A page of a row stored before 0007 (no index): its conversation read whole."""
        row = conn.execute(select(responses.c.context, responses.c.input_start).where(*live)).one()
        own = loads(row.context)[int(row.input_start) :]
        kept = stored_input(own, 0)
        index = InputIndex(kept.chunks, kept.ids, start=0, count=len(own), key=item_key(response_id))
        lo, hi, more = index.page(descending=descending, limit=limit, after=after, before=before)
        numbered = list(enumerate(own))[lo:hi]
        return InputPage(numbered[::-1] if descending else numbered, more)

    def outputs(self, org_id: int, response_ids: Sequence[str], now: float) -> dict[str, list[dict[str, Any]]]:
        """The output items of the organisation's live responses among ``response_ids``, by
        response id (one statement; the ids not found are absent). For item references."""
        if not response_ids:
            return {}
        query = select(responses.c.response_id, responses.c.response).where(
            responses.c.org_id == org_id,
            responses.c.response_id.in_(response_ids),
            responses.c.expires_at > datetime.fromtimestamp(now, UTC),
        )
        try:
            with self._engine.connect() as conn:
                rows = conn.execute(query).all()
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        return {row.response_id: list(loads(row.response).get("output") or ()) for row in rows}

    def delete(self, org_id: int, response_id: str, now: float) -> bool:
        """Remove it (its size off the organisation's totals); False when there was none to
        remove (for this organisation). The responses that continued it can't be continued
        any more (``BrokenChainError``)."""
        try:
            with self._writer.begin() as conn:
                gone = conn.execute(
                    delete(responses)
                    .where(*self._live(org_id, response_id, now))
                    .returning(responses.c.org_id, responses.c.stored_bytes)
                ).all()
                if gone:
                    conn.execute(self._clause(DELETE_PARTS_SQL), {"org_id": org_id, "response_id": response_id})
                take_off(conn, gone)
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        return bool(gone)
