"""Storage on a real database: migrations, orgs, keys, authentication, reservations and the ledger.

Every test runs on SQLite (a file in tmp_path) and on PostgreSQL (the ``postgres_url`` fixture,
a fresh schema per test through ``search_path``); the ones that need no database are in
tests/unit/test_store.py.
"""

from __future__ import annotations

import multiprocessing
import random
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, event, inspect, select, text

from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.domain import Usage
from ezat_compat.errors import AuthenticationError, InsufficientQuotaError, PermissionDeniedError
from ezat_compat.store.accounts import Accounts, AuthContext, StoreError, hash_key
from ezat_compat.store.db import REVISIONS, alembic_config, locked_connection, make_engine, migrate
from ezat_compat.store.hotpath import DatabaseUnavailableError, HotPath, Rider, SQLiteHotPath, make_hot_path
from ezat_compat.store.journal import Journal
from ezat_compat.store.ledger import Ledger
from ezat_compat.store.responses import ResponseStore
from ezat_compat.store.tables import api_keys, ledger, metadata, orgs, reservations, responses, to_epoch_micros
from tests.support.stores import NOW, Down, count, entry, setup_key

# The fixtures on the SQLite / PostgreSQL databases: pytest finds them among the module's names.
from tests.support.stores import accounts as accounts
from tests.support.stores import books as books
from tests.support.stores import db_url as db_url
from tests.support.stores import engine as engine
from tests.support.stores import hot_path as hot_path

SPAWN = multiprocessing.get_context("spawn")
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()  # the newest migration


def org_row(engine: Engine, name: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(orgs).where(orgs.c.name == name)).one()


def key_row(engine: Engine, key_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(api_keys).where(api_keys.c.id == key_id)).one()


def run_processes(target: Callable[..., None], args: list[tuple[Any, ...]], timeout: float = 120) -> list[Any]:
    """Start one spawned process per args tuple (each gets a result queue as its last argument)
    and return what each put on the queue; fail on any crash."""
    queue = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*a, queue)) for a in args]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
        queue.close()
        queue.join_thread()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    failures = [r for r in results if isinstance(r, str) and r.startswith("error:")]
    assert not failures, failures
    return results


# ---------------------------------------------------------------- migrations


def _migrate_child(url: str, barrier: Any, queue: Any) -> None:
    try:
        barrier.wait(timeout=60)
        migrate(url)
        queue.put("ok")
    except Exception as exc:  # reported to the parent
        queue.put(f"error: {exc!r}")


def _schema_state(url: str) -> tuple[list[Any], list[str]]:
    eng = make_engine(url)
    try:
        with eng.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata)
            versions = [row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))]
        return diffs, versions
    finally:
        eng.dispose()


def test_the_revisions_read_without_alembic_are_its_chain() -> None:
    """``store.db.REVISIONS`` (what a start or an admin command checks a stamp against, without
    loading Alembic) is Alembic's chain of this release's migrations, oldest first."""
    chain = [rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()]
    assert tuple(reversed(chain)) == REVISIONS and REVISIONS[-1] == HEAD


def test_migrate_twice_is_idempotent_and_matches_the_tables(db_url: str) -> None:
    migrate(db_url)
    migrate(db_url)
    diffs, versions = _schema_state(db_url)
    assert diffs == []
    assert versions == [HEAD]


def test_migrate_from_several_processes_at_once(db_url: str) -> None:
    barrier = SPAWN.Barrier(3)
    assert run_processes(_migrate_child, [(db_url, barrier)] * 3) == ["ok"] * 3
    diffs, versions = _schema_state(db_url)
    assert diffs == []
    assert versions == [HEAD]


def _migrate_to(engine: Engine, revision: str, *, down: bool = False) -> None:
    with locked_connection(engine) as conn:
        (command.downgrade if down else command.upgrade)(alembic_config(conn), revision)


def _reservations_shape(engine: Engine) -> tuple[set[str], bool | None]:
    """The secondary indexes of reservations, and on SQLite whether it has a rowid (else None)."""
    indexes = {str(ix["name"]) for ix in inspect(engine).get_indexes("reservations")}
    if engine.dialect.name != "sqlite":
        return indexes, None
    with engine.connect() as conn:
        sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'reservations'")).scalar_one()
        # A rowid table keeps its text primary key in an index of its own, with no SQL.
        automatic = conn.execute(
            text("SELECT name FROM sqlite_master WHERE tbl_name = 'reservations' AND type = 'index' AND sql IS NULL")
        )
        assert [row[0] for row in automatic] == ([] if "WITHOUT ROWID" in sql else ["sqlite_autoindex_reservations_1"])
    return indexes, "WITHOUT ROWID" not in sql


def _seed_at_0004(eng: Engine, held: list[tuple[str, int, str]]) -> AuthContext:
    """An organisation "acme" with $1 and a key, holding ``held`` (request id, amount, worker),
    written with raw SQL on the tables as they are at revision 0004; the key's context."""
    tables = MetaData()
    tables.reflect(eng, only=("orgs", "api_keys", "reservations"))
    orgs_0004, keys_0004, held_0004 = (tables.tables[n] for n in ("orgs", "api_keys", "reservations"))
    total = sum(amount for _, amount, _ in held)
    with eng.begin() as conn:
        org_id = conn.execute(
            orgs_0004.insert().values(
                name="acme",
                balance_micros=1_000_000,
                reserved_micros=total,
                suspended=False,
                created_at=to_epoch_micros(NOW),
            )
        ).inserted_primary_key[0]
        key_id = conn.execute(
            keys_0004.insert().values(
                public_id="key_000000000001",
                org_id=org_id,
                name="",
                prefix="ezat_sk_0000",
                key_hash="0" * 64,
                models="",
                spent_micros=0,
                reserved_micros=total,
                created_at=to_epoch_micros(NOW),
            )
        ).inserted_primary_key[0]
        for request_id, amount, worker in held:
            conn.execute(
                held_0004.insert().values(
                    request_id=request_id,
                    org_id=org_id,
                    key_id=key_id,
                    amount_micros=amount,
                    created_at=to_epoch_micros(NOW),
                    worker=worker,
                    endpoint="chat.completions",
                )
            )
    return AuthContext(
        key_id=key_id,
        key_public_id="key_000000000001",
        org_id=org_id,
        org_name="acme",
        model_patterns=(),
        spend_limit_micros=None,
        rpm=None,
        tpm=None,
    )


