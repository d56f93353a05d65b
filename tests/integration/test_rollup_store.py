"""The usage rollup on a real database (store/rollup.py), on SQLite and on PostgreSQL: the fold sums
exactly what the ledger holds (``ezat-compat usage --json``'s rows), exactly once, late rows
included; PostgreSQL's ids that become visible out of order are caught; folds never overlap; and
reads group, filter, order and page as a report asks."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, text

from ezat_compat.domain import Usage
from ezat_compat.store.accounts import Accounts, AuthContext
from ezat_compat.store.db import write_engine
from ezat_compat.store.ledger import Ledger, LedgerEntry
from ezat_compat.store.rollup import DAY, HOLE_TTL, HOUR, FoldReport, Rollup, Slice, bucket_start
from ezat_compat.store.tables import (
    api_keys,
    ledger,
    orgs,
    to_epoch_micros,
    usage_1d,
    usage_1h,
    usage_1m,
    usage_rollup_holes,
)
from tests.support.stores import NOW, count

# The fixtures on the SQLite / PostgreSQL databases: pytest finds them among the module's names.
from tests.support.stores import accounts as accounts
from tests.support.stores import books as books
from tests.support.stores import db_url as db_url
from tests.support.stores import engine as engine
from tests.support.stores import hot_path as hot_path

MODELS = ("claude-sonnet-5-5", "claude-haiku-5", "")
START = datetime(2027, 1, 3, tzinfo=UTC)


def keys(accounts: Accounts, engine: Engine) -> list[AuthContext]:
    """Two organisations with two keys each (read from the tables: no authentication needed)."""
    for org in ("acme", "globex"):
        accounts.create_org(org, 10**12)
        for _ in range(2):
            accounts.create_key(org, now=NOW)
    query = select(api_keys.c.id, api_keys.c.public_id, orgs.c.id, orgs.c.name).join(
        orgs, orgs.c.id == api_keys.c.org_id
    )
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(api_keys.c.id)).all()
    return [AuthContext(key, public, org, name, (), None, None, None) for key, public, org, name in rows]


def settle_some(books: Ledger, ctxs: list[AuthContext], n: int, *, seed: int, days: int = 3) -> None:
    rng = random.Random(seed)
    for i in range(n):
        ctx = rng.choice(ctxs)
        model = rng.choice(MODELS)
        failed = model == ""
        books.settle(
            f"req_{seed}_{i}",
            LedgerEntry(
                created_at=START + timedelta(seconds=rng.randrange(days * 86_400)),
                org_id=ctx.org_id,
                key_id=ctx.key_id,
                endpoint="messages",
                model=model or "nope",
                canonical_model=model,
                deployment="" if failed else "primary",
                usage=Usage()
                if failed
                else Usage(
                    input_tokens=rng.randrange(5000),
                    cache_write_tokens=rng.randrange(300),
                    cache_read_tokens=rng.randrange(900),
                    output_tokens=rng.randrange(2000),
                    reasoning_tokens=rng.randrange(50),
                ),
                cost_micros=0 if failed else rng.randrange(1, 90_000),
                status=500 if failed else 200,
            ),
        )


SUMS = ("requests", "input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens", "cost_micros")


def ledger_sums(books: Ledger, width: int) -> dict[tuple[int, str, str, str], tuple[int, ...]]:
    """What ``usage --json`` lists, summed per (bucket, org, key, canonical model) by hand."""
    sums: dict[tuple[int, str, str, str], list[int]] = defaultdict(lambda: [0] * len(SUMS))
    for row in books.usage_rows():
        at = to_epoch_micros(datetime.fromisoformat(row["created_at"].replace("Z", "+00:00")))
        key = (bucket_start(at, width), row["org"], row["key_id"], row["canonical_model"])
        cost = int(Decimal(row["cost_usd"]) * 1_000_000)
        for i, value in enumerate((1, *(row[n] for n in SUMS[1:-1]), cost)):
            sums[key][i] += value
    return {k: tuple(v) for k, v in sums.items()}


def rollup_sums(engine: Engine, table: Any) -> dict[tuple[int, str, str, str], tuple[int, ...]]:
    sql = text(
        f"SELECT r.bucket, o.name, k.public_id, r.model, {', '.join('r.' + s for s in SUMS)} FROM {table.name} r "
        "JOIN orgs o ON o.id = r.org_id JOIN api_keys k ON k.id = r.key_id"
    )
    with engine.connect() as conn:
        return {(int(r[0]), r[1], r[2], r[3]): tuple(int(v) for v in r[4:]) for r in conn.execute(sql)}


def assert_exact(engine: Engine, books: Ledger) -> None:
    for table, width in ((usage_1m, 60_000_000), (usage_1h, HOUR), (usage_1d, DAY)):
        assert rollup_sums(engine, table) == ledger_sums(books, width), table.name


def test_the_fold_sums_exactly_what_usage_json_lists_at_every_width(
    engine: Engine, accounts: Accounts, books: Ledger
) -> None:
    rollup = Rollup(engine)
    settle_some(books, keys(accounts, engine), 400, seed=1)
    assert rollup.catch_up()
    assert_exact(engine, books)
    assert rollup.refreshed_at() is not None


def test_folding_in_small_batches_and_again_counts_each_row_once(
    engine: Engine, accounts: Accounts, books: Ledger
) -> None:
    rollup = Rollup(engine)
    ctxs = keys(accounts, engine)
    settle_some(books, ctxs, 120, seed=2)
    reports = []
    while not (report := rollup.fold(max_rows=7)).caught_up:
        reports.append(report)
    assert sum(r.folded for r in reports) + report.folded == 120
    assert len(reports) == 120 // 7
    assert rollup.fold().folded == 0  # nothing new: nothing added twice
    settle_some(books, ctxs, 30, seed=3)
    assert rollup.fold().folded == 30
    assert_exact(engine, books)


def test_a_fold_that_takes_the_last_rows_exactly_has_caught_up(
    engine: Engine, accounts: Accounts, books: Ledger
) -> None:
    rollup = Rollup(engine)
    settle_some(books, keys(accounts, engine), 10, seed=11)
    assert rollup.refreshed_at() is None
    assert rollup.fold(max_rows=10) == FoldReport(folded=10, caught_up=True)
    assert rollup.refreshed_at() is not None


def test_a_late_settlement_lands_in_its_old_bucket(engine: Engine, accounts: Accounts, books: Ledger) -> None:
    """A settlement replayed from the usage journal days later carries its old ``created_at``: it
    has a new id, so the next fold adds it to the old day's bucket."""
    rollup = Rollup(engine)
    ctxs = keys(accounts, engine)
    settle_some(books, ctxs, 50, seed=4)
    rollup.catch_up()
    old_day = START - timedelta(days=10)
    books.settle(
        "req_replayed",
        LedgerEntry(
            created_at=old_day + timedelta(hours=5),
            org_id=ctxs[0].org_id,
            key_id=ctxs[0].key_id,
            endpoint="messages",
            model="claude-sonnet-5-5",
            canonical_model="claude-sonnet-5-5",
            deployment="primary",
            usage=Usage(input_tokens=11, output_tokens=7),
            cost_micros=1234,
        ),
    )
    assert rollup.fold().folded == 1
    day = rollup.totals(Slice("1d", old_day, old_day + timedelta(days=1)))
    assert [(t.bucket, t.requests, t.input_tokens, t.output_tokens, t.cost_micros) for t in day] == [
        (old_day, 1, 11, 7, 1234)
    ]
    assert_exact(engine, books)


