"""The web console: console_sessions (server-side sessions, the cookie's secret kept as its
hash), console_links (break-glass links, used once) and console_logins (sign-ins under way at the
identity provider).

Revision ID: 0011
Revises: 0010
Create Date: 2027-03-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(40), nullable=False, unique=True),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("email", sa.String(320), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("org_ids", sa.String(1024), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("address", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_console_sessions_secret_hash", "console_sessions", ["secret_hash"], unique=True)
    op.create_index("ix_console_sessions_last_seen_at", "console_sessions", ["last_seen_at"])
    op.create_table(
        "console_links",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(40), nullable=False, unique=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(160), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("used_at", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_console_links_token_hash", "console_links", ["token_hash"], unique=True)
    op.create_table(
        "console_logins",
        sa.Column("state_hash", sa.String(64), primary_key=True),
        sa.Column("binding_hash", sa.String(64), nullable=False),
        sa.Column("nonce", sa.String(128), nullable=False),
        sa.Column("code_verifier", sa.String(128), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_console_logins_expires_at", "console_logins", ["expires_at"])


def downgrade() -> None:
    op.drop_table("console_logins")
    op.drop_table("console_links")
    op.drop_table("console_sessions")
