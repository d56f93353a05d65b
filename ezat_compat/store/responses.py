"""Stored responses of the Responses API (docs/responses.md, "Stored responses").

A response created with ``store`` (the default) is kept per organisation for ``[responses]
ttl_days``: ``GET /openai/v1/responses/{id}`` returns it, ``…/input_items`` lists its input,
``DELETE`` removes it, ``previous_response_id`` continues from it (its whole conversation,
then its output, then the new input), and an ``item_reference`` to one of its output items
stands for that item (``outputs``). Another organisation's id, an expired or deleted one are
simply not found. Expired rows are ignored on read and purged in bounded batches on ``put``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from ezat_compat.jsonfast import encode_json, loads
from ezat_compat.store.expiry import ExpiringStore, reading
from ezat_compat.store.hotpath import Execute, Rider
from ezat_compat.store.tables import responses, to_epoch_micros

log = logging.getLogger(__name__)

DAY_S = 86400.0
_COLUMNS = ("org_id", "response_id", "created_at", "expires_at", "context", "input_start", "response", "encrypted")
# The same upsert as SQL text, for a hot path (SQLite's and PostgreSQL's ON CONFLICT alike; times
# in epoch micros, as the table's UtcMicros columns store them).
UPSERT_SQL = (
    f"INSERT INTO responses ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)}) "
    f"ON CONFLICT (org_id, response_id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in _COLUMNS[2:])}"
)


RIDE = "response"  # a stored response riding with its ledger row (``Rider.kind``)


def put_tx(execute: Execute, row: dict[str, Any]) -> tuple[None, bool]:
    """Upsert one stored response (``UPSERT_SQL``; ``row`` as ``ResponseStore.put`` makes it for
    a hot path: plain JSON values, so it can wait in the usage journal with its settlement)."""
    execute(UPSERT_SQL, row)
    return None, True


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


def _dump(value: Any) -> str:
    """Compact JSON text (UTF-8 when stored; a lone surrogate escaped, so any text can be kept)."""
    return encode_json(value).decode()


class ResponseStore(ExpiringStore):
    """The ``responses`` table. With a hot path, ``put``'s writes share the ledger's group
    transactions on SQLite."""

    table = responses
    key = (responses.c.org_id, responses.c.response_id)

    def _prepare(self) -> None:
        """The upsert ``put`` runs, in the engine's dialect."""
        dialect = self._engine.dialect.name
        if dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"no response store for the {dialect} dialect")
        insert = sqlite.insert if dialect == "sqlite" else postgresql.insert
        upsert = insert(responses).values({name: bindparam(name) for name in _COLUMNS})
        self._upsert = upsert.on_conflict_do_update(
            index_elements=list(self.key),
            set_={name: upsert.excluded[name] for name in _COLUMNS[2:]},
        )  # built once: each put runs it with the row's values

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
    ) -> Rider | None:
        """Keep ``response`` (its ``id``) for the organisation until ``now + ttl_s``.
        ``response_json``: its JSON when the caller has already written it. With ``failed`` and a
        hot path, the write is not made here: it is returned, to ride in another write's
        transaction (``HotPath.write``: the request's ledger row), ``failed`` told if it fails."""
        hot = self._hot
        created, expires = datetime.fromtimestamp(now, UTC), datetime.fromtimestamp(now + self.ttl_s, UTC)
        row: dict[str, Any] = {
            "org_id": org_id,
            "response_id": response["id"],
            # the hot path's SQL takes the UtcMicros columns' stored form; the engine converts
            "created_at": to_epoch_micros(created) if hot is not None else created,
            "expires_at": to_epoch_micros(expires) if hot is not None else expires,
            "context": _dump(context),
            "input_start": input_start,
            "response": response_json.decode() if response_json is not None else _dump(response),
            "encrypted": encrypted,
        }
        self._purger.when_due(now)
        if hot is None:
            with self._writer.begin() as conn:
                conn.execute(self._upsert, row)
        elif failed is not None:
            return Rider(put_tx, row, failed, RIDE)
        else:
            hot.write(put_tx, row)
        return None

    def get(self, org_id: int, response_id: str, now: float, *, context: bool = True) -> StoredResponse | None:
        """The organisation's response ``response_id``, or None (unknown, expired or another's).
        ``context=False``: the response alone (its ``context`` empty): a retrieve never reads the
        conversation, which may be tens of megabytes."""
        columns = [responses.c.input_start, responses.c.response, responses.c.encrypted]
        query = select(*columns, responses.c.context) if context else select(*columns)
        try:
            with self._engine.connect() as conn:
                row = conn.execute(
                    query.where(
                        responses.c.org_id == org_id,
                        responses.c.response_id == response_id,
                        responses.c.expires_at > datetime.fromtimestamp(now, UTC),
                    )
                ).first()
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        if row is None:
            return None
        kept = loads(row.context) if context else []
        return StoredResponse(loads(row.response), kept, int(row.input_start) if context else 0, bool(row.encrypted))

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
        """Remove it; False when there was none to remove (for this organisation)."""
        try:
            with self._writer.begin() as conn:
                gone = conn.execute(
                    delete(responses).where(
                        responses.c.org_id == org_id,
                        responses.c.response_id == response_id,
                        responses.c.expires_at > datetime.fromtimestamp(now, UTC),
                    )
                )
        except SQLAlchemyError as exc:
            raise reading(exc) from exc
        return bool(gone.rowcount)