def _ledger_row(request_id: str, ctx: AuthContext, cost: int) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "created_at": START,
        "org_id": ctx.org_id,
        "key_id": ctx.key_id,
        "endpoint": "messages",
        "model": "m",
        "canonical_model": "claude-sonnet-5-5",
        "deployment": "primary",
        "input_tokens": 1,
        "cache_write_tokens": 0,
        "cache_read_tokens": 0,
        "output_tokens": 1,
        "reasoning_tokens": 0,
        "cost_micros": cost,
        "status": 200,
        "estimated": False,
    }


@pytest.mark.postgres
def test_an_id_that_commits_after_a_higher_one_is_folded_once_it_appears(
    engine: Engine, accounts: Accounts, books: Ledger
) -> None:
    """PostgreSQL: a settlement whose transaction is still open holds a lower id than one that
    committed after it started. The fold records it as a hole, folds it once it commits, and
    forgets the hole of a transaction that rolled back once ``HOLE_TTL`` has passed."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite's writer holds the write lock: its ids are never visible out of order")
    rollup = Rollup(engine)
    ctx = keys(accounts, engine)[0]
    with engine.connect() as slow, engine.connect() as doomed:
        slow_tx = slow.begin()
        slow.execute(insert(ledger).values(**_ledger_row("req_slow", ctx, 100)))  # takes an id, not committed
        doomed_tx = doomed.begin()
        doomed.execute(insert(ledger).values(**_ledger_row("req_doomed", ctx, 1000)))
        with engine.begin() as conn:
            conn.execute(insert(ledger).values(**_ledger_row("req_fast", ctx, 10)))
        first = rollup.fold()
        slow_tx.commit()
        doomed_tx.rollback()
    assert (first.folded, first.holes, first.caught_up) == (1, 2, True)
    assert rollup.fold().folded == 1
    assert count(engine, usage_rollup_holes) == 1  # the rolled-back id: it may still be in flight
    assert rollup.fold(now=datetime.now(UTC) + HOLE_TTL + timedelta(seconds=1)).folded == 0
    assert count(engine, usage_rollup_holes) == 0
    assert [t.cost_micros for t in rollup.totals(Slice("1d", START, START + timedelta(days=1)))] == [110]
    assert_exact(engine, books)


def test_folds_never_overlap(engine: Engine, accounts: Accounts, books: Ledger) -> None:
    """While one fold holds the lock, another gives up after its wait as ``busy`` (the loop tries
    again later), and folds nothing."""
    rollup = Rollup(engine)
    settle_some(books, keys(accounts, engine), 10, seed=5)
    with write_engine(engine).connect() as holder:
        if engine.dialect.name == "postgresql":
            holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": 0x657A_6174_726F_6C6C})
            holder.commit()
        else:
            holder.begin()  # BEGIN IMMEDIATE: the database's write lock
        started = time.monotonic()
        assert rollup.fold(wait_s=0.2) == FoldReport(busy=True)
        assert time.monotonic() - started >= 0.2
        if engine.dialect.name == "postgresql":
            holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": 0x657A_6174_726F_6C6C})
            holder.commit()
        else:
            holder.rollback()
    assert count(engine, usage_1m) == 0
    assert rollup.fold().folded == 10


def test_concurrent_folds_count_each_row_once(engine: Engine, accounts: Accounts, books: Ledger) -> None:
    rollup = Rollup(engine)
    ctxs = keys(accounts, engine)
    settle_some(books, ctxs, 300, seed=6)
    errors: list[BaseException] = []

    def fold_all() -> None:
        try:
            other = Rollup(engine)
            while not other.fold(max_rows=13, wait_s=5.0).caught_up:
                pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=fold_all) for _ in range(3)]
    for thread in threads:
        thread.start()
    settle_some(books, ctxs, 100, seed=7)
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    rollup.catch_up()
    assert_exact(engine, books)


def test_the_background_loop_folds_new_rows(engine: Engine, accounts: Accounts, books: Ledger) -> None:
    rollup = Rollup(engine)
    settle_some(books, keys(accounts, engine), 20, seed=8)
    rollup.start(every_s=0.05)
    try:
        deadline = time.monotonic() + 10
        while count(engine, usage_1d) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rollup.stop()
    assert_exact(engine, books)


def _grouped(books: Ledger, width: int, dims: tuple[str, ...]) -> Counter[tuple[Any, ...]]:
    """The ledger's cost per (bucket, *dims) by hand, dims among org and model."""
    sums: Counter[tuple[Any, ...]] = Counter()
    for row in books.usage_rows():
        at = to_epoch_micros(datetime.fromisoformat(row["created_at"].replace("Z", "+00:00")))
        key = (bucket_start(at, width), *(row["org"] if d == "org" else row["canonical_model"] for d in dims))
        sums[key] += int(Decimal(row["cost_usd"]) * 1_000_000)
    return sums


