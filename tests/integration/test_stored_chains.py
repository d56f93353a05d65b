"""Stored responses as chains and storage totals on a real database, SQLite and PostgreSQL
(store/responses.py, store/threads.py, store/quota.py, migration 0007): a continue keeps only
what it adds and reads the chain back within its bounds; ``input_items`` reads one page; each
organisation's totals follow every write; rows stored before 0007 keep working."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, event, func, make_url, select, text

from ezat_compat.store import responses as responses_module
from ezat_compat.store.db import alembic_config, locked_connection, make_engine, migrate
from ezat_compat.store.hotpath import make_hot_path
from ezat_compat.store.quota import MIB, StorageQuota
from ezat_compat.store.responses import (
    BrokenChainError,
    LongChainError,
    ResponseStore,
    put_tx,
)
from ezat_compat.store.tables import response_parts, responses
from ezat_compat.store.threads import LongThreadError, ThreadStore
from ezat_compat.translate.item_references import item_key
from ezat_compat.translate.responses_items import input_item_id

pytestmark = pytest.mark.integration

NOW = 1_750_000_000.0
TTL = 30 * 86400.0
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A database nobody else uses: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ezat.db'}"
        return
    base = request.getfixturevalue("postgres_url")
    schema = f"ezat_chains_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield (
            make_url(base)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    migrate(eng)
    yield eng
    eng.dispose()


@pytest.fixture(params=["engine", "hot path"])
def store(engine: Engine, request: pytest.FixtureRequest) -> Iterator[ResponseStore]:
    hot = make_hot_path(engine) if request.param == "hot path" else None
    yield ResponseStore(engine, TTL, hot=hot)
    if hot is not None:
        hot.close()


def _never(exc: BaseException) -> None:
    raise AssertionError(f"a write failed: {exc!r}")


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def response(n: int, answer: str = "ok") -> dict[str, Any]:
    rid = f"resp_{uuid.UUID(int=n)}"
    return {"id": rid, "object": "response", "output": [{"type": "message", "role": "assistant", "content": answer}]}


def turns(store: ResponseStore, count: int, *, size: int = 10, org: int = 1, at: float = NOW) -> list[str]:
    """``count`` responses, each continuing the one before with one item of ``size`` characters."""
    ids: list[str] = []
    for n in range(count):
        made = response(n + 1, f"a{n}")
        store.put(org, made, [user(f"{n}:" + "x" * size)], 0, False, at, previous_id=ids[-1] if ids else None)
        ids.append(made["id"])
    return ids


def rows(engine: Engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql)).all())


def totals(engine: Engine) -> dict[int, tuple[int, int]]:
    """Each organisation's totals as kept, checked against what its rows hold."""
    kept = {r.org_id: (r.stored_bytes, r.stored_count) for r in rows(engine, "SELECT * FROM storage_usage")}
    summed: dict[int, list[int]] = {}
    for table in ("responses", "message_threads"):
        for org_id, size, n in rows(engine, f"SELECT org_id, SUM(stored_bytes), COUNT(*) FROM {table} GROUP BY org_id"):
            entry = summed.setdefault(org_id, [0, 0])
            entry[0] += int(size)
            entry[1] += int(n)
    assert {org: tuple(v) for org, v in summed.items()} == {org: v for org, v in kept.items() if v != (0, 0)}
    return kept


# ---------------------------------------------------------------- chains


def test_a_continue_keeps_only_what_it_adds_and_reads_the_whole_conversation_back(
    store: ResponseStore, engine: Engine
) -> None:
    first, second, third = turns(store, 3)
    found = store.get(1, third, NOW + 1)
    assert found is not None
    expected = [user("0:" + "x" * 10), response(1, "a0")["output"][0], user("1:" + "x" * 10)]
    assert found.context == [*expected, response(2, "a1")["output"][0], user("2:" + "x" * 10)]
    assert found.input == [user("2:" + "x" * 10)] and found.response == response(3, "a2")
    kept = {r.response_id: r for r in rows(engine, "SELECT response_id, context, previous_id FROM responses")}
    assert kept[third].previous_id == second and kept[first].previous_id is None
    assert all(r.context.count('"role"') == 1 for r in kept.values())  # each holds its own input only
    assert store.get(2, third, NOW + 1) is None  # another organisation's