def test_upgrading_from_0004_keeps_the_held_reservations(db_url: str) -> None:
    """Reservations held across the upgrade (a hot path open the whole time) are still there
    afterwards and settle as usual; the table loses its secondary indexes (and, on SQLite, its
    rowid), and a downgrade brings both back, rows included."""
    eng = make_engine(db_url)
    hot = make_hot_path(eng)
    try:
        _migrate_to(eng, "0004")
        assert _reservations_shape(eng)[0] == {"ix_reservations_created_at", "ix_reservations_worker"}
        books = Ledger(eng, hot)
        # Rows as release 0004 wrote them (today's code writes columns 0004 doesn't have).
        ctx = _seed_at_0004(eng, [(f"req_held_{n}", 1000 * (n + 1), w) for n, w in enumerate(("w:1", "w:1", "w:9"))])
        cols = [reservations.c[c["name"]] for c in inspect(eng).get_columns("reservations")]  # 0004's columns
        with eng.connect() as conn:
            before = conn.execute(select(*cols).order_by(reservations.c.request_id)).all()
        assert len(before) == 3

        migrate(eng)
        assert _reservations_shape(eng) == (set(), False if eng.dialect.name == "sqlite" else None)
        assert _schema_state(db_url) == ([], [HEAD])
        with eng.connect() as conn:
            assert conn.execute(select(*cols).order_by(reservations.c.request_id)).all() == before
        assert org_row(eng, "acme").reserved_micros == 6000

        # Settled, released with their dead worker, swept: each way out still finds its row.
        assert books.settle_durably("req_held_0", entry(ctx, 400)) is True
        assert books.release_worker("w:1", now=NOW) == ["req_held_1"]
        assert books.sweep_stale(timedelta(minutes=15), now=NOW + timedelta(minutes=20)) == 1
        assert count(eng, reservations) == 0 and count(eng, ledger) == 2
        org = org_row(eng, "acme")
        assert (org.balance_micros, org.reserved_micros) == (1_000_000 - 400, 0)
        assert key_row(eng, ctx.key_id).reserved_micros == 0

        books.reserve(ctx, "req_after", 500, now=NOW, worker="w:2")
        with eng.connect() as conn:
            kept = conn.execute(select(*cols).order_by(reservations.c.request_id)).all()

        _migrate_to(eng, "0004", down=True)
        assert _reservations_shape(eng) == (
            {"ix_reservations_created_at", "ix_reservations_worker"},
            True if eng.dialect.name == "sqlite" else None,
        )
        with eng.connect() as conn:
            assert conn.execute(select(*cols).order_by(reservations.c.request_id)).all() == kept
        migrate(eng)  # and up again
        assert _schema_state(db_url) == ([], [HEAD])
        with eng.connect() as conn:
            assert conn.execute(select(*cols).order_by(reservations.c.request_id)).all() == kept
    finally:
        hot.close()
        eng.dispose()


def test_sqlite_engine_settings(tmp_path) -> None:
    eng = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with eng.connect() as conn:
            pragmas = {
                name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }
        assert pragmas == {"journal_mode": "wal", "synchronous": 1, "foreign_keys": 1, "busy_timeout": 10_000}
    finally:
        eng.dispose()


# ---------------------------------------------------------------- organisations


def test_orgs_create_top_up_suspend_resume(accounts: Accounts) -> None:
    created = accounts.create_org("acme", 5_000_000, now=NOW)
    assert (created.name, created.balance_micros, created.reserved_micros, created.suspended) == (
        "acme",
        5_000_000,
        0,
        False,
    )
    assert created.created_at == NOW
    assert accounts.top_up("acme", 2_500_000).balance_micros == 7_500_000
    assert accounts.set_suspended("acme", True).suspended is True
    assert accounts.get_org("acme").suspended is True
    assert accounts.set_suspended("acme", False).suspended is False
    assert [o.name for o in accounts.list_orgs()] == ["acme"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.create_org("acme"), "already exists"),
        (lambda a: a.create_org("bad name!"), "not a valid organization name"),
        (lambda a: a.create_org("neg", -1), "at least 0"),
        (lambda a: a.top_up("nobody", 1), "no organization named 'nobody'"),
        (lambda a: a.top_up("acme", 0), "at least 1"),
        (lambda a: a.set_suspended("nobody", True), "no organization named 'nobody'"),
        (lambda a: a.get_org("nobody"), "orgs create nobody"),
        (lambda a: a.create_key("nobody"), "no organization named 'nobody'"),
        (lambda a: a.create_key("acme", rpm=0), "rpm: must be a whole number of at least 1"),
        (lambda a: a.create_key("acme", tpm=-5), "tpm: must be a whole number of at least 1"),
        (lambda a: a.create_key("acme", spend_limit_micros=-1), "spend limit"),
        (lambda a: a.create_key("acme", models=["a,b"]), "not a model pattern"),
        (lambda a: a.create_key("acme", models="anthropic/*"), "a list of patterns"),
        (lambda a: a.create_key("acme", expires_at=datetime(2020, 1, 1, tzinfo=UTC)), "in the past"),
        (lambda a: a.create_key("acme", expires_at=datetime(2099, 1, 1)), "time zone"),
        (lambda a: a.revoke_key("key_000000000000"), "no key 'key_000000000000'"),
        (lambda a: a.list_keys("nobody"), "no organization named 'nobody'"),
    ],
    ids=[
        "duplicate-org",
        "bad-org-name",
        "negative-balance",
        "top-up-unknown",
        "top-up-zero",
        "suspend-unknown",
        "get-unknown",
        "key-for-unknown-org",
        "rpm-zero",
        "tpm-negative",
        "negative-spend-limit",
        "comma-in-pattern",
        "patterns-as-one-string",
        "expired-at-creation",
        "naive-expiry",
        "revoke-unknown",
        "list-unknown-org",
    ],
)
def test_operator_mistakes_raise_store_error(accounts: Accounts, call: Callable[[Accounts], Any], message: str) -> None:
    accounts.create_org("acme")
    with pytest.raises(StoreError, match=re.escape(message)):
        call(accounts)


# ---------------------------------------------------------------- keys


