"""Spend limits by period: spend_limits, spend_counters, spend_alerts; reservations.spend_holds.

A reservation made before the upgrade holds on no limit (``spend_holds`` NULL) and settles as
before. The new tables start empty: no limit applies until one is set.

Revision ID: 0009
Revises: 0008
Create Date: 2027-02-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN, also on SQLite's WITHOUT ROWID table (no copy: the held rows stay).
    op.add_column("reservations", sa.Column("spend_holds", sa.String(512), nullable=True))
    op.create_table(
        "spend_limits",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(40), nullable=False, unique=True),
        sa.Column("scope_type", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.Integer(), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=True),
        sa.Column("thresholds", sa.String(64), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ux_spend_limits_scope", "spend_limits", ["scope_type", "scope_id", "period"], unique=True)
    op.create_table(
        "spend_counters",
        sa.Column("limit_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("period_start", sa.BigInteger(), primary_key=True),
        sa.Column("period_end", sa.BigInteger(), nullable=False),
        sa.Column("spent_micros", sa.BigInteger(), nullable=False),
        sa.Column("reserved_micros", sa.BigInteger(), nullable=False),
        sa.Column("exhausted_at", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "spend_alerts",
        sa.Column("limit_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("period_start", sa.BigInteger(), primary_key=True),
        sa.Column("threshold", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("claimed_at", sa.BigInteger(), nullable=False),
        sa.Column("delivered_at", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    # The limits go with their tables; requests in flight keep their holds on the balance only.
    op.drop_table("spend_alerts")
    op.drop_table("spend_counters")
    op.drop_index("ux_spend_limits_scope", table_name="spend_limits")
    op.drop_table("spend_limits")
    op.execute("ALTER TABLE reservations DROP COLUMN spend_holds")  # in place (SQLite 3.35+), as 0008 does
