"""Spend limits by period on a real database (SQLite and PostgreSQL): the reserve/settle arithmetic
of store/hotpath.py with store/spend.py, the 402's words, and the guarantees of the ledger that
must hold with limits too — no hold left after settle, sweep, a dead worker's release or a
journal replay; one ledger row per admitted request."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from ezat_compat.errors import InsufficientQuotaError
from ezat_compat.periods import time_zone
from ezat_compat.store.accounts import Accounts, AuthContext
from ezat_compat.store.hotpath import (
    INSERT_RESERVATION_SQL,
    RESERVE_KEY_SQL,
    RESERVE_ORG_SQL,
    HotPath,
    reserve_tx,
)
from ezat_compat.store.journal import Journal
from ezat_compat.store.ledger import Ledger
from ezat_compat.store.spend import REFRESH_S, SCOPE_GATEWAY, SCOPE_KEY, SCOPE_ORG, SpendLimits
from ezat_compat.store.tables import reservations, spend_counters, to_epoch_micros
from tests.support.stores import Down, entry, setup_key
from tests.support.stores import accounts as accounts
from tests.support.stores import db_url as db_url
from tests.support.stores import engine as engine
from tests.support.stores import hot_path as hot_path

pytestmark = pytest.mark.integration

JAN_31 = datetime(2026, 1, 31, 23, 59, 0, tzinfo=UTC)
FEB_1 = datetime(2026, 2, 1, 0, 1, 0, tzinfo=UTC)
USD = 1_000_000


class Clock:
    """A monotonic clock the test moves (the snapshot's refresh)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def spend(engine: Engine, clock: Clock) -> SpendLimits:
    return SpendLimits(engine, clock=clock)


@pytest.fixture
def books(engine: Engine, hot_path: HotPath, spend: SpendLimits, tmp_path: Any) -> Ledger:
    return Ledger(engine, hot_path, journal=Journal(tmp_path / "journal"), spend=spend)


@pytest.fixture
def ctx(accounts: Accounts) -> AuthContext:
    return setup_key(accounts, balance=1000 * USD)


def counter(engine: Engine, limit_id: int) -> list[tuple[datetime, int, int]]:
    """(period start, spent, reserved) of every period of the limit, oldest first."""
    query = (
        select(spend_counters.c.period_start, spend_counters.c.spent_micros, spend_counters.c.reserved_micros)
        .where(spend_counters.c.limit_id == limit_id)
        .order_by(spend_counters.c.period_start)
    )
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(query)]  # type: ignore[misc]


def statements(engine: Engine) -> Iterator[list[str]]:
    found: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        found.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        yield found
    finally:
        event.remove(engine, "before_cursor_execute", seen)


# ---------------------------------------------------------------- no limits: no cost


def test_reserve_without_limits_runs_only_the_three_statements_of_before() -> None:
    run: list[str] = []

    class Result:
        rowcount = 1

    def execute(sql: str, _params: Any) -> Result:
        run.append(sql)
        return Result()

    params = {"org": 1, "key": 1, "amount": 5, "holds": (), "spend_holds": None}
    assert reserve_tx(execute, params) == (None, True)
    assert run == [RESERVE_ORG_SQL, RESERVE_KEY_SQL, INSERT_RESERVATION_SQL]


def test_without_limits_the_snapshot_is_read_at_most_once_a_second(
    books: Ledger, ctx: AuthContext, engine: Engine, clock: Clock
) -> None:
    books.reserve(ctx, "warm", 10, now=JAN_31)  # the first use reads the (empty) snapshot
    watched = statements(engine)
    seen = next(watched)
    for i in range(20):
        books.reserve(ctx, f"r{i}", 10, now=JAN_31)
    assert not [s for s in seen if "spend_limits" in s]
    clock.now += REFRESH_S
    books.reserve(ctx, "after-a-second", 10, now=JAN_31)
    assert len([s for s in seen if "spend_limits" in s]) == 1
    with engine.connect() as conn:
        assert (
            conn.execute(select(reservations.c.spend_holds).where(reservations.c.request_id == "r0")).scalar() is None
        )
    assert counter(engine, 1) == []
    next(watched, None)


# ---------------------------------------------------------------- reserve and settle