def test_keys_create_list_revoke(accounts: Accounts, engine: Engine) -> None:
    accounts.create_org("acme")
    accounts.create_org("beta")
    info, secret = accounts.create_key(
        "acme",
        name="ci",
        models=["anthropic/claude-sonnet-*", " claude-haiku-4 "],
        spend_limit_micros=5_000_000,
        rpm=10,
        tpm=20_000,
        expires_at=NOW + timedelta(days=30),
        now=NOW,
    )
    other, other_secret = accounts.create_key("beta", now=NOW + timedelta(seconds=1))

    assert re.fullmatch(r"ezat_sk_[A-Za-z0-9]{32}", secret)
    assert secret != other_secret
    assert re.fullmatch(r"key_[0-9a-f]{12}", info.id)
    assert info.prefix == secret[:12] and info.prefix.startswith("ezat_sk_")
    assert (info.org, info.name, info.models) == ("acme", "ci", ("anthropic/claude-sonnet-*", "claude-haiku-4"))
    assert (info.spend_limit_micros, info.spent_micros, info.rpm, info.tpm) == (5_000_000, 0, 10, 20_000)
    assert (info.created_at, info.expires_at, info.revoked_at) == (NOW, NOW + timedelta(days=30), None)

    # Only the hash and the display prefix are stored: the secret is nowhere in the row.
    row = key_row(engine, accounts.authenticate(secret, NOW).key_id)
    assert row.key_hash == hash_key(secret)
    assert all(secret not in str(value) for value in row)

    assert [k.id for k in accounts.list_keys()] == [info.id, other.id]
    assert [k.id for k in accounts.list_keys("beta")] == [other.id]

    revoked = accounts.revoke_key(info.id, now=NOW + timedelta(hours=1))
    assert revoked.revoked_at == NOW + timedelta(hours=1)
    assert accounts.revoke_key(info.id, now=NOW + timedelta(hours=2)).revoked_at == NOW + timedelta(hours=1)
    assert accounts.list_keys("acme")[0].revoked_at == NOW + timedelta(hours=1)

    assert info.to_json() == {
        "id": info.id,
        "prefix": info.prefix,
        "org": "acme",
        "name": "ci",
        "models": ["anthropic/claude-sonnet-*", "claude-haiku-4"],
        "spend_limit_usd": "5.000000",
        "spent_usd": "0.000000",
        "rpm": 10,
        "tpm": 20_000,
        "created_at": "2025-06-01T12:00:00Z",
        "expires_at": "2025-07-01T12:00:00Z",
        "revoked_at": None,
    }


# ---------------------------------------------------------------- authentication


def _arrange_auth(accounts: Accounts, case: str) -> str:
    accounts.create_org("acme")
    _, secret = accounts.create_key("acme", expires_at=NOW + timedelta(hours=1), now=NOW - timedelta(days=1))
    if case == "revoked":
        accounts.revoke_key(accounts.list_keys()[0].id)
    elif case == "suspended-org":
        accounts.set_suspended("acme", True)
    elif case == "resumed-org":
        accounts.set_suspended("acme", True)
        accounts.set_suspended("acme", False)
    elif case == "unknown":
        return "ezat_sk_" + "A" * 32
    elif case == "not-a-gateway-key":
        return "sk-ant-api03-abcdef"
    elif case == "empty":
        return ""
    elif case == "prefix-only":
        return secret[:12]
    return secret


AUTH = [
    # id, seconds after NOW, expected error type, message
    ("ok", 0, None, None),
    ("resumed-org", 0, None, None),
    ("unknown", 0, AuthenticationError, "Invalid API key."),
    ("not-a-gateway-key", 0, AuthenticationError, "Invalid API key."),
    ("empty", 0, AuthenticationError, "Invalid API key."),
    ("prefix-only", 0, AuthenticationError, "Invalid API key."),
    ("revoked", 0, AuthenticationError, "This API key has been revoked."),
    ("expired", 3601, AuthenticationError, "This API key has expired."),
    ("expired-at-the-instant", 3600, AuthenticationError, "This API key has expired."),
    ("just-before-expiry", 3599, None, None),
    (
        "suspended-org",
        0,
        PermissionDeniedError,
        "The organization 'acme' is suspended; ask your administrator to resume it.",
    ),
]


@pytest.mark.parametrize(("case", "later", "error", "message"), AUTH, ids=[a[0] for a in AUTH])
def test_authenticate(
    accounts: Accounts, case: str, later: int, error: type[Exception] | None, message: str | None
) -> None:
    secret = _arrange_auth(accounts, case)
    when = NOW + timedelta(seconds=later)
    if error is None:
        ctx = accounts.authenticate(secret, when)
        assert (ctx.org_name, ctx.key_public_id) == ("acme", accounts.list_keys()[0].id)
        return
    with pytest.raises(error) as caught:
        accounts.authenticate(secret, when)
    assert caught.value.message == message


def test_authenticate_returns_the_key_settings(accounts: Accounts) -> None:
    ctx = setup_key(accounts, models=["anthropic/claude-sonnet-*"], spend_limit_micros=7, rpm=3, tpm=4)
    assert (ctx.model_patterns, ctx.spend_limit_micros, ctx.rpm, ctx.tpm) == (("anthropic/claude-sonnet-*",), 7, 3, 4)
    assert ctx.allows("anthropic/claude-sonnet-5-5", ["claude-sonnet-5-5"])
    assert not ctx.allows("anthropic/claude-opus-5", ["claude-opus-5"])
    with pytest.raises(AttributeError):
        ctx.rpm = 5  # type: ignore[misc]


# ---------------------------------------------------------------- reserve and settle