def test_storage_grows_with_what_each_turn_adds(store: ResponseStore, engine: Engine) -> None:
    """Twenty one-word turns after a 1 MB first input: about 20 small rows more, not 20 MB."""
    big = response(100)
    store.put(1, big, [user("y" * MIB)], 0, False, NOW)
    previous = big["id"]
    for n in range(20):
        made = response(200 + n)
        store.put(1, made, [user("one word")], 0, False, NOW, previous_id=previous)
        previous = made["id"]
    used_bytes, used_count = store.usage(1)
    assert used_count == 21 and MIB < used_bytes < MIB + 20 * 1024
    found = store.get(1, previous, NOW + 1)
    assert found is not None and len(found.continuation()) == 42


def test_a_deleted_or_expired_link_breaks_the_chain(store: ResponseStore) -> None:
    first, second, third = turns(store, 3)
    assert store.delete(1, second, NOW) is True
    with pytest.raises(BrokenChainError):
        store.get(1, third, NOW + 1)
    assert store.get(1, first, NOW + 1) is not None  # the ones before it are whole
    assert store.get(1, third, NOW + 1, context=False) is not None  # and it can still be retrieved


def test_a_link_that_expired_first_breaks_the_chain(engine: Engine) -> None:
    """A continue moves its chain's expiry only when it lags by a sixteenth of the TTL: within
    that, the first response may expire before the second."""
    store = ResponseStore(engine, 16.0)
    first = response(1)
    store.put(1, first, [user("one")], 0, False, NOW)
    second = response(2)
    store.put(1, second, [user("two")], 0, False, NOW + 0.5, previous_id=first["id"])
    assert store.get(1, second["id"], NOW + 15.9) is not None
    with pytest.raises(BrokenChainError):
        store.get(1, second["id"], NOW + 16.2)


def test_a_conversation_over_its_bounds_is_refused_before_it_is_parsed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = ResponseStore(engine, TTL, max_chain_bytes=3000)
    ids = turns(small, 12, size=200)
    assert small.get(1, ids[3], NOW + 1) is not None
    with pytest.raises(LongChainError) as refused:
        small.get(1, ids[-1], NOW + 1)
    assert refused.value.limit == 3000
    assert small.get(1, ids[-1], NOW + 1, context=False) is not None
    monkeypatch.setattr(responses_module, "MAX_LINKS", 3)
    roomy = ResponseStore(engine, TTL)
    assert roomy.get(1, ids[3], NOW + 1) is not None  # four responses: three links
    with pytest.raises(LongChainError):
        roomy.get(1, ids[4], NOW + 1)


def test_a_continue_keeps_its_chain_as_long_as_itself(store: ResponseStore, engine: Engine) -> None:
    def expiry(rid: str) -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(select(responses.c.expires_at).where(responses.c.response_id == rid))
                .scalar_one()
                .timestamp()
            )

    first, second = turns(store, 2)
    assert expiry(first) == int(NOW + TTL)  # a continue soon after moves nothing (one row written)
    later = response(9)
    store.put(1, later, [user("a month on")], 0, False, NOW + TTL - 60, previous_id=second)
    assert expiry(first) == expiry(second) == expiry(later["id"]) == int(NOW + 2 * TTL - 60)
    found = store.get(1, later["id"], NOW + TTL + 3600)
    assert found is not None and len(found.continuation()) == 6


# ---------------------------------------------------------------- input pages


ITEMS: list[dict[str, Any]] = [
    user("plain"),
    {"id": "dup", "type": "message", "role": "user", "content": "Tōkyō \U0001f600 \u2028 ünïcödé"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"id": "dup", "type": "function_call_output", "call_id": "c1", "output": "a\ud800b"},
    {"id": "own", "role": "assistant", "content": "日本語のテキスト"},
    {"role": "user", "content": [{"type": "input_text", "text": '"quoted" \\ \n line'}]},
]


