"""The console's storage (store/console.py) on SQLite and PostgreSQL: sessions kept by the hash of
their cookie's secret and ended on the server, break-glass links used once before they expire,
sign-ins under way taken once by the browser that began them; and migration 0011's tables are
the ones store/tables.py declares."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, select

from ezat_compat.store.accounts import StoreError
from ezat_compat.store.console import LINK_TTL, LOGIN_TTL, TOUCH_EVERY, ConsoleStore, secret_hash
from ezat_compat.store.tables import console_links, console_sessions

# Fixtures shared with the other store tests (tests/support/stores.py).
from tests.support.stores import NOW
from tests.support.stores import db_url as db_url
from tests.support.stores import engine as engine


@pytest.fixture
def console(engine: Engine) -> ConsoleStore:
    return ConsoleStore(engine)


def test_a_session_is_found_by_its_cookie_and_only_its_hash_is_stored(console: ConsoleStore, engine: Engine) -> None:
    cookie, public_id = console.open_session(
        subject="alice", name="Alice", email="a@example.com", role="org_admin", org_ids=[7, 3], now=NOW
    )
    found = console.find_session(cookie)
    assert found is not None
    assert (found.public_id, found.subject, found.role, found.org_ids) == (public_id, "alice", "org_admin", {3, 7})
    assert found.created_at == found.last_seen_at == NOW and found.ended_at is None
    assert len(found.csrf_token) >= 40
    with engine.connect() as conn:
        (row,) = conn.execute(select(console_sessions)).all()
    assert cookie not in [str(v) for v in row] and row.secret_hash == secret_hash(cookie)
    assert console.find_session(cookie + "x") is None and console.find_session("") is None


def test_an_unknown_role_is_refused(console: ConsoleStore) -> None:
    with pytest.raises(StoreError):
        console.open_session(subject="x", role="root", now=NOW)


def test_a_session_is_touched_at_most_every_half_minute_and_ended_once(console: ConsoleStore) -> None:
    cookie, public_id = console.open_session(subject="alice", role="admin", now=NOW)
    session = console.find_session(cookie)
    assert session is not None
    console.touch(session, NOW + TOUCH_EVERY / 2)
    assert console.find_session(cookie).last_seen_at == NOW  # type: ignore[union-attr]
    console.touch(session, NOW + TOUCH_EVERY)
    assert console.find_session(cookie).last_seen_at == NOW + TOUCH_EVERY  # type: ignore[union-attr]
    assert console.end_session(public_id, NOW + timedelta(minutes=1)) is True
    assert console.end_session(public_id, NOW + timedelta(minutes=2)) is False
    ended = console.find_session(cookie)
    assert ended is not None and ended.ended_at == NOW + timedelta(minutes=1)
    console.touch(ended, NOW + timedelta(hours=1))  # an ended session stays as it ended
    assert console.find_session(cookie).last_seen_at == NOW + TOUCH_EVERY  # type: ignore[union-attr]


def test_a_break_glass_link_is_used_once_before_it_expires(console: ConsoleStore, engine: Engine) -> None:
    token, link_id, expires_at = console.create_link(created_by="cli:root", now=NOW)
    assert expires_at == NOW + LINK_TTL and link_id.startswith("bgl_")
    assert console.use_link("not-" + token, NOW) is None
    assert console.use_link(token, NOW + timedelta(minutes=1)) == link_id
    assert console.use_link(token, NOW + timedelta(minutes=2)) is None
    late, _, _ = console.create_link(created_by="cli:root", now=NOW)
    assert console.use_link(late, NOW + LINK_TTL) is None
    with engine.connect() as conn:
        hashes = set(conn.execute(select(console_links.c.token_hash)).scalars())
    assert hashes == {secret_hash(token), secret_hash(late)}


def test_a_sign_in_under_way_is_taken_once_by_the_browser_that_began_it(console: ConsoleStore) -> None:
    console.begin_login(state="s1", binding="b1", nonce="n1", code_verifier="v1", now=NOW)
    console.begin_login(state="s2", binding="b1", nonce="n2", code_verifier="v2", now=NOW)
    console.begin_login(state="s3", binding="b1", nonce="n3", code_verifier="v3", now=NOW)
    assert console.take_login(state="s0", binding="b1", now=NOW) is None  # a wrong state
    taken = console.take_login(state="s1", binding="b1", now=NOW)
    assert taken is not None and (taken.nonce, taken.code_verifier) == ("n1", "v1")
    assert console.take_login(state="s1", binding="b1", now=NOW) is None  # replayed
    assert console.take_login(state="s2", binding="another browser", now=NOW) is None
    assert console.take_login(state="s2", binding="b1", now=NOW) is None  # taken by the refused attempt
    assert console.take_login(state="s3", binding="b1", now=NOW + LOGIN_TTL) is None  # expired