def test_reserve_holds_on_every_limit_that_applies_and_settle_moves_it_to_spent(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine, accounts: Accounts
) -> None:
    _, gateway = spend.set_limit(SCOPE_GATEWAY, 0, "daily", 100 * USD)
    _, org = spend.set_limit(SCOPE_ORG, ctx.org_id, "weekly", 50 * USD)
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD)
    other = setup_key(accounts, org="other")
    _, elsewhere = spend.set_limit(SCOPE_KEY, other.key_id, "monthly", 1 * USD)  # not this request's

    books.reserve(ctx, "req", 3 * USD, now=JAN_31)
    for limit in (gateway, org, key):
        assert [row[1:] for row in counter(engine, limit.id)] == [(0, 3 * USD)]
    assert counter(engine, elsewhere.id) == []

    assert books.settle("req", entry(ctx, 2 * USD, created_at=JAN_31))
    for limit in (gateway, org, key):
        assert [row[1:] for row in counter(engine, limit.id)] == [(2 * USD, 0)]
    assert counter(engine, key.id)[0][0] == datetime(2026, 1, 1, tzinfo=UTC)
    assert counter(engine, gateway.id)[0][0] == datetime(2026, 1, 31, tzinfo=UTC)
    assert counter(engine, org.id)[0][0] == datetime(2026, 1, 26, tzinfo=UTC)  # that week's Monday


def test_settle_counts_in_the_period_the_reservation_was_made_in(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine
) -> None:
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD)
    books.reserve(ctx, "late-january", 3 * USD, now=JAN_31)
    books.settle("late-january", entry(ctx, 2 * USD, created_at=FEB_1))  # ends in February
    books.reserve(ctx, "february", 1 * USD, now=FEB_1)
    assert counter(engine, key.id) == [
        (datetime(2026, 1, 1, tzinfo=UTC), 2 * USD, 0),
        (datetime(2026, 2, 1, tzinfo=UTC), 0, 1 * USD),
    ]


def test_a_period_refuses_what_would_pass_its_cap_and_a_new_period_starts_fresh(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine
) -> None:
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", 5 * USD)
    books.reserve(ctx, "a", 3 * USD, now=JAN_31)
    books.reserve(ctx, "b", 2 * USD, now=JAN_31)  # exactly the cap: held
    with pytest.raises(InsufficientQuotaError) as refused:
        books.reserve(ctx, "c", 1, now=JAN_31)
    assert refused.value.status == 402
    books.reserve(ctx, "next-day", 5 * USD, now=FEB_1)
    with pytest.raises(InsufficientQuotaError):
        books.reserve(ctx, "too-big", 5 * USD + 1, now=datetime(2026, 2, 2, tzinfo=UTC))  # alone over the cap
    assert [row[1:] for row in counter(engine, key.id)] == [(0, 5 * USD), (0, 5 * USD)]


def test_the_refusal_names_the_limit_what_is_left_and_when_it_resets(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine
) -> None:
    _, org = spend.set_limit(SCOPE_ORG, ctx.org_id, "monthly", 5 * USD)
    books.reserve(ctx, "spent", 4 * USD, now=JAN_31)
    books.settle("spent", entry(ctx, 3 * USD, created_at=JAN_31))
    books.reserve(ctx, "held", 1 * USD, now=JAN_31)
    with pytest.raises(InsufficientQuotaError) as refused:
        books.reserve(ctx, "refused", 2 * USD, now=JAN_31)
    assert str(refused.value) == (
        "This request may cost up to $2.000000 (its input plus max_tokens of output), but the monthly spend limit "
        f"of organization 'acme' ($5.000000 a month, {org.public_id}) has $1.000000 left this month ($3.000000 "
        "spent, $1.000000 held by requests in flight); it resets at 2026-02-01T00:00:00Z. Ask your administrator "
        "to raise the limit (ezat-compat spend-limits set), or lower max_tokens."
    )
    with engine.connect() as conn:  # refused: nothing held, no reservation
        assert (
            conn.execute(select(reservations.c.request_id).where(reservations.c.request_id == "refused")).first()
            is None
        )
    assert [row[1:] for row in counter(engine, org.id)] == [(3 * USD, 1 * USD)]


