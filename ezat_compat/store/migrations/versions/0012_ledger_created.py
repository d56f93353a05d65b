"""The ledger by time: ix_ledger_created (created_at, status), for the console's usage rows read
newest first a page at a time (keyset on created_at and id) and its count of today's failed
requests, when no organisation or key narrows them (those have their own indexes); the status in
the index answers the count, and the "failed requests" filter, without reading the rows.

Building it reads the ledger once, in the migration's transaction (writes to the ledger wait
for it: seconds for ten million rows).

Revision ID: 0012
Revises: 0011
Create Date: 2027-03-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_ledger_created", "ledger", ["created_at", "status"])


def downgrade() -> None:
    op.drop_index("ix_ledger_created", table_name="ledger")
