"""The admin API: admin keys, the audit trail (append-only), rotated keys' grace windows; workspace
ids, suspension times, model access and per-key rate caps on organisations; blocked, last-used and
created-by on keys.

Every organisation gets its workspace id ("wrkspc_01…") here; a suspended one is taken as
suspended now. The audit trail refuses UPDATE and DELETE (a trigger on each backend).

Revision ID: 0008
Revises: 0007
Create Date: 2027-02-10
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_SQLITE_TRIGGERS = (
    "CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log "
    "BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END",
    "CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log "
    "BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END",
)
_PG_TRIGGERS = (
    "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN RAISE EXCEPTION 'the audit trail is append-only'; END $$",
    "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
    "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()",
)


def _random_workspace_id_sql(dialect: str) -> str:
    """SQL for a new workspace id per row: ``wrkspc_01`` + 22 random hex digits (store/accounts.py
    makes base62 ones; both are opaque), in SQL so that ``db upgrade --sql`` writes it too."""
    if dialect == "postgresql":
        return "'wrkspc_01' || substr(md5(random()::text || id::text), 1, 22)"
    return "'wrkspc_01' || substr(lower(hex(randomblob(11))), 1, 22)"


def upgrade() -> None:
    dialect = op.get_context().dialect.name
    op.add_column("orgs", sa.Column("public_id", sa.String(40), nullable=True))
    op.add_column("orgs", sa.Column("suspended_at", sa.BigInteger(), nullable=True))
    op.add_column("orgs", sa.Column("models", sa.String(2048), nullable=False, server_default=""))
    op.add_column("orgs", sa.Column("rpm", sa.Integer(), nullable=True))
    op.add_column("orgs", sa.Column("tpm", sa.Integer(), nullable=True))
    op.add_column("api_keys", sa.Column("blocked_at", sa.BigInteger(), nullable=True))
    op.add_column("api_keys", sa.Column("last_used_at", sa.BigInteger(), nullable=True))
    op.add_column("api_keys", sa.Column("created_by", sa.String(160), nullable=True))
    now = (datetime.now(UTC) - _EPOCH) // timedelta(microseconds=1)
    op.execute(f"UPDATE orgs SET public_id = {_random_workspace_id_sql(dialect)}")
    op.execute(f"UPDATE orgs SET suspended_at = {now} WHERE suspended")
    op.create_index("ux_orgs_public_id", "orgs", ["public_id"], unique=True)

    op.create_table(
        "admin_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.String(40), nullable=False, unique=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(24), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("read_only", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(160), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.Column("last_used_at", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_admin_keys_key_hash", "admin_keys", ["key_hash"], unique=True)
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "audit_log",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(160), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target_type", sa.String(32), nullable=False),
        sa.Column("target_id", sa.String(64), nullable=False),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.Column("address", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_target", "audit_log", ["target_type", "target_id"])
    for statement in _PG_TRIGGERS if dialect == "postgresql" else _SQLITE_TRIGGERS:
        op.execute(statement)
    op.create_table(
        "api_key_grace",
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.Integer(), sa.ForeignKey("api_keys.id", name="fk_api_key_grace_key_id"), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_api_key_grace_key_id", "api_key_grace", ["key_id"])


def downgrade() -> None:
    # A rotated key's previous secret stops working, a blocked key works again (the code before
    # 0008 knows neither), and the audit trail goes with its table.
    op.drop_table("api_key_grace")
    if op.get_context().dialect.name == "postgresql":
        op.drop_table("audit_log")
        op.execute("DROP FUNCTION audit_log_append_only()")
    else:
        op.drop_table("audit_log")  # its triggers go with it
    op.drop_table("admin_keys")
    op.drop_index("ux_orgs_public_id", table_name="orgs")
    # SQLite drops a plain column in place (3.35+); a batch copy of ``orgs`` would have to drop the
    # table its keys, reservations and ledger rows point at.
    for table, column in (
        ("api_keys", "created_by"),
        ("api_keys", "last_used_at"),
        ("api_keys", "blocked_at"),
        ("orgs", "tpm"),
        ("orgs", "rpm"),
        ("orgs", "models"),
        ("orgs", "suspended_at"),
        ("orgs", "public_id"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