def whole_list(rid: str, descending: bool, limit: int, after: str | None, before: str | None) -> tuple[list[Any], bool]:
    numbered = list(enumerate(ITEMS))[::-1] if descending else list(enumerate(ITEMS))
    ids = [input_item_id(item, item_key(rid), n) for n, item in numbered]
    if after is not None:
        start = ids.index(after) + 1 if after in ids else len(ids)
        numbered, ids = numbered[start:], ids[start:]
    if before is not None and before in ids:
        numbered = numbered[: ids.index(before)]
    return numbered[:limit], len(numbered) > limit


def test_an_input_page_is_the_page_of_the_whole_list(store: ResponseStore) -> None:
    made = response(1)
    store.put(1, made, ITEMS, 0, False, NOW)
    rid = made["id"]
    cursors = [None, "nope", "dup", "own", input_item_id({}, item_key(rid), 0), input_item_id({}, item_key(rid), 5)]
    for descending in (False, True):
        for limit in (1, 2, 100):
            for after in cursors:
                for before in cursors:
                    page = store.input_page(1, rid, NOW, descending=descending, limit=limit, after=after, before=before)
                    assert page is not None
                    expected, more = whole_list(rid, descending, limit, after, before)
                    got = [(n, item) for n, item in page.items]
                    assert got == [(n, _json(item)) for n, item in expected], (descending, limit, after, before)
                    assert page.has_more is more
    assert store.input_page(2, rid, NOW, descending=True, limit=20) is None
    assert store.input_page(1, rid, NOW + TTL, descending=True, limit=20) is None


def _json(item: dict[str, Any]) -> Any:
    import json

    return json.loads(json.dumps(item))


def _statements(engine: Engine, run: Any) -> list[str]:
    ran: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        ran.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    return ran


def test_an_input_page_reads_only_its_items(engine: Engine) -> None:
    """A 50,000-item input (2 MB) is kept in parts: a page reads the part that holds it, never
    the input whole; a short input is read with ``substr``."""
    store = ResponseStore(engine, TTL)
    made, short = response(1), response(2)
    store.put(1, made, [user(f"item {n}") for n in range(50_000)], 0, False, NOW)
    store.put(1, short, [user(f"item {n}") for n in range(100)], 0, False, NOW)
    with engine.connect() as conn:
        parts = conn.execute(select(func.count()).select_from(response_parts)).scalar_one()
    assert 6 <= parts <= 12  # about 256 kB each
    pages: list[Any] = []
    after = input_item_id({}, item_key(made["id"]), 25_000)
    ran = _statements(
        engine,
        lambda: pages.extend(
            (
                store.input_page(1, made["id"], NOW, descending=True, limit=3),
                store.input_page(1, made["id"], NOW, descending=False, limit=2, after=after),
                store.input_page(1, short["id"], NOW, descending=False, limit=1),
            )
        ),
    )
    last, middle, first = pages
    assert last is not None and [n for n, _ in last.items] == [49_999, 49_998, 49_997] and last.has_more
    assert middle is not None and [item["content"] for _, item in middle.items] == ["item 25001", "item 25002"]
    assert first is not None and first.items == [(0, user("item 0"))]
    assert not [s for s in ran if "SELECT responses.context" in s], ran
    assert len([s for s in ran if "FROM response_parts" in s]) == 2
    assert len([s for s in ran if "substr(responses.context" in s]) == 1
    found = store.get(1, made["id"], NOW + 1)  # a continue reads the parts back whole
    assert found is not None and len(found.input) == 50_000 and found.input[-1] == user("item 49999")


def test_a_long_inputs_parts_go_with_it(store: ResponseStore, engine: Engine) -> None:
    def parts() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(response_parts)).scalar_one())

    long_input = [user("z" * 100_000) for _ in range(8)]
    for n in range(3):
        store.put(1, response(n + 1), long_input, 0, False, NOW - TTL + n)  # each expires at NOW + n
    assert parts() > 3
    store.put(1, response(1), [user("short now")], 0, False, NOW)  # put again: its parts go
    assert store.delete(1, response(2)["id"], NOW) is True
    assert store.purge(NOW + 2.5) == 1  # the third, expired
    assert parts() == 0
    assert totals(engine)[1] == (int(rows(engine, "SELECT stored_bytes FROM responses")[0][0]), 1)


