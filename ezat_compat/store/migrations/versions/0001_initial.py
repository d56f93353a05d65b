"""The initial schema: orgs, api_keys, reservations, ledger.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite autoincrements only an INTEGER PRIMARY KEY.
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "orgs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("balance_micros", sa.BigInteger(), nullable=False),
        sa.Column("reserved_micros", sa.BigInteger(), nullable=False),
        sa.Column("suspended", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("name", name="uq_orgs_name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(32), nullable=False),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id", name="fk_api_keys_org_id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("models", sa.String(2048), nullable=False),
        sa.Column("spend_limit_micros", sa.BigInteger(), nullable=True),
        sa.Column("spent_micros", sa.BigInteger(), nullable=False),
        sa.Column("reserved_micros", sa.BigInteger(), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.UniqueConstraint("public_id", name="uq_api_keys_public_id"),
    )
    op.create_index("ix_api_keys_key_hash", "api_keys", ["key_hash"], unique=True)
    op.create_index("ix_api_keys_org_id", "api_keys", ["org_id"])
    op.create_table(
        "reservations",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id", name="fk_reservations_org_id"), nullable=False),
        sa.Column("key_id", sa.Integer(), sa.ForeignKey("api_keys.id", name="fk_reservations_key_id"), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_reservations_created_at", "reservations", ["created_at"])
    op.create_table(
        "ledger",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id", name="fk_ledger_org_id"), nullable=False),
        sa.Column("key_id", sa.Integer(), sa.ForeignKey("api_keys.id", name="fk_ledger_key_id"), nullable=False),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("canonical_model", sa.String(128), nullable=False),
        sa.Column("deployment", sa.String(128), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_write_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_read_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("reasoning_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("estimated", sa.Boolean(), nullable=False),
    )
    op.create_index("ux_ledger_request_id", "ledger", ["request_id"], unique=True)
    op.create_index("ix_ledger_org_created", "ledger", ["org_id", "created_at"])
    op.create_index("ix_ledger_key_created", "ledger", ["key_id", "created_at"])


def downgrade() -> None:
    op.drop_table("ledger")
    op.drop_table("reservations")
    op.drop_table("api_keys")
    op.drop_table("orgs")
