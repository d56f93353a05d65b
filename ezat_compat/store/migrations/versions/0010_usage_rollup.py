"""The usage rollup of the admin API's reports: usage_1m, usage_1h, usage_1d (the ledger summed per
bucket, organisation, key and canonical model), usage_rollup (where the fold stands) and
usage_rollup_holes.

The rollup starts empty with nothing folded (``folded_id`` 0): the gateway's fold job
(store/rollup.py) folds the ledger's existing rows in the background after the upgrade, in
batches, as it folds new ones; until it has caught up, a report's ``data_refreshed_at`` says so.

Revision ID: 0010
Revises: 0009
Create Date: 2027-02-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLLUPS = ("usage_1m", "usage_1h", "usage_1d")


def upgrade() -> None:
    for name in _ROLLUPS:
        op.create_table(
            name,
            sa.Column("bucket", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("org_id", sa.Integer(), primary_key=True, autoincrement=False),
            sa.Column("key_id", sa.Integer(), primary_key=True, autoincrement=False),
            sa.Column("model", sa.String(128), primary_key=True),
            sa.Column("requests", sa.BigInteger(), nullable=False),
            sa.Column("input_tokens", sa.BigInteger(), nullable=False),
            sa.Column("cache_write_tokens", sa.BigInteger(), nullable=False),
            sa.Column("cache_read_tokens", sa.BigInteger(), nullable=False),
            sa.Column("output_tokens", sa.BigInteger(), nullable=False),
            sa.Column("cost_micros", sa.BigInteger(), nullable=False),
            sqlite_with_rowid=False,
        )
    state = op.create_table(
        "usage_rollup",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("folded_id", sa.BigInteger(), nullable=False),
        sa.Column("refreshed_at", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "usage_rollup_holes",
        sa.Column("ledger_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("seen_at", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(state, [{"id": 1, "folded_id": 0, "refreshed_at": None}])


def downgrade() -> None:
    op.drop_table("usage_rollup_holes")
    op.drop_table("usage_rollup")
    for name in reversed(_ROLLUPS):
        op.drop_table(name)