# ---------------------------------------------------------------- totals and quotas


def test_the_totals_follow_every_write(engine: Engine) -> None:
    hot = make_hot_path(engine)
    try:
        store = ResponseStore(engine, TTL, hot=hot, purge_batch=2)
        threads = ThreadStore(engine, TTL, hot=hot)
        ids = turns(store, 3)
        store.put(2, response(7), [user("other org")], 0, False, NOW - TTL)  # expires at NOW
        assert totals(engine)[1][1] == 3
        store.put(1, response(1, "answered again"), [user("a longer input than before")], 0, False, NOW)
        assert totals(engine)[1][1] == 3  # replaced, not added
        before = totals(engine)
        row = dict(rows(engine, f"SELECT * FROM responses WHERE response_id = '{ids[2]}'")[0]._mapping)
        hot.write(put_tx, {**row, "created_at": int(NOW * 1e6), "expires_at": int((NOW + TTL) * 1e6)})
        assert totals(engine) == before  # a journaled put applied twice counts once
        rider = threads.put(
            1,
            "msg_a",
            previous_id=None,
            root_id="msg_a",
            fields=None,
            messages=[user("q")],
            now=NOW,
            failed=_never,
        )
        assert rider is not None
        hot.write(rider.work, rider.params)
        hot.write(rider.work, rider.params)  # a turn kept twice counts once
        assert totals(engine)[1][1] == 4
        assert store.delete(1, ids[0], NOW) is True
        assert totals(engine)[1][1] == 3
        assert store.purge(NOW + 1) == 1  # org 2's expired response
        assert 2 not in {org for org, v in totals(engine).items() if v != (0, 0)}
        assert store.purge(NOW + TTL + 1) == 2 and threads.purge(NOW + TTL + 1) == 1
        assert totals(engine)[1] == (0, 0)
    finally:
        hot.close()


def test_the_quota_is_read_per_organisation(engine: Engine) -> None:
    store = ResponseStore(engine, TTL, quota=StorageQuota(2000, 3))
    assert store.over_quota(1) is None
    store.put(1, response(1), [user("x" * 2500)], 0, False, NOW)
    over = store.over_quota(1)
    assert over is not None and over.setting == "[responses] org_quota_mb"
    assert store.over_quota(2) is None  # another organisation is unaffected
    for n in range(3):
        store.put(2, response(10 + n), [user("y")], 0, False, NOW)
    over = store.over_quota(2)
    assert over is not None and over.setting == "[responses] org_quota_count"
    threads = ThreadStore(engine, TTL, quota=StorageQuota(2000, 3))
    assert threads.over_quota(2) is not None  # one quota for responses and threads
    assert ResponseStore(engine, TTL, quota=StorageQuota(0, 0)).over_quota(2) is None
    assert store.delete(2, response(10)["id"], NOW) and store.over_quota(2) is None  # a delete frees it


def test_an_organisation_under_its_quota_is_read_again_a_second_later(engine: Engine) -> None:
    store = ResponseStore(engine, TTL, quota=StorageQuota(2000, 0))
    assert store.over_quota(3, NOW) is None
    store.put(3, response(1), [user("x" * 2500)], 0, False, NOW)
    assert store.over_quota(3, NOW + 0.5) is None  # taken to be under for a second: no read
    assert store.over_quota(3, NOW + 1.5) is not None
    assert store.delete(3, response(1)["id"], NOW + 1.6)
    assert store.over_quota(3, NOW + 1.7) is None  # a refusal is never kept: freed at once