def test_reserve_then_settle_arithmetic(accounts: Accounts, books: Ledger, engine: Engine) -> None:
    ctx = setup_key(accounts, balance=1_000_000, spend_limit_micros=600_000)
    books.reserve(ctx, "req-1", 300_000)
    assert (org_row(engine, "acme").balance_micros, org_row(engine, "acme").reserved_micros) == (1_000_000, 300_000)
    assert (key_row(engine, ctx.key_id).spent_micros, key_row(engine, ctx.key_id).reserved_micros) == (0, 300_000)

    usage = Usage(input_tokens=100, cache_write_tokens=20, cache_read_tokens=30, output_tokens=40, reasoning_tokens=7)
    assert books.settle("req-1", entry(ctx, 120_345, usage=usage)) is True

    org, key = org_row(engine, "acme"), key_row(engine, ctx.key_id)
    assert (org.balance_micros, org.reserved_micros) == (879_655, 0)
    assert (key.spent_micros, key.reserved_micros) == (120_345, 0)
    assert count(engine, reservations) == 0
    with engine.connect() as conn:
        row = conn.execute(select(ledger)).one()
    assert (row.request_id, row.created_at, row.org_id, row.key_id, row.endpoint, row.model) == (
        "req-1",
        NOW,
        ctx.org_id,
        ctx.key_id,
        "chat.completions",
        "claude-sonnet-5-5",
    )
    assert (
        row.input_tokens,
        row.cache_write_tokens,
        row.cache_read_tokens,
        row.output_tokens,
        row.reasoning_tokens,
    ) == (100, 20, 30, 40, 7)
    assert (row.cost_micros, row.status, row.estimated) == (120_345, 200, False)


def test_402_when_the_balance_cannot_cover_the_worst_case(accounts: Accounts, books: Ledger, engine: Engine) -> None:
    ctx = setup_key(accounts, balance=500_000)
    books.reserve(ctx, "first", 400_000)
    with pytest.raises(InsufficientQuotaError) as caught:
        books.reserve(ctx, "second", 200_000)
    message = caught.value.message
    assert "Insufficient balance" in message
    assert "$0.200000" in message and "$0.100000 available" in message and "$0.500000 balance" in message
    assert "top up" in message and "max_tokens" in message
    assert caught.value.status == 402
    # Nothing of the refused request is held.
    assert org_row(engine, "acme").reserved_micros == 400_000
    assert key_row(engine, ctx.key_id).reserved_micros == 400_000
    assert count(engine, reservations) == 1
    books.reserve(ctx, "fits-exactly", 100_000)


def test_402_when_the_key_spend_limit_cannot_cover_the_worst_case(
    accounts: Accounts, books: Ledger, engine: Engine
) -> None:
    ctx = setup_key(accounts, balance=10_000_000, spend_limit_micros=1_000_000)
    books.reserve(ctx, "a", 700_000)
    books.settle("a", entry(ctx, 600_000))
    books.reserve(ctx, "b", 300_000)
    with pytest.raises(InsufficientQuotaError) as caught:
        books.reserve(ctx, "c", 200_001)
    message = caught.value.message
    assert "spend limit" in message and ctx.key_public_id in message
    assert "$0.200001" in message and "$0.100000 left" in message and "$1.000000 limit" in message
    assert "raise the key's spend limit" in message and "max_tokens" in message
    assert org_row(engine, "acme").reserved_micros == 300_000
    assert key_row(engine, ctx.key_id).reserved_micros == 300_000
    books.reserve(ctx, "d", 100_000)


def test_settle_twice_is_a_no_op(accounts: Accounts, books: Ledger, engine: Engine) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    books.reserve(ctx, "r", 50_000)
    assert books.settle("r", entry(ctx, 10_000)) is True
    assert books.settle("r", entry(ctx, 10_000)) is False
    assert books.settle("r", entry(ctx, 99_999)) is False
    assert org_row(engine, "acme").balance_micros == 990_000
    assert key_row(engine, ctx.key_id).spent_micros == 10_000
    assert count(engine, ledger) == 1


