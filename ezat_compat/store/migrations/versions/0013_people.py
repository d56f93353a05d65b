"""People: users (created at their first sign-in from the IdP's claims), idp_groups (the IdP's
groups the gateway maps to an organisation, models and per-person caps), device_grants (RFC 8628
sign-ins under way), user_sessions (command-line sign-ins: rotated refresh tokens), the person of
a key (api_keys.user_id) and of a ledger row (ledger.user_id).

Adding the two nullable columns changes no existing row (SQLite and PostgreSQL add them without
rewriting the table).

Revision ID: 0013
Revises: 0012
Create Date: 2027-03-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(40), nullable=False, unique=True),
        sa.Column("subject", sa.String(255), nullable=False, unique=True),
        sa.Column("email", sa.String(320), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("idp_groups", sa.Text(), nullable=False),
        sa.Column("group_ids", sa.String(1024), nullable=False),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id", name="fk_users_org_id"), nullable=True),
        sa.Column("models", sa.String(2048), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("last_sign_in_at", sa.BigInteger(), nullable=True),
        sa.Column("disabled_at", sa.BigInteger(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("group_rpm", sa.Integer(), nullable=True),
        sa.Column("group_tpm", sa.Integer(), nullable=True),
    )
    op.create_table(
        "idp_groups",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(40), nullable=False, unique=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id", name="fk_idp_groups_org_id"), nullable=True),
        sa.Column("models", sa.String(2048), nullable=False),
        sa.Column("daily_micros", sa.BigInteger(), nullable=True),
        sa.Column("weekly_micros", sa.BigInteger(), nullable=True),
        sa.Column("monthly_micros", sa.BigInteger(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "device_grants",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("user_code", sa.String(16), nullable=False),
        sa.Column("client_id", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", name="fk_device_grants_user_id"), nullable=True),
        sa.Column("idp_refresh", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("interval_s", sa.Integer(), nullable=False),
        sa.Column("polled_at", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_device_grants_user_code", "device_grants", ["user_code"])
    op.create_index("ix_device_grants_expires_at", "device_grants", ["expires_at"])
    op.create_table(
        "user_sessions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(40), nullable=False, unique=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", name="fk_user_sessions_user_id"), nullable=False),
        sa.Column("client_id", sa.String(128), nullable=False),
        sa.Column("idp_refresh", sa.Text(), nullable=True),
        sa.Column("key_id", sa.Integer(), sa.ForeignKey("api_keys.id", name="fk_user_sessions_key_id"), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("refreshed_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_user_sessions_token_hash", "user_sessions", ["token_hash"], unique=True)
    op.create_index("ix_user_sessions_user_id", "user_sessions", ["user_id"])
    op.add_column("api_keys", sa.Column("user_id", sa.Integer(), nullable=True))
    op.create_index("ix_api_keys_user_id", "api_keys", ["user_id"])
    op.add_column("ledger", sa.Column("user_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("ledger", "user_id")
    op.drop_index("ix_api_keys_user_id", table_name="api_keys")
    op.drop_column("api_keys", "user_id")
    op.drop_table("user_sessions")
    op.drop_table("device_grants")
    op.drop_table("idp_groups")
    op.drop_table("users")
