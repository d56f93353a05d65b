"""Reservations: no secondary indexes, and on SQLite a WITHOUT ROWID table keyed by request_id.

Every billed request inserts one reservation and deletes it again, and the table only ever
holds the requests in flight, so the queries that read it by creation time or by worker (the
sweep, a dead worker's release) scan it cheaply, while each index cost a B-tree write on both
the insert and the delete. On SQLite the rowid table with a text primary key was two B-trees
more (the rows and the key's unique index); WITHOUT ROWID keeps the rows in the key's B-tree.
SQLite can't change that in place: the table is rebuilt and every row copied, in the
migration's transaction, so the reservations held during an upgrade survive it. PostgreSQL's
primary key is already the table's one index: there the secondary indexes are only dropped.

Revision ID: 0005
Revises: 0004
Create Date: 2025-08-01
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = "request_id, org_id, key_id, amount_micros, created_at, worker, endpoint, model, canonical_model"
_REBUILT = "_reservations_rebuilt"


def _columns() -> list[sa.Column[Any]]:
    """The columns of reservations as 0001 and 0004 made them."""
    return [
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id", name="fk_reservations_org_id"), nullable=False),
        sa.Column("key_id", sa.Integer(), sa.ForeignKey("api_keys.id", name="fk_reservations_key_id"), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("worker", sa.String(160), nullable=True),
        sa.Column("endpoint", sa.String(32), nullable=True),
        sa.Column("model", sa.String(200), nullable=True),
        sa.Column("canonical_model", sa.String(128), nullable=True),
    ]


def _rebuild_on_sqlite(*, with_rowid: bool) -> None:
    """Copy reservations into a new table of the other shape, then put it in the old one's place
    (what SQLite's documentation prescribes for a change ALTER TABLE can't make). Nothing
    references reservations, so dropping it leaves no foreign key dangling."""
    op.create_table(_REBUILT, *_columns(), sqlite_with_rowid=with_rowid)
    op.execute(f"INSERT INTO {_REBUILT} ({_COLUMNS}) SELECT {_COLUMNS} FROM reservations")
    op.drop_table("reservations")  # its indexes go with it
    op.rename_table(_REBUILT, "reservations")


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        _rebuild_on_sqlite(with_rowid=False)
        return
    op.drop_index("ix_reservations_worker", table_name="reservations")
    op.drop_index("ix_reservations_created_at", table_name="reservations")


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        _rebuild_on_sqlite(with_rowid=True)
    op.create_index("ix_reservations_created_at", "reservations", ["created_at"])
    op.create_index("ix_reservations_worker", "reservations", ["worker"])
