"""Reservations name the worker that holds them (and the request's endpoint and model), so the
master releases a dead worker's reservations at once.

Revision ID: 0004
Revises: 0003
Create Date: 2025-07-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("worker", sa.String(160), nullable=True))
        batch.add_column(sa.Column("endpoint", sa.String(32), nullable=True))
        batch.add_column(sa.Column("model", sa.String(200), nullable=True))
        batch.add_column(sa.Column("canonical_model", sa.String(128), nullable=True))
    op.create_index("ix_reservations_worker", "reservations", ["worker"])


def downgrade() -> None:
    op.drop_index("ix_reservations_worker", table_name="reservations")
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("canonical_model")
        batch.drop_column("model")
        batch.drop_column("endpoint")
        batch.drop_column("worker")