def test_the_reset_time_is_written_in_the_configured_zone(
    engine: Engine, hot_path: HotPath, ctx: AuthContext, tmp_path: Any
) -> None:
    spend = SpendLimits(engine, zone=time_zone("Europe/Paris"))
    books = Ledger(engine, hot_path, journal=Journal(tmp_path / "j"), spend=spend)
    spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", 1 * USD)
    with pytest.raises(InsufficientQuotaError, match=r"it resets at 2026-02-01T00:00:00\+01:00\."):
        books.reserve(ctx, "r", 2 * USD, now=datetime(2026, 1, 31, 22, 0, tzinfo=UTC))  # 23:00 in Paris


def test_check_funds_refuses_what_a_limit_has_no_room_for(books: Ledger, spend: SpendLimits, ctx: AuthContext) -> None:
    spend.set_limit(SCOPE_GATEWAY, 0, "monthly", 1 * USD)
    books.check_funds(ctx, 1 * USD)
    with pytest.raises(InsufficientQuotaError, match="the monthly spend limit of the gateway"):
        books.check_funds(ctx, 1 * USD + 1)


def test_an_explicit_no_limit_counts_the_spend_and_never_refuses(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine
) -> None:
    _, unlimited = spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", None)
    books.reserve(ctx, "big", 900 * USD, now=JAN_31)
    books.settle("big", entry(ctx, 800 * USD, created_at=JAN_31))
    assert [row[1:] for row in counter(engine, unlimited.id)] == [(800 * USD, 0)]


# ---------------------------------------------------------------- no hold left


def test_the_sweep_gives_the_holds_back_and_a_late_settle_counts_now(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine
) -> None:
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD)
    _, org = spend.set_limit(SCOPE_ORG, ctx.org_id, "daily", 10 * USD)
    books.reserve(ctx, "stale", 4 * USD, now=JAN_31)
    books.reserve(ctx, "fresh", 1 * USD, now=FEB_1)
    assert books.sweep_stale(timedelta(minutes=1), FEB_1) == 1
    assert [row[1:] for row in counter(engine, key.id)] == [(0, 0), (0, 1 * USD)]
    # The swept request ends after all: its cost counts in the periods current when it settles.
    assert books.settle("stale", entry(ctx, 3 * USD, created_at=FEB_1))
    assert [row[1:] for row in counter(engine, key.id)] == [(0, 0), (3 * USD, 1 * USD)]
    assert [row[1:] for row in counter(engine, org.id)] == [(0, 0), (3 * USD, 1 * USD)]


def test_a_dead_workers_release_gives_the_holds_back(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine
) -> None:
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD)
    books.reserve(ctx, "dead-1", 4 * USD, now=JAN_31, worker="host:boot:1:2:3")
    books.reserve(ctx, "dead-2", 1 * USD, now=FEB_1, worker="host:boot:1:2:3")
    books.reserve(ctx, "alive", 2 * USD, now=FEB_1, worker="host:boot:1:9:3")
    assert sorted(books.release_worker("host:boot:1:2:")) == ["dead-1", "dead-2"]
    assert [row[1:] for row in counter(engine, key.id)] == [(0, 0), (0, 2 * USD)]


def test_a_journaled_settlement_moves_the_hold_when_replayed(
    engine: Engine, hot_path: HotPath, spend: SpendLimits, ctx: AuthContext, tmp_path: Any
) -> None:
    journal = Journal(tmp_path / "journal")
    books = Ledger(engine, hot_path, journal=journal, spend=spend)
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD)
    books.reserve(ctx, "r", 4 * USD, now=JAN_31)
    down = Down(hot_path)
    offline = Ledger(engine, down, journal=journal, spend=spend)  # type: ignore[arg-type]
    assert offline.settle_durably("r", entry(ctx, 3 * USD, created_at=FEB_1)) is False
    assert [row[1:] for row in counter(engine, key.id)] == [(0, 4 * USD)]
    report = books.replay()
    assert report.applied == 1
    assert [row[1:] for row in counter(engine, key.id)] == [(3 * USD, 0)]
    assert books.replay().applied == 0  # once


