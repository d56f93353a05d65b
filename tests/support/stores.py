"""Storage on a real database, for the tests of the stores: ``db_url`` is a database nobody else
uses, on SQLite and on PostgreSQL (a new schema per test through ``search_path``; needs the
``postgres_url`` fixture of tests/conftest.py), and the ``engine``, ``hot_path``, ``accounts`` and
``books`` fixtures are built on it. A test module takes them by importing them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, make_url, select, text

from ezat_compat.domain import Usage
from ezat_compat.store.accounts import Accounts, AuthContext
from ezat_compat.store.db import make_engine
from ezat_compat.store.hotpath import DatabaseUnavailableError, HotPath, Rider, make_hot_path
from ezat_compat.store.ledger import Ledger, LedgerEntry
from tests.support.migrated import migrate_like_the_template, migrated_sqlite, with_schema

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A database URL nobody else uses: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ezat.db'}"
        return
    base = request.getfixturevalue("postgres_url")
    schema = f"ezat_store_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield with_schema(base, schema)
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


@pytest.fixture
def engine(request: pytest.FixtureRequest, db_url: str) -> Iterator[Engine]:
    """An engine on ``db_url`` holding this release's schema, as ``migrate`` leaves it
    (tests/support/migrated.py: the same schema, without running the migrations for each test)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        assert url.database
        migrated_sqlite(Path(url.database))
    eng = make_engine(db_url)
    if url.get_backend_name() == "postgresql":
        migrate_like_the_template(eng, request.getfixturevalue("postgres_url"))
    yield eng
    eng.dispose()


@pytest.fixture
def hot_path(engine: Engine) -> Iterator[HotPath]:
    """The one hot path of the engine, as the composition root builds it."""
    hot = make_hot_path(engine)
    yield hot
    hot.close()


@pytest.fixture
def accounts(engine: Engine, hot_path: HotPath) -> Accounts:
    return Accounts(engine, hot_path)


@pytest.fixture
def books(engine: Engine, hot_path: HotPath) -> Ledger:
    return Ledger(engine, hot_path)


def entry(
    ctx: AuthContext,
    cost: int,
    *,
    status: int = 200,
    usage: Usage | None = None,
    created_at: datetime = NOW,
    model: str = "claude-sonnet-5-5",
    estimated: bool = False,
) -> LedgerEntry:
    return LedgerEntry(
        created_at=created_at,
        org_id=ctx.org_id,
        key_id=ctx.key_id,
        endpoint="chat.completions",
        model=model,
        canonical_model="anthropic/claude-sonnet-5-5",
        deployment="primary",
        usage=usage or Usage(input_tokens=10, output_tokens=5),
        cost_micros=cost,
        status=status,
        estimated=estimated,
    )


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def setup_key(accounts: Accounts, *, balance: int = 1_000_000, org: str = "acme", **key: Any) -> AuthContext:
    accounts.create_org(org, balance)
    _, secret = accounts.create_key(org, now=NOW, **key)
    return accounts.authenticate(secret, NOW)


class Down:
    """A hot path whose database is gone while ``down`` is set (every write fails as an outage,
    the rider's too), and answers again once it is cleared."""

    def __init__(self, hot: HotPath) -> None:
        self.hot = hot
        self.down = True

    def read(self, sql: str, params: Any) -> Any:
        return self.hot.read(sql, params)

    def write(self, work: Any, params: Any, rider: Rider | None = None) -> Any:
        if self.down:
            if rider is not None:
                rider.failed(DatabaseUnavailableError())
            raise DatabaseUnavailableError()
        return self.hot.write(work, params, rider)

    def close(self) -> None:
        self.hot.close()
