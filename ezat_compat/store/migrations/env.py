"""Alembic environment of ezat_compat, run programmatically by ``ezat_compat.store.db.migrate``.

``migrate`` passes an open connection (already inside its transaction and holding the
migration lock) in ``config.attributes["connection"]``; this file only runs the scripts on it.
There is no offline (SQL script) mode.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from ezat_compat.store.tables import metadata


def run_migrations_online() -> None:
    """Run every pending migration on the connection given by ``migrate``."""
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("run migrations with ezat_compat.store.db.migrate(url), not the alembic command")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline migrations are not supported; use ezat_compat.store.db.migrate(url)")
run_migrations_online()
