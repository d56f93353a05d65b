"""Message threads of native /v1/messages, held by the gateway: message_threads.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "message_threads",
        sa.Column("org_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("message_id", sa.String(96), primary_key=True),
        sa.Column("previous_id", sa.String(96), nullable=True),
        sa.Column("root_id", sa.String(96), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("fields", sa.Text(), nullable=True),
        sa.Column("messages", sa.Text(), nullable=False),
    )
    op.create_index("ix_message_threads_expires_at", "message_threads", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_message_threads_expires_at", table_name="message_threads")
    op.drop_table("message_threads")