def test_totals_group_filter_and_page_like_a_report(engine: Engine, accounts: Accounts, books: Ledger) -> None:
    rollup = Rollup(engine)
    ctxs = keys(accounts, engine)
    settle_some(books, ctxs, 300, seed=9)
    rollup.catch_up()
    names = {ctx.org_id: ctx.org_name for ctx in ctxs}
    end = START + timedelta(days=3)

    by_hour = rollup.totals(Slice("1h", START, end, group=("org", "model")))
    got = Counter(
        {
            (to_epoch_micros(t.bucket), names[t.org_id], t.model): t.cost_micros
            for t in by_hour
            if t.bucket is not None and t.org_id is not None
        }
    )
    assert +got == +_grouped(books, HOUR, ("org", "model"))
    # Ordered by bucket, then by total tokens (highest first).
    order = [(t.bucket, -t.total_tokens) for t in by_hour]
    assert order == sorted(order)

    # Pages of 2 (limit/offset: the groups ranked first, then summed) are the rows read whole
    # (summed, then ranked), none skipped nor repeated, in any order; with buckets, and without
    # over a range that takes minutes, hours and days.
    orders = (
        ("time", True),
        ("cost_micros", True),
        ("requests", False),
        ("total_tokens", True),
        ("input_tokens", False),
    )
    [everything] = rollup.totals(Slice("1m", START, end, by_bucket=False, limit=5))
    assert everything.requests == len(books.usage_rows())
    shapes = [
        Slice("1h", START, end, group=("key",)),
        Slice("1h", START, end, group=("org", "model")),
        Slice("1m", START + timedelta(minutes=7), end - timedelta(hours=3, minutes=1), by_bucket=False, group=("key",)),
        Slice("1m", START + timedelta(minutes=7), end, by_bucket=False, group=("model",)),
    ]
    for shape in shapes:
        for order_by, descending in orders:
            whole = rollup.totals(replace(shape, order_by=order_by, descending=descending))
            assert len(whole) > 2
            paged = []
            for offset in range(0, len(whole) + 2, 2):
                paged += rollup.totals(replace(shape, order_by=order_by, descending=descending, limit=2, offset=offset))
            assert paged == whole, (shape, order_by)

    # Filters: one key, one model; no buckets: one row for the whole (minute-aligned) range.
    ctx = ctxs[1]
    start = START + timedelta(hours=5, minutes=17)
    stop = START + timedelta(days=2, hours=3, minutes=41)
    [only] = rollup.totals(
        Slice("1m", start, stop, by_bucket=False, key_ids=(ctx.key_id,), models=("claude-sonnet-5-5",))
    )
    expected = sum(
        int(Decimal(r["cost_usd"]) * 1_000_000)
        for r in books.usage_rows()
        if r["key_id"] == ctx.key_public_id
        and r["canonical_model"] == "claude-sonnet-5-5"
        and start <= datetime.fromisoformat(r["created_at"].replace("Z", "+00:00")) < stop
    )
    assert (only.bucket, only.key_id, only.cost_micros) == (None, None, expected)
    assert rollup.totals(Slice("1d", START, end, org_ids=(-1,))) == []


def test_a_schema_without_the_state_row_starts_from_nothing(engine: Engine, accounts: Accounts, books: Ledger) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM usage_rollup"))
    settle_some(books, keys(accounts, engine), 5, seed=10)
    assert Rollup(engine).fold().folded == 5
    with engine.connect() as conn:
        assert conn.execute(select(text("folded_id")).select_from(text("usage_rollup"))).scalar() == count(
            engine, ledger
        )
