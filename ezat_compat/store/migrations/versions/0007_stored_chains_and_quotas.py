"""Stored responses as chains with an index of their input, and storage quotas per organisation:
responses.previous_id, input_count, input_chunks, input_ids, stored_bytes; response_parts;
message_threads.stored_bytes; storage_usage.

The rows already stored keep working as they are: a response's ``context`` still holds its whole
conversation (no ``previous_id``), its input is listed from it. Their sizes are counted into
``stored_bytes`` and each organisation's totals into ``storage_usage``.

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _bytes(column: str) -> str:
    """SQL for the UTF-8 size of a text column (0 for NULL), in this database's dialect."""
    if op.get_bind().dialect.name == "postgresql":
        return f"COALESCE(octet_length({column}), 0)"
    return f"COALESCE(length(CAST({column} AS BLOB)), 0)"


def upgrade() -> None:
    with op.batch_alter_table("responses") as batch:
        batch.add_column(sa.Column("previous_id", sa.String(96), nullable=True))
        batch.add_column(sa.Column("input_count", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("input_chunks", sa.Text(), nullable=True))
        batch.add_column(sa.Column("input_ids", sa.Text(), nullable=True))
        batch.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("message_threads") as batch:
        batch.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_table(
        "response_parts",
        sa.Column("org_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("response_id", sa.String(96), primary_key=True),
        sa.Column("part", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("text", sa.Text(), nullable=False),
    )
    op.create_table(
        "storage_usage",
        sa.Column("org_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stored_count", sa.BigInteger(), nullable=False),
    )
    op.execute(f"UPDATE responses SET stored_bytes = {_bytes('context')} + {_bytes('response')}")
    op.execute(f"UPDATE message_threads SET stored_bytes = {_bytes('messages')} + {_bytes('fields')}")
    op.execute(
        "INSERT INTO storage_usage (org_id, stored_bytes, stored_count) "
        "SELECT org_id, SUM(stored_bytes), COUNT(*) FROM ("
        "SELECT org_id, stored_bytes FROM responses UNION ALL SELECT org_id, stored_bytes FROM message_threads"
        ") AS kept GROUP BY org_id"
    )


def downgrade() -> None:
    # A response stored as a link of a chain holds only its own input, and a long input is in
    # response_parts: the code before 0007 would continue the first without the conversation
    # before it and can't read the second, so those rows go.
    op.execute("DELETE FROM responses WHERE previous_id IS NOT NULL OR context = ''")
    op.drop_table("storage_usage")
    op.drop_table("response_parts")
    with op.batch_alter_table("message_threads") as batch:
        batch.drop_column("stored_bytes")
    with op.batch_alter_table("responses") as batch:
        batch.drop_column("stored_bytes")
        batch.drop_column("input_ids")
        batch.drop_column("input_chunks")
        batch.drop_column("input_count")
        batch.drop_column("previous_id")