def test_a_deleted_limit_lets_its_holders_settle(books: Ledger, spend: SpendLimits, ctx: AuthContext) -> None:
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD)
    books.reserve(ctx, "r", 4 * USD, now=JAN_31)
    spend.delete(key.public_id)
    assert books.settle("r", entry(ctx, 3 * USD, created_at=JAN_31))
    books.reserve(ctx, "after", 400 * USD, now=JAN_31)  # no limit any more, at once in this process


# ---------------------------------------------------------------- changes and the snapshot


def test_a_change_elsewhere_applies_within_a_second(
    books: Ledger, engine: Engine, ctx: AuthContext, clock: Clock
) -> None:
    books.reserve(ctx, "before", 5 * USD, now=JAN_31)
    other_worker = SpendLimits(engine)
    other_worker.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 1 * USD)
    books.reserve(ctx, "stale-snapshot", 5 * USD, now=JAN_31)  # this process hasn't looked yet
    clock.now += REFRESH_S
    with pytest.raises(InsufficientQuotaError):
        books.reserve(ctx, "refused", 5 * USD, now=JAN_31)


def test_set_is_an_upsert_on_scope_and_period(
    spend: SpendLimits, ctx: AuthContext, books: Ledger, engine: Engine
) -> None:
    before, first = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD, now=JAN_31)
    assert before is None and first.public_id.startswith("spl_") and first.scope_name == ctx.key_public_id
    books.reserve(ctx, "r", 2 * USD, now=JAN_31)
    previous, second = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 20 * USD, now=FEB_1)
    assert previous == first
    assert (second.id, second.public_id, second.created_at) == (first.id, first.public_id, first.created_at)
    assert (second.amount_micros, second.updated_at) == (20 * USD, FEB_1)
    assert [row[1:] for row in counter(engine, first.id)] == [(0, 2 * USD)]  # the period's spend stays
    _, daily = spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", 1 * USD)
    assert daily.id != first.id
    assert [s.public_id for s in spend.list_limits()] == [daily.public_id, first.public_id]


@pytest.mark.parametrize(
    ("amount", "message"),
    [(10_001, "whole number of cents"), (-1, "non-negative"), (True, "non-negative")],
)
def test_set_refuses_bad_amounts(spend: SpendLimits, amount: Any, message: str) -> None:
    from ezat_compat.store.accounts import StoreError

    with pytest.raises(StoreError, match=message):
        spend.set_limit(SCOPE_GATEWAY, 0, "daily", amount)


# ---------------------------------------------------------------- concurrency


def test_concurrent_reserves_never_pass_the_cap(
    books: Ledger, spend: SpendLimits, ctx: AuthContext, engine: Engine, db_url: str
) -> None:
    """Threads of two "workers" (two ledgers, one database) race for one key's daily cap."""
    _, key = spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", 10 * USD)
    _, org = spend.set_limit(SCOPE_ORG, ctx.org_id, "monthly", 7 * USD)
    held: list[str] = []
    refused: list[str] = []
    barrier = threading.Barrier(8)

    def run(worker: Ledger, name: str) -> Callable[[], None]:
        def go() -> None:
            barrier.wait()
            for i in range(10):
                request_id = f"{name}-{i}"
                try:
                    worker.reserve(ctx, request_id, USD // 4, now=JAN_31)
                except InsufficientQuotaError:
                    refused.append(request_id)
                else:
                    held.append(request_id)

        return go

    threads = [threading.Thread(target=run(books, f"t{n}")) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(held) == 28 and len(refused) == 52  # the org's 7 USD at 0.25 each
    assert [row[1:] for row in counter(engine, org.id)] == [(0, 7 * USD)]
    assert [row[1:] for row in counter(engine, key.id)] == [(0, 7 * USD)]
    for request_id in held:
        books.settle(request_id, entry(ctx, USD // 5, created_at=JAN_31))
    assert [row[1:] for row in counter(engine, org.id)] == [(28 * USD // 5, 0)]
    assert [row[1:] for row in counter(engine, key.id)] == [(28 * USD // 5, 0)]
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.request_id)).first() is None
    assert to_epoch_micros(counter(engine, key.id)[0][0]) == to_epoch_micros(datetime(2026, 1, 31, tzinfo=UTC))