def test_a_thread_over_its_bound_is_refused_before_it_is_parsed(engine: Engine) -> None:
    threads = ThreadStore(engine, TTL, max_chain_bytes=2000)
    previous = None
    for n in range(10):
        threads.put(
            1,
            f"msg_{n}",
            previous_id=previous,
            root_id="msg_0",
            fields=None if previous else {},
            messages=[user("z" * 300)],
            now=NOW,
            failed=_never,
        )
        previous = f"msg_{n}"
    assert threads.get(1, "msg_3", NOW + 1) is not None
    with pytest.raises(LongThreadError):
        threads.get(1, "msg_9", NOW + 1)


# ---------------------------------------------------------------- rows stored before 0007


def _migrate_to(engine: Engine, revision: str, *, down: bool = False) -> None:
    with locked_connection(engine) as conn:
        (command.downgrade if down else command.upgrade)(alembic_config(conn), revision)


def test_rows_stored_before_0007_keep_working(db_url: str) -> None:
    eng = make_engine(db_url)
    try:
        _migrate_to(eng, "0006")
        old = response(1, "old answer")
        whole = [
            user("earlier"),
            {"type": "message", "role": "assistant", "content": "E"},
            user("own 0"),
            user("own 1"),
        ]
        with eng.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO responses (org_id, response_id, created_at, expires_at, context, input_start, "
                    "response, encrypted) "
                    "VALUES (1, :rid, :created, :expires, :context, 2, :response, false)"
                ),
                {
                    "rid": old["id"],
                    "created": int(NOW * 1e6),
                    "expires": int((NOW + TTL) * 1e6),
                    "context": _dumps(whole),
                    "response": _dumps(old),
                },
            )
            conn.execute(
                text(
                    "INSERT INTO message_threads (org_id, message_id, previous_id, root_id, created_at, expires_at, "
                    "fields, messages) "
                    "VALUES (1, 'msg_old', NULL, 'msg_old', :created, :expires, '{}', :messages)"
                ),
                {"created": int(NOW * 1e6), "expires": int((NOW + TTL) * 1e6), "messages": _dumps([user("q")])},
            )
        migrate(eng)
        used = totals(eng)[1]
        assert used[1] == 2 and used[0] == len(_dumps(whole)) + len(_dumps(old)) + len(_dumps([user("q")])) + 2
        store = ResponseStore(eng, TTL)
        found = store.get(1, old["id"], NOW + 1)
        assert found is not None and found.context == whole and found.input == whole[2:]
        page = store.input_page(
            1, old["id"], NOW, descending=False, limit=1, after=input_item_id({}, item_key(old["id"]), 0)
        )
        assert page is not None and page.items == [(1, user("own 1"))] and not page.has_more
        made = response(2)
        store.put(1, made, [user("new")], 0, False, NOW, previous_id=old["id"])
        after = store.get(1, made["id"], NOW + 1)
        assert after is not None and after.continuation() == [*whole, *old["output"], user("new"), *made["output"]]
        found_thread = ThreadStore(eng, TTL).get(1, "msg_old", NOW + 1)
        assert found_thread is not None and found_thread.messages == [user("q")]
        _migrate_to(eng, "0006", down=True)  # the chained row goes; the old one stays
        with eng.connect() as conn:
            assert [r[0] for r in conn.execute(text("SELECT response_id FROM responses"))] == [old["id"]]
        migrate(eng)
    finally:
        eng.dispose()


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_a_put_journaled_before_0007_is_written_and_counted(engine: Engine) -> None:
    hot = make_hot_path(engine)
    try:
        made = response(3)
        old_params = {
            "org_id": 1,
            "response_id": made["id"],
            "created_at": int(NOW * 1e6),
            "expires_at": int((NOW + TTL) * 1e6),
            "context": _dumps([user("journaled")]),
            "input_start": 0,
            "response": _dumps(made),
            "encrypted": False,
        }
        hot.write(put_tx, old_params)
        assert totals(engine)[1][1] == 1
        store = ResponseStore(engine, TTL)
        found = store.get(1, made["id"], NOW + 1)
        assert found is not None and found.input == [user("journaled")]
        page = store.input_page(1, made["id"], NOW, descending=True, limit=5)
        assert page is not None and page.items == [(0, user("journaled"))]
    finally:
        hot.close()
