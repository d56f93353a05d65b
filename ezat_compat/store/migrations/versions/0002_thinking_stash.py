"""Kept thinking blocks: thinking_stash.

Revision ID: 0002
Revises: 0001
Create Date: 2025-07-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "thinking_stash",
        sa.Column("org_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("tool_key", sa.String(64), primary_key=True),
        sa.Column("blocks", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_thinking_stash_expires_at", "thinking_stash", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_thinking_stash_expires_at", table_name="thinking_stash")
    op.drop_table("thinking_stash")
