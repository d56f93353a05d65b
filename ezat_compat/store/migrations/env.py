"""Alembic environment of ezat_compat.

Three ways in:

- ``ezat_compat.store.db.migrate`` (what ``serve``, ``demo`` and ``ezat-compat db upgrade`` use)
  passes an open connection, already inside its transaction and holding the migration lock, in
  ``config.attributes["connection"]``; the scripts run on it.
- Offline mode (``ezat-compat db upgrade --sql``, ``alembic upgrade head --sql``): the SQL is
  written out for a DBA to apply, nothing is connected.
- The ``alembic`` command itself (the repository's ``alembic.ini``): the database is the
  gateway's, found as the admin commands find it (``sqlalchemy.url`` when set; else the config
  file named by ``EZAT_CONFIG`` or ``./ezat.toml``, ``EZAT_DATABASE_URL`` overriding its URL and a
  relative SQLite path taken in the data folder; else ``EZAT_DATABASE_URL`` as it is), migrated
  with the same lock as ``migrate``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from ezat_compat.store.tables import metadata


def _database_url() -> str:
    url = context.config.get_main_option("sqlalchemy.url")
    if url:
        return url
    import os

    from ezat_compat.config import load_config, resolve_config_path

    path = resolve_config_path(None)
    if not os.path.exists(path) and os.environ.get("EZAT_DATABASE_URL"):
        return os.environ["EZAT_DATABASE_URL"]
    return load_config(path).gateway.database_url  # EZAT_DATABASE_URL applied, a relative path resolved


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    """Write the SQL of the pending migrations (``--sql``) instead of running them."""
    url = _database_url()
    context.configure(
        url=url,
        target_metadata=metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run every pending migration on the connection given by ``migrate``, or, from the
    ``alembic`` command, through ``migrate``'s own locking on the gateway's database."""
    connection = context.config.attributes.get("connection")
    if isinstance(connection, Connection):
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from ezat_compat.store.db import locked_connection, make_engine

    engine = make_engine(_database_url())
    try:
        with locked_connection(engine) as conn:
            _configure(conn)
            context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