def test_concurrent_settles_of_one_request_debit_once(accounts: Accounts, books: Ledger, engine: Engine) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    books.reserve(ctx, "r", 50_000)
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def settle() -> None:
        barrier.wait()
        results.append(books.settle("r", entry(ctx, 10_000)))

    threads = [threading.Thread(target=settle) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert org_row(engine, "acme").balance_micros == 990_000
    assert org_row(engine, "acme").reserved_micros == 0


def test_swept_reservation_is_still_debited(accounts: Accounts, books: Ledger, engine: Engine) -> None:
    ctx = setup_key(accounts, balance=1_000_000, spend_limit_micros=900_000)
    books.reserve(ctx, "crashed", 200_000, now=NOW)
    books.reserve(ctx, "recent", 100_000, now=NOW + timedelta(minutes=10))
    assert books.sweep_stale(timedelta(minutes=15), now=NOW + timedelta(minutes=20)) == 1
    assert org_row(engine, "acme").reserved_micros == 100_000
    assert key_row(engine, ctx.key_id).reserved_micros == 100_000

    assert books.settle("crashed", entry(ctx, 150_000)) is True
    org, key = org_row(engine, "acme"), key_row(engine, ctx.key_id)
    assert (org.balance_micros, org.reserved_micros) == (850_000, 100_000)
    assert (key.spent_micros, key.reserved_micros) == (150_000, 100_000)
    assert books.sweep_stale(timedelta(minutes=15), now=NOW + timedelta(minutes=20)) == 0


def test_failed_requests_are_recorded_at_no_cost(accounts: Accounts, books: Ledger, engine: Engine) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    books.reserve(ctx, "boom", 80_000)
    assert books.settle("boom", entry(ctx, 0, status=503, usage=Usage()))
    org = org_row(engine, "acme")
    assert (org.balance_micros, org.reserved_micros) == (1_000_000, 0)
    with pytest.raises(ValueError, match="not billed"):
        entry(ctx, 5, status=500)
    # A client that left early pays for what was produced.
    books.reserve(ctx, "left", 80_000)
    assert books.settle("left", entry(ctx, 1_234, status=499, estimated=True))
    assert org_row(engine, "acme").balance_micros == 998_766


def test_settle_without_a_reservation_still_records(accounts: Accounts, books: Ledger, engine: Engine) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    assert books.settle("never-reserved", entry(ctx, 0, status=400, usage=Usage()))
    assert org_row(engine, "acme").reserved_micros == 0
    assert count(engine, ledger) == 1


class LostAnswer:
    """A hot path whose writes run, and commit, and whose answers the network then loses: what
    a reserve sees when PostgreSQL took the COMMIT and the connection broke before its reply
    (``commits=False``: the connection broke before the COMMIT, nothing held)."""

    def __init__(self, hot: HotPath, *, commits: bool) -> None:
        self.hot = hot
        self.commits = commits

    def read(self, sql: str, params: Any) -> Any:
        return self.hot.read(sql, params)

    def write(self, work: Any, params: Any) -> Any:
        if self.commits:
            self.hot.write(work, params)
        raise DatabaseUnavailableError()

    def close(self) -> None:
        self.hot.close()


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_a_reserve_whose_answer_was_lost_is_released_by_the_next_replay(
    accounts: Accounts, engine: Engine, hot_path: HotPath, tmp_path: Any, committed: bool
) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    journal = Journal(tmp_path / "journal")
    lossy = Ledger(engine, LostAnswer(hot_path, commits=committed), journal=journal)  # type: ignore[arg-type]
    with pytest.raises(DatabaseUnavailableError):
        lossy.reserve(
            ctx,
            "lost-1",
            250_000,
            endpoint="messages",
            model="claude-x",
            canonical_model="anthropic/x",
            status_of=AnthropicMessages().status_of,
        )
    assert org_row(engine, "acme").reserved_micros == (250_000 if committed else 0)  # held or not: unknown
    assert journal.files(), "the release is journaled before the error reaches the client"

    books = Ledger(engine, hot_path, journal=journal)  # the database answers again: the next replay
    report = books.replay()
    assert report.failed is False and report.pending_files == 0
    org, key = org_row(engine, "acme"), key_row(engine, ctx.key_id)
    assert (org.balance_micros, org.reserved_micros, key.spent_micros, key.reserved_micros) == (1_000_000, 0, 0, 0)
    assert count(engine, reservations) == 0
    with engine.connect() as conn:
        rows = conn.execute(select(ledger)).all()
    if committed:  # it was admitted: its one ledger row, a failure at no cost
        ((row),) = rows
        assert (row.request_id, row.status, row.cost_micros, row.endpoint, row.model) == (
            "lost-1",
            529,  # what its Anthropic client got (an OpenAI client gets 503)
            0,
            "messages",
            "claude-x",
        )
    else:  # it never held anything: no row
        assert rows == []
    assert books.replay().applied == 0  # applied once


def test_a_lost_reserve_answer_never_releases_a_hold_settled_since(
    accounts: Accounts, engine: Engine, hot_path: HotPath, tmp_path: Any
) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    journal = Journal(tmp_path / "journal")
    with pytest.raises(DatabaseUnavailableError):
        Ledger(engine, LostAnswer(hot_path, commits=True), journal=journal).reserve(ctx, "lost-2", 100_000)  # type: ignore[arg-type]
    books = Ledger(engine, hot_path, journal=journal)
    assert books.settle("lost-2", entry(ctx, 0, status=503, usage=Usage()))  # settled by someone else first
    assert books.replay().applied == 0
    assert count(engine, ledger) == 1 and org_row(engine, "acme").reserved_micros == 0


class StatementLog:
    """Every statement the hot path sends to the database, by its first words (``UPDATE orgs``)."""

    def __init__(self, engine: Engine, hot: HotPath) -> None:
        self.statements: list[str] = []
        if isinstance(hot, SQLiteHotPath):
            hot._connection().set_trace_callback(self._record)
        else:
            event.listen(engine, "before_cursor_execute", self._on_execute)

    def _record(self, sql: str) -> None:
        words = sql.split()
        self.statements.append(" ".join(words[:3] if words[0] in ("INSERT", "DELETE") else words[:2]))

    def _on_execute(self, _conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        self._record(sql)

    def take(self) -> list[str]:
        """The statements since the last call, without the transaction control (on PostgreSQL
        the driver sends BEGIN itself; SQLite's BEGIN IMMEDIATE and COMMIT are checked apart)."""
        taken, self.statements = self.statements, []
        return taken


def test_each_hot_path_call_runs_the_same_few_statements(
    accounts: Accounts, books: Ledger, engine: Engine, hot_path: HotPath
) -> None:
    """What a request costs the database: one SELECT to authenticate, one transaction of three
    statements to reserve and one of four to settle; a refusal or a repeated settle stops early."""
    accounts.create_org("acme", 100_000)
    _, secret = accounts.create_key("acme", now=NOW)
    accounts.authenticate(secret, NOW)  # opens the connection
    log = StatementLog(engine, hot_path)
    control = ["BEGIN IMMEDIATE", "COMMIT"] if isinstance(hot_path, SQLiteHotPath) else []
    rollback = ["BEGIN IMMEDIATE", "ROLLBACK"] if isinstance(hot_path, SQLiteHotPath) else []

    def data(statements: list[str]) -> list[str]:
        return [s for s in statements if s not in ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")]

    ctx = accounts.authenticate(secret, NOW)
    assert log.take() == ["SELECT k.id,"]
    # The spend limits' snapshot is reloaded inside a reserve once it is a second old
    # (store/spend.py, REFRESH_S): a request just before makes the measured reserve the common
    # case, however slow the machine is between the fixtures and here.
    books.reserve(ctx, "warm", 1)
    assert books.settle("warm", entry(ctx, 0))
    log.take()
    books.reserve(ctx, "r1", 60_000)
    reserve = log.take()
    assert data(reserve) == ["UPDATE orgs", "UPDATE api_keys", "INSERT INTO reservations"]
    assert [s for s in reserve if s not in data(reserve)] == control
    assert books.settle("r1", entry(ctx, 50_000))
    settle = log.take()
    assert data(settle) == ["INSERT INTO ledger", "DELETE FROM reservations", "UPDATE orgs", "UPDATE api_keys"]
    assert [s for s in settle if s not in data(settle)] == control
    assert not books.settle("r1", entry(ctx, 50_000))
    again = log.take()
    assert data(again) == ["INSERT INTO ledger"]
    assert [s for s in again if s not in data(again)] == rollback
    with pytest.raises(InsufficientQuotaError):
        books.reserve(ctx, "r2", 60_000)
    refused = log.take()  # the refusal's message is read through the engine, not the hot path
    assert data(refused)[:1] == ["UPDATE orgs"]
    if isinstance(hot_path, SQLiteHotPath):
        assert refused == ["BEGIN IMMEDIATE", "UPDATE orgs", "ROLLBACK"]


# ---------------------------------------------------------------- usage reports

USAGE_FIELDS = [
    "request_id",
    "created_at",
    "org",
    "key_id",
    "endpoint",
    "model",
    "canonical_model",
    "deployment",
    "input_tokens",
    "cache_write_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_usd",
    "status",
    "estimated",
]


def test_usage_rows_and_summary(accounts: Accounts, books: Ledger) -> None:
    a = setup_key(accounts, org="acme")
    b = setup_key(accounts, org="beta")
    usage = Usage(input_tokens=10, cache_write_tokens=1, cache_read_tokens=2, output_tokens=5, reasoning_tokens=3)
    books.settle("r1", entry(a, 1_500, usage=usage, created_at=NOW))
    books.settle(
        "r2",
        entry(a, 2_500, usage=usage, created_at=NOW + timedelta(minutes=1), model="Claude-Sonnet-5.5", estimated=True),
    )
    books.settle("r3", entry(b, 1_000, usage=usage, created_at=NOW + timedelta(minutes=2)))
    books.settle("r4", entry(a, 0, status=500, usage=Usage(), created_at=NOW + timedelta(minutes=3)))

    rows = books.usage_rows()
    assert [list(r) for r in rows] == [USAGE_FIELDS] * 4
    assert [r["request_id"] for r in rows] == ["r1", "r2", "r3", "r4"]
    assert rows[1] == {
        "request_id": "r2",
        "created_at": "2025-06-01T12:01:00Z",
        "org": "acme",
        "key_id": a.key_public_id,
        "endpoint": "chat.completions",
        "model": "Claude-Sonnet-5.5",
        "canonical_model": "anthropic/claude-sonnet-5-5",
        "deployment": "primary",
        "input_tokens": 10,
        "cache_write_tokens": 1,
        "cache_read_tokens": 2,
        "output_tokens": 5,
        "reasoning_tokens": 3,
        "cost_usd": "0.002500",
        "status": 200,
        "estimated": True,
    }
    assert [r["request_id"] for r in books.usage_rows(org="beta")] == ["r3"]
    assert [r["request_id"] for r in books.usage_rows(key_public_id=a.key_public_id)] == ["r1", "r2", "r4"]
    assert [r["request_id"] for r in books.usage_rows(since=NOW + timedelta(minutes=1))] == ["r2", "r3", "r4"]
    assert [r["request_id"] for r in books.usage_rows(org="acme", since=NOW + timedelta(seconds=1))] == ["r2", "r4"]

    assert books.usage_summary() == [
        {
            "org": "acme",
            "key_id": a.key_public_id,
            "model": "anthropic/claude-sonnet-5-5",
            "requests": 3,
            "input_tokens": 20,
            "cache_write_tokens": 2,
            "cache_read_tokens": 4,
            "output_tokens": 10,
            "reasoning_tokens": 6,
            "cost_usd": "0.004000",
        },
        {
            "org": "beta",
            "key_id": b.key_public_id,
            "model": "anthropic/claude-sonnet-5-5",
            "requests": 1,
            "input_tokens": 10,
            "cache_write_tokens": 1,
            "cache_read_tokens": 2,
            "output_tokens": 5,
            "reasoning_tokens": 3,
            "cost_usd": "0.001000",
        },
    ]
    assert books.usage_summary(org="beta")[0]["requests"] == 1
    with pytest.raises(StoreError, match="no organization named 'nobody'"):
        books.usage_rows(org="nobody")
    with pytest.raises(StoreError, match="no key 'key_nope'"):
        books.usage_summary(key_public_id="key_nope")


# ---------------------------------------------------------------- concurrency

WORST = 10_000  # micro-USD held per request
IN_FLIGHT = 200
COVERED = 100  # the balance (or the key's spend limit) covers exactly this many worst cases


def reserve_then_settle(
    books: Ledger, ctx: AuthContext, prefix: str, n: int, seed: int, between: Callable[[], None]
) -> tuple[dict[str, int], int, list[str]]:
    """``n`` threads reserve at once; after ``between()`` the admitted ones settle at once, each
    with a random real cost ≤ its reservation. Returns (admitted id -> cost, refused, errors)."""
    rng = random.Random(seed)
    costs = {f"{prefix}-{i}": rng.randint(0, WORST) for i in range(n)}
    admitted: dict[str, int] = {}
    refused: list[str] = []
    errors: list[str] = []
    start = threading.Barrier(n)

    def reserve(request_id: str) -> None:
        start.wait()
        try:
            books.reserve(ctx, request_id, WORST)
            admitted[request_id] = costs[request_id]
        except InsufficientQuotaError:
            refused.append(request_id)
        except Exception as exc:
            errors.append(f"reserve {request_id}: {exc!r}")

    def settle(request_id: str) -> None:
        time.sleep(rng.random() / 500)
        try:
            if not books.settle(request_id, entry(ctx, costs[request_id])):
                errors.append(f"settle {request_id} returned False")
        except Exception as exc:
            errors.append(f"settle {request_id}: {exc!r}")

    for phase, ids in ((reserve, list(costs)), (settle, None)):
        if ids is None:
            between()
            ids = list(admitted)
        threads = [threading.Thread(target=phase, args=(rid,)) for rid in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return admitted, len(refused), errors


def _cycles_child(url: str, secret: str, worker: int, n: int, start: Any, reserved: Any, queue: Any) -> None:
    engine = make_engine(url, pool_size=5, max_overflow=5)  # 4 processes stay well under max_connections
    hot = make_hot_path(engine)
    try:
        ctx = Accounts(engine, hot).authenticate(secret, datetime.now(UTC))
        start.wait(timeout=60)
        result = reserve_then_settle(
            Ledger(engine, hot), ctx, f"p{worker}", n, seed=worker, between=lambda: reserved.wait(timeout=60)
        )
        queue.put(result)
    except Exception as exc:
        queue.put(f"error: {exc!r}")
    finally:
        hot.close()
        engine.dispose()


class Watcher:
    """Samples the org and key rows while the test runs; records any moment the balance or the
    spend limit was exceeded."""

    def __init__(self, engine: Engine, key_id: int) -> None:
        self.engine, self.key_id = engine, key_id
        self.violations: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.engine.connect() as conn:
                org = conn.execute(select(orgs.c.balance_micros, orgs.c.reserved_micros)).one()
                key = conn.execute(
                    select(api_keys.c.spend_limit_micros, api_keys.c.spent_micros, api_keys.c.reserved_micros).where(
                        api_keys.c.id == self.key_id
                    )
                ).one()
            self.samples += 1
            if org.balance_micros < 0 or org.balance_micros - org.reserved_micros < 0:
                self.violations.append(f"org {tuple(org)}")
            if key.spend_limit_micros is not None and key.spent_micros + key.reserved_micros > key.spend_limit_micros:
                self.violations.append(f"key {tuple(key)}")
            time.sleep(0.002)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("mode", ["threads", "processes"])
@pytest.mark.parametrize("limit", ["balance", "key-spend-limit"])
def test_concurrent_reserve_settle_never_overshoots(
    accounts: Accounts, books: Ledger, engine: Engine, db_url: str, mode: str, limit: str
) -> None:
    if limit == "balance":
        balance, spend_limit = COVERED * WORST, None
    else:
        balance, spend_limit = 10 * COVERED * WORST, COVERED * WORST
    accounts.create_org("acme", balance)
    _, secret = accounts.create_key("acme", spend_limit_micros=spend_limit)
    ctx = accounts.authenticate(secret, datetime.now(UTC))

    with Watcher(engine, ctx.key_id) as watcher:
        if mode == "threads":
            results = [reserve_then_settle(books, ctx, "t", IN_FLIGHT, seed=1, between=lambda: None)]
        else:
            workers = 4
            start, reserved = SPAWN.Barrier(workers), SPAWN.Barrier(workers)
            results = run_processes(
                _cycles_child, [(db_url, secret, w, IN_FLIGHT // workers, start, reserved) for w in range(workers)]
            )
    admitted = {rid: cost for result in results for rid, cost in result[0].items()}
    refused = sum(result[1] for result in results)
    errors = [e for result in results for e in result[2]]

    assert errors == []
    assert watcher.violations == [] and watcher.samples > 0
    # Every reservation was attempted before any settled: exactly the covered number fit.
    assert (len(admitted), refused) == (COVERED, IN_FLIGHT - COVERED)
    with engine.connect() as conn:
        booked = dict(conn.execute(select(ledger.c.request_id, ledger.c.cost_micros)).all())
    assert booked == admitted
    assert count(engine, reservations) == 0
    org, key = org_row(engine, "acme"), key_row(engine, ctx.key_id)
    spent = sum(booked.values())
    assert org.reserved_micros == 0 and key.reserved_micros == 0
    assert org.balance_micros == balance - spent >= 0
    assert key.spent_micros == spent
    if spend_limit is not None:
        assert key.spent_micros <= spend_limit


# ---------------------------------------------------------------- group commit (SQLite)


def while_the_leader_yields(
    monkeypatch: pytest.MonkeyPatch, hot_path: SQLiteHotPath, threads: list[threading.Thread], then: Any = None
) -> None:
    """The next writer leads: while it yields, ``threads`` start and queue their writes behind
    its own; ``then`` (an exception) is raised from the yield once they are queued."""
    real_sleep = time.sleep

    def yielding(_seconds: float) -> None:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while hot_path.group.queued < 1 + len(threads) and time.monotonic() < deadline:
            real_sleep(0.001)
        if then is not None:
            raise then

    monkeypatch.setattr("ezat_compat.store.hotpath.time.sleep", yielding)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # group commit is the SQLite hot path's
def test_writes_that_arrive_together_share_one_transaction_and_keep_their_own_outcomes(
    accounts: Accounts, books: Ledger, engine: Engine, hot_path: HotPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the first writer yields, the others queue; the batch commits in one transaction,
    and inside it a refused reservation and a duplicate request id undo only themselves (the
    plain run is undone and the group runs again with a savepoint per write)."""
    assert isinstance(hot_path, SQLiteHotPath)
    ctx = setup_key(accounts, balance=100_000)
    books.reserve(ctx, "dup", 1_000)
    log = StatementLog(engine, hot_path)
    outcomes: dict[str, Any] = {}

    def reserve(request_id: str, amount: int) -> None:
        try:
            books.reserve(ctx, request_id, amount)
            outcomes[request_id] = "held"
        except Exception as exc:
            outcomes[request_id] = type(exc).__name__

    others = [("a", 10_000), ("too-much", 500_000), ("dup", 1_000), ("b", 20_000)]
    threads = [threading.Thread(target=reserve, args=job) for job in others]
    while_the_leader_yields(monkeypatch, hot_path, threads)
    reserve("first", 5_000)
    for thread in threads:
        thread.join(10)
    assert outcomes == {
        "first": "held",
        "a": "held",
        "too-much": "InsufficientQuotaError",
        "dup": "IntegrityError",
        "b": "held",
    }
    statements = log.take()
    assert statements.count("COMMIT") == 1 and statements.count("ROLLBACK") == 1
    assert statements.count("BEGIN IMMEDIATE") == 2 and statements.count("SAVEPOINT group_write") == 5
    assert org_row(engine, "acme").reserved_micros == 1_000 + 5_000 + 10_000 + 20_000
    assert count(engine, reservations) == 4


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # group commit is the SQLite hot path's
def test_a_group_whose_writes_all_keep_is_one_plain_transaction(
    accounts: Accounts, books: Ledger, engine: Engine, hot_path: HotPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common case costs no savepoint: one BEGIN IMMEDIATE, the writes, one COMMIT."""
    assert isinstance(hot_path, SQLiteHotPath)
    ctx = setup_key(accounts, balance=100_000)
    log = StatementLog(engine, hot_path)
    threads = [threading.Thread(target=books.reserve, args=(ctx, f"r{n}", 1_000)) for n in range(4)]
    while_the_leader_yields(monkeypatch, hot_path, threads)
    books.reserve(ctx, "first", 1_000)
    for thread in threads:
        thread.join(10)
    statements = log.take()
    assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 1
    assert not [s for s in statements if "SAVEPOINT" in s or "ROLLBACK" in s or "RELEASE" in s]
    assert org_row(engine, "acme").reserved_micros == 5_000 and count(engine, reservations) == 5


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # group commit is the SQLite hot path's
def test_a_writer_interrupted_before_its_turn_writes_nothing(
    accounts: Accounts, books: Ledger, engine: Engine, hot_path: HotPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader whose yield raises (a timeout, a kill) withdraws its own write and still runs
    the others' that queued meanwhile."""
    assert isinstance(hot_path, SQLiteHotPath)
    ctx = setup_key(accounts, balance=100_000)
    other = threading.Thread(target=books.reserve, args=(ctx, "other", 2_000))
    while_the_leader_yields(monkeypatch, hot_path, [other], then=TimeoutError("interrupted while yielding"))
    with pytest.raises(TimeoutError):
        books.reserve(ctx, "leader", 5_000)
    other.join(10)
    assert org_row(engine, "acme").reserved_micros == 2_000
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.request_id)).scalars().all() == ["other"]
    monkeypatch.undo()
    books.reserve(ctx, "after", 1_000)  # the queue is free again
    assert org_row(engine, "acme").reserved_micros == 3_000


# ---------------------------------------------------------------- riders (a record kept with a ledger row)

STORED = {"id": "resp_req_r", "object": "response", "output": []}


def stored_rider(engine: Engine, hot: HotPath, failures: list[BaseException]) -> Rider:
    rider = ResponseStore(engine, 3600.0, hot=hot).put(
        1, STORED, [{"role": "user", "content": "hi"}], 0, False, NOW.timestamp(), failed=failures.append
    )
    assert rider is not None
    return rider


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # one transaction: the SQLite hot path's
def test_a_rider_is_written_in_the_settlement_s_own_transaction(
    accounts: Accounts, books: Ledger, engine: Engine, hot_path: HotPath
) -> None:
    ctx = setup_key(accounts)
    books.reserve(ctx, "req_r", 1_000)
    failures: list[BaseException] = []
    rider = stored_rider(engine, hot_path, failures)
    log = StatementLog(engine, hot_path)
    assert books.settle_durably("req_r", entry(ctx, 400), rider) is True
    statements = log.take()
    assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 1
    assert failures == [] and count(engine, ledger) == 1 and count(engine, responses) == 1


def test_a_rider_that_fails_alone_leaves_the_row_and_says_so(
    accounts: Accounts, books: Ledger, engine: Engine, hot_path: HotPath
) -> None:
    """Its own error undoes only itself (SQLite: the group runs again a savepoint each;
    PostgreSQL: its own transaction) and goes to ``failed``; the row is in the database."""
    ctx = setup_key(accounts)
    books.reserve(ctx, "req_r", 1_000)
    failures: list[BaseException] = []

    rider = stored_rider(engine, hot_path, failures)

    def broken(execute: Any, params: Any) -> tuple[None, bool]:
        rider.work(execute, params)  # the response's row, then a bug
        raise ValueError("a bug in the rider")

    assert books.settle_durably("req_r", entry(ctx, 400), Rider(broken, rider.params, failures.append)) is True
    assert [str(f) for f in failures] == ["a bug in the rider"]
    assert count(engine, ledger) == 1 and count(engine, reservations) == 0 and count(engine, responses) == 0
    assert org_row(engine, "acme").balance_micros == 1_000_000 - 400


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # group commit is the SQLite hot path's
def test_a_rider_taken_back_with_its_write_fails_with_the_cause(
    accounts: Accounts, books: Ledger, engine: Engine, hot_path: HotPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(hot_path, SQLiteHotPath)
    ctx = setup_key(accounts)
    books.reserve(ctx, "req_r", 1_000)
    failures: list[BaseException] = []
    rider = stored_rider(engine, hot_path, failures)
    while_the_leader_yields(monkeypatch, hot_path, [], then=TimeoutError("interrupted while yielding"))
    with pytest.raises(TimeoutError):
        hot_path.write(lambda execute, params: (None, True), None, rider)
    assert [type(f) for f in failures] == [TimeoutError]
    assert count(engine, responses) == 0 and hot_path.group.queued == 0


def test_a_stored_response_waits_in_the_journal_with_its_settlement(
    accounts: Accounts, engine: Engine, hot_path: HotPath, tmp_path: Any
) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    down = Down(hot_path)
    books = Ledger(engine, down, journal=Journal(tmp_path / "journal"))  # type: ignore[arg-type]
    store = ResponseStore(engine, 3600, hot=down)  # type: ignore[arg-type]
    not_stored: list[BaseException] = []
    rider = store.put(ctx.org_id, {"id": "resp_during", "output": []}, [], 0, False, 1e9, failed=not_stored.append)
    assert rider is not None and rider.kind
    assert books.settle_durably("during", entry(ctx, 1234), rider) is False  # journaled
    assert not_stored == [], "a response that waits in the journal is not reported lost"
    assert count(engine, ledger) == 0 and count(engine, responses) == 0

    down.down = False
    assert books.replay().applied == 1
    assert count(engine, ledger) == 1 and store.get(ctx.org_id, "resp_during", 1e9 + 1) is not None
    assert books.replay().applied == 0 and count(engine, responses) == 1  # once


def test_a_journaled_row_the_database_refuses_is_set_aside(
    accounts: Accounts, engine: Engine, hot_path: HotPath, tmp_path: Any
) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    journal = Journal(tmp_path / "journal")
    books = Ledger(engine, hot_path, journal=journal)
    journal.append({**books._row("bad", entry(ctx, 10)), "org_id": 999_999})  # no such org: a foreign key refuses it
    journal.append(books._row("good", entry(ctx, 20)))
    report = books.replay()
    assert (report.applied, report.rejected, report.failed, report.pending_files) == (1, 1, False, 0)
    assert books.pending() == 0  # readiness is not held back by it
    assert [p.name.split("~")[0] for p in (tmp_path / "journal").iterdir()] == ["rejected"]
    with engine.connect() as conn:
        assert conn.execute(select(ledger.c.request_id)).scalars().all() == ["good"]


def test_the_replayer_applies_the_journal_without_traffic(
    accounts: Accounts, engine: Engine, hot_path: HotPath, tmp_path: Any
) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    books = Ledger(engine, hot_path, journal=Journal(tmp_path / "journal"))
    books.reserve(ctx, "held", 5_000)
    books.journal.append(books._row("held", entry(ctx, 100)))  # settled while the database was down
    books.start_replayer(every_s=0.05)
    try:
        deadline = time.monotonic() + 5
        while (count(engine, ledger), count(engine, reservations)) != (1, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        books.stop_replayer()
    assert (count(engine, ledger), count(engine, reservations), books.pending()) == (1, 0, 0)
    assert org_row(engine, "acme").reserved_micros == 0
