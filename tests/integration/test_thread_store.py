"""Message threads kept on a real database (store/threads.py): each turn a row keyed by its reply
id, read back as the whole conversation in one statement, per organisation, until the time to
live; a turn written with its ledger row, waiting in the usage journal through an outage and
written once when the database answers again. SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from ezat_compat.store.accounts import Accounts
from ezat_compat.store.hotpath import HotPath
from ezat_compat.store.journal import Journal
from ezat_compat.store.ledger import Ledger
from ezat_compat.store.tables import ledger, message_threads
from ezat_compat.store.threads import ThreadStore
from tests.support.stores import (  # noqa: F401 - the SQLite / PostgreSQL fixtures
    Down,
    accounts,
    count,
    db_url,
    engine,
    entry,
    hot_path,
    setup_key,
)

NOW = 1_750_000_000.0
TTL = 3600.0


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def kept(store: ThreadStore, org: int, message_id: str, previous: str | None, root: str, *messages: Any) -> None:
    fields = {"system": "s"} if previous is None else None
    failures: list[BaseException] = []
    rider = store.put(
        org,
        message_id,
        previous_id=previous,
        root_id=root,
        fields=fields,
        messages=list(messages),
        now=NOW,
        failed=failures.append,
    )
    assert rider is None and failures == []


def test_a_thread_reads_back_whole_from_any_of_its_turns(engine: Engine) -> None:  # noqa: F811
    store = ThreadStore(engine, TTL)
    kept(store, 1, "msg_a", None, "msg_a", user("one"), answer("A"))
    kept(store, 1, "msg_b", "msg_a", "msg_a", user("two"), answer("B"))
    kept(store, 1, "msg_c", "msg_b", "msg_a", user("three"), answer("C"))
    found = store.get(1, "msg_c", NOW + 1)
    assert found is not None
    assert found.root_id == "msg_a" and found.fields == {"system": "s"}
    assert found.messages == [user("one"), answer("A"), user("two"), answer("B"), user("three"), answer("C")]
    middle = store.get(1, "msg_b", NOW + 1)
    assert middle is not None and middle.messages == [user("one"), answer("A"), user("two"), answer("B")]
    assert store.get(2, "msg_c", NOW + 1) is None  # another organisation's
    assert store.get(1, "msg_c", NOW + TTL + 1) is None  # expired


def test_a_turn_kept_twice_stays_as_first_kept(engine: Engine) -> None:  # noqa: F811
    store = ThreadStore(engine, TTL)
    kept(store, 1, "msg_a", None, "msg_a", user("one"), answer("A"))
    kept(store, 1, "msg_a", None, "msg_a", user("other"), answer("X"))
    found = store.get(1, "msg_a", NOW + 1)
    assert found is not None and found.messages == [user("one"), answer("A")]


def test_expired_turns_are_purged(engine: Engine) -> None:  # noqa: F811
    store = ThreadStore(engine, TTL, purge_batch=2)
    for i in range(3):
        kept(store, 1, f"msg_{i}", None, f"msg_{i}", user(str(i)), answer(str(i)))
    assert store.purge(NOW + TTL + 1) == 2
    assert store.purge(NOW + TTL + 1) == 1
    assert count(engine, message_threads) == 0


def test_a_turn_rides_with_its_ledger_row_and_waits_in_the_journal_through_an_outage(
    accounts: Accounts,  # noqa: F811
    engine: Engine,  # noqa: F811
    hot_path: HotPath,  # noqa: F811
    tmp_path: Any,
) -> None:
    ctx = setup_key(accounts, balance=1_000_000)
    down = Down(hot_path)
    books = Ledger(engine, down, journal=Journal(tmp_path / "journal"))  # type: ignore[arg-type]
    store = ThreadStore(engine, TTL, hot=down)  # type: ignore[arg-type]
    lost: list[BaseException] = []
    rider = store.put(
        ctx.org_id,
        "msg_during",
        previous_id=None,
        root_id="msg_during",
        fields={},
        messages=[user("q"), answer("a")],
        now=NOW,
        failed=lost.append,
    )
    assert rider is not None and rider.kind == "thread"
    assert books.settle_durably("during", entry(ctx, 1234), rider) is False  # journaled
    assert lost == [] and count(engine, ledger) == 0 and count(engine, message_threads) == 0

    down.down = False
    assert books.replay().applied == 1
    assert count(engine, ledger) == 1
    found = store.get(ctx.org_id, "msg_during", NOW + 1)
    assert found is not None and found.messages == [user("q"), answer("a")]
    assert books.replay().applied == 0 and count(engine, message_threads) == 1  # once


def test_a_turn_rides_in_the_settlements_transaction_on_the_hot_path(
    accounts: Accounts,  # noqa: F811
    engine: Engine,  # noqa: F811
    hot_path: HotPath,  # noqa: F811
) -> None:
    ctx = setup_key(accounts)
    books = Ledger(engine, hot_path)
    books.reserve(ctx, "req_t", 1_000)
    rider = ThreadStore(engine, TTL, hot=hot_path).put(
        ctx.org_id,
        "msg_t",
        previous_id=None,
        root_id="msg_t",
        fields=None,
        messages=[user("q")],
        now=NOW,
        failed=pytest.fail,
    )
    assert rider is not None
    assert books.settle_durably("req_t", entry(ctx, 400), rider) is True
    assert count(engine, ledger) == 1 and count(engine, message_threads) == 1
