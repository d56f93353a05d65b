"""Stored responses on a real database (docs/responses.md, "Stored responses"): kept per
organisation until the time-to-live, deleted, purged; SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select

from ezat_compat.store.db import make_engine, migrate
from ezat_compat.store.hotpath import make_hot_path
from ezat_compat.store.responses import ResponseStore
from ezat_compat.store.tables import responses
from tests.support.stores import db_url  # noqa: F401 - the SQLite / PostgreSQL fixture

NOW = 1_750_000_000.0
TTL = 3600.0
RESPONSE = {"id": "resp_1", "object": "response", "output": [{"type": "message", "content": []}]}
CONTEXT = [{"role": "user", "content": "earlier"}, {"role": "user", "content": "now"}]


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:  # noqa: F811
    eng = make_engine(db_url)
    migrate(eng)
    yield eng
    eng.dispose()


@pytest.fixture(params=["engine", "hot path"])
def store(engine: Engine, request: pytest.FixtureRequest) -> Iterator[ResponseStore]:
    """Puts through the engine, or through the gateway's hot path (on SQLite, sqlite3 directly
    in the ledger's group transactions): the same rows either way."""
    hot = make_hot_path(engine) if request.param == "hot path" else None
    yield ResponseStore(engine, TTL, hot=hot)
    if hot is not None:
        hot.close()


def test_put_and_get_per_organisation(store: ResponseStore) -> None:
    store.put(1, RESPONSE, CONTEXT, 1, True, NOW)
    found = store.get(1, "resp_1", NOW + 1)
    assert found is not None
    assert found.response == RESPONSE and found.context == CONTEXT and found.encrypted is True
    assert found.input == CONTEXT[1:]
    assert found.continuation() == [*CONTEXT, *RESPONSE["output"]]
    assert store.get(2, "resp_1", NOW + 1) is None  # another organisation's id is not found


def test_a_retrieve_reads_the_response_without_its_conversation(store: ResponseStore) -> None:
    store.put(1, RESPONSE, CONTEXT, 1, True, NOW)
    found = store.get(1, "resp_1", NOW + 1, context=False)
    assert found is not None and found.response == RESPONSE and found.encrypted is True
    assert found.context == [] and found.input == []  # the conversation was never read
    assert store.get(2, "resp_1", NOW + 1, context=False) is None


def test_expired_responses_are_not_found_and_purged(store: ResponseStore, engine: Engine) -> None:
    store.put(1, RESPONSE, CONTEXT, 0, False, NOW)
    assert store.get(1, "resp_1", NOW + TTL - 1) is not None
    assert store.get(1, "resp_1", NOW + TTL) is None
    assert store.delete(1, "resp_1", NOW + TTL) is False
    assert store.purge(NOW + TTL) == 1
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(responses)).scalar() == 0


def test_a_purge_takes_only_expired_rows_by_their_whole_key(store: ResponseStore, engine: Engine) -> None:
    """The same response id in two organisations: the expired one goes, the live one stays."""
    store.put(1, RESPONSE, CONTEXT, 0, False, NOW)
    store.put(2, RESPONSE, CONTEXT, 0, False, NOW - TTL)  # expires at NOW
    assert store.purge(NOW) == 1
    with engine.connect() as conn:
        left = conn.execute(select(responses.c.org_id)).scalars().all()
    assert left == [1]
    assert store.get(1, "resp_1", NOW) is not None


def test_a_purge_searches_the_expiry_index_not_the_table(engine: Engine) -> None:
    """However large the table, a purge is a bounded batch of index searches: SQLite's plan for
    the very statement the purge ran has no scan of the table."""
    if engine.dialect.name != "sqlite":
        pytest.skip("the query plan checked is SQLite's")
    store = ResponseStore(engine, TTL, purge_batch=3)
    for i in range(5):
        store.put(1, {**RESPONSE, "id": f"resp_{i}"}, CONTEXT, 0, False, NOW - TTL)
    ran: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if statement.startswith("DELETE FROM responses"):
            ran.append((statement, params))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert store.purge(NOW) == 3 and store.purge(NOW) == 2
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    statement, params = ran[0]
    with engine.connect() as conn:
        steps = [row[3] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params)]
    assert steps and not [s for s in steps if s.startswith("SCAN")], steps
    assert any("ix_responses_expires_at" in s for s in steps), steps


def test_outputs_of_the_referenced_responses_in_one_statement(store: ResponseStore, engine: Engine) -> None:
    """Item references read the outputs of every response they name at once: the
    organisation's live ones only (another organisation's or an expired one is absent)."""
    second = {**RESPONSE, "id": "resp_2", "output": [{"id": "msg_2", "type": "message", "content": []}]}
    store.put(1, RESPONSE, CONTEXT, 0, False, NOW)
    store.put(1, second, CONTEXT, 0, False, NOW - TTL + 10)  # expires at NOW + 10
    store.put(2, {**RESPONSE, "id": "resp_3"}, CONTEXT, 0, False, NOW)  # another organisation's
    ran: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            ran.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        found = store.outputs(1, ["resp_1", "resp_2", "resp_3", "resp_9"], NOW + 1)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert found == {"resp_1": RESPONSE["output"], "resp_2": second["output"]}
    assert len(ran) == 1
    assert store.outputs(1, ["resp_1", "resp_2"], NOW + 10) == {"resp_1": RESPONSE["output"]}
    assert store.outputs(1, [], NOW) == {}


def test_delete_only_the_organisations_own(store: ResponseStore) -> None:
    store.put(1, RESPONSE, CONTEXT, 0, False, NOW)
    assert store.delete(2, "resp_1", NOW) is False
    assert store.delete(1, "resp_1", NOW) is True
    assert store.get(1, "resp_1", NOW) is None
    assert store.delete(1, "resp_1", NOW) is False


def test_put_again_replaces(store: ResponseStore) -> None:
    store.put(1, RESPONSE, CONTEXT, 0, False, NOW)
    store.put(1, {**RESPONSE, "status": "completed"}, CONTEXT[:1], 0, False, NOW)
    found = store.get(1, "resp_1", NOW)
    assert found is not None and found.response["status"] == "completed" and found.context == CONTEXT[:1]


def test_text_round_trips_exactly(store: ResponseStore) -> None:
    odd = {**RESPONSE, "output": [{"type": "reasoning", "encrypted_content": "ezs1.Tōkyō\u2028\U0001f600\u0000"}]}
    store.put(1, odd, CONTEXT, 0, True, NOW)
    found = store.get(1, "resp_1", NOW)
    assert found is not None and found.response == odd
    lone = {**RESPONSE, "output": [{"type": "message", "content": [{"type": "output_text", "text": "a\ud800b"}]}]}
    store.put(1, lone, CONTEXT, 0, False, NOW)  # a lone surrogate from upstream is kept, escaped
    found = store.get(1, "resp_1", NOW)
    assert found is not None and found.response == lone


def test_a_database_that_cannot_answer_is_503(tmp_path) -> None:
    from ezat_compat.store.hotpath import DatabaseUnavailableError

    store = ResponseStore(make_engine(f"sqlite:///{tmp_path / 'no-such-folder' / 'ezat.db'}"), TTL)
    with pytest.raises(DatabaseUnavailableError):
        store.get(1, "resp_1", NOW)
    with pytest.raises(DatabaseUnavailableError):
        store.delete(1, "resp_1", NOW)
    with pytest.raises(DatabaseUnavailableError):
        store.outputs(1, ["resp_1"], NOW)
