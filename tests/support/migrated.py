"""A database holding this release's schema, for tests that need one of their own and do not test
the migrations: what ``migrate`` leaves on a new database, at a fraction of its cost.

``migrate`` runs every Alembic revision (50 ms on SQLite, 150-200 ms on PostgreSQL here), and a
test process needs a new database dozens of times. Each process migrates once:

- SQLite: a template file, copied for each test (``migrated_sqlite``);
- PostgreSQL: a template schema, migrated with the statements it was sent recorded; each new schema
  gets the same statements in one transaction (``migrate_like_the_template``), the reads Alembic
  made to decide them left out.

The tests of the migrations themselves (``tests/integration/test_store.py`` and the revisions'
own tests) call ``migrate``."""

from __future__ import annotations

import functools
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url, text

from ezat_compat.store.db import make_engine, migrate

_FOLDER = tempfile.TemporaryDirectory(prefix="ezat-schema-")  # removed when the process ends


@functools.cache
def _sqlite_template() -> Path:
    path = Path(_FOLDER.name) / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        migrate(engine)
    finally:
        engine.dispose()
    # The last connection's close checkpoints the WAL into the file and removes it: the file is whole.
    assert not path.with_name(path.name + "-wal").exists(), "the template's WAL outlived its engine"
    return path


def migrated_sqlite(path: Path) -> str:
    """``sqlite:///<path>`` for a new file at ``path`` holding this release's schema."""
    shutil.copyfile(_sqlite_template(), path)
    return f"sqlite:///{path}"


def with_schema(url: str, schema: str) -> str:
    """``url`` with ``schema`` first on its search path."""
    return make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


@functools.cache
def _postgres_statements(base_url: str) -> tuple[tuple[str, Any, bool], ...]:
    """The statements ``migrate`` sends to a new PostgreSQL schema, in order, with their parameters
    and whether they were sent as one batch (the template schema is dropped afterwards)."""
    schema = f"ezat_template_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    sent: list[tuple[str, Any, bool]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if not statement.lstrip().upper().startswith(("SELECT", "WITH")):  # Alembic's reads and the lock
            sent.append((statement, parameters, executemany))

    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        engine = make_engine(with_schema(base_url, schema))
        event.listen(engine, "before_cursor_execute", record)
        try:
            migrate(engine)
        finally:
            engine.dispose()
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
    assert any("CREATE TABLE" in statement for statement, _, _ in sent), "migrate sent no schema to record"
    return tuple(sent)


def migrate_like_the_template(engine: Engine, base_url: str) -> None:
    """Give ``engine``'s new PostgreSQL schema (first on its search path, empty) what ``migrate``
    gives it: the template's statements, in one transaction."""
    statements = _postgres_statements(base_url)
    with engine.begin() as conn, conn.connection.driver_connection.cursor() as cursor:  # the statements as sent
        for statement, parameters, batch in statements:
            if batch:
                cursor.executemany(statement, parameters)
            elif parameters:
                cursor.execute(statement, parameters)
            else:
                cursor.execute(statement)  # as SQLAlchemy sends a statement without parameters
