"""Stored responses of the Responses API: responses.

Revision ID: 0003
Revises: 0002
Create Date: 2025-07-15
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("org_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("response_id", sa.String(96), primary_key=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("context", sa.Text(), nullable=False),
        sa.Column("input_start", sa.Integer(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("encrypted", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_responses_expires_at", "responses", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_expires_at", table_name="responses")
    op.drop_table("responses")
