"""The command-line sign-in's storage (store/device.py) on SQLite and PostgreSQL, its clock passed
in: device codes and refresh tokens kept as hashes alone; user codes of 8 unambiguous letters read
in any case, with or without the dash; RFC 8628 section 3.5's answers to each poll (pending, slow
down with a longer interval, denied, expired, the tokens once); sessions whose refresh token is
rotated at each use (the previous one refused, one winner of two claims at once), undone when
the IdP couldn't be asked, ended at once, expired ``days`` after their last renewal; the purge."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, insert, select

from ezat_compat.store.device import (
    ACCESS_DENIED,
    AUTHORIZATION_PENDING,
    EXPIRED_TOKEN,
    GRANT_TTL,
    GRANTED,
    INVALID_GRANT,
    POLL_INTERVAL_S,
    SLOW_DOWN,
    USER_CODE_ALPHABET,
    DeviceStore,
    normal_user_code,
    secret_hash,
    shown_user_code,
)
from ezat_compat.store.tables import device_grants, user_sessions, users

# Fixtures shared with the other store tests (tests/support/stores.py).
from tests.support.stores import NOW
from tests.support.stores import db_url as db_url
from tests.support.stores import engine as engine

CLIENT = "ezat-cli"


@pytest.fixture
def device(engine: Engine) -> DeviceStore:
    return DeviceStore(engine)


@pytest.fixture
def person(engine: Engine) -> int:
    with engine.begin() as conn:
        conn.execute(
            insert(users).values(
                public_id="user_01test",
                subject="dana",
                email="dana@example.com",
                name="Dana",
                idp_groups="engineers",
                group_ids="",
                org_id=None,
                models="",
                created_at=NOW,
            )
        )
        return int(conn.execute(select(users.c.id).where(users.c.subject == "dana")).scalar_one())


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("BCDF-GHJK", "BCDFGHJK"),
        ("bcdf-ghjk", "BCDFGHJK"),
        ("bcdfghjk", "BCDFGHJK"),
        (" BCDF GHJK ", "BCDFGHJK"),
        ("BCDF-GHJ", None),  # too short
        ("BCDF-GHJKL", None),  # too long
        ("BCDA-GHJK", None),  # a vowel: never in a code
        ("BCD1-GHJK", None),  # a digit
        ("", None),
    ],
)
def test_user_codes_are_read_in_any_case_without_the_dash(typed: str, stored: str | None) -> None:
    assert normal_user_code(typed) == stored


def test_a_device_authorization_keeps_the_hash_of_its_code(device: DeviceStore, engine: Engine) -> None:
    code, grant = device.start(CLIENT, now=NOW)
    assert len(code) >= 43  # 256 bits
    assert len(grant.user_code) == 8 and set(grant.user_code) <= set(USER_CODE_ALPHABET)
    assert grant.shown_code == shown_user_code(grant.user_code) and grant.shown_code[4] == "-"
    assert (grant.expires_at - grant.created_at, grant.interval_s) == (GRANT_TTL, POLL_INTERVAL_S)
    with engine.connect() as conn:
        (row,) = conn.execute(select(device_grants)).all()
    assert code not in [str(v) for v in row] and row.code_hash == secret_hash(code)
    assert device.pending(grant.shown_code.lower(), now=NOW) == grant
    assert device.pending(grant.user_code, now=NOW + GRANT_TTL) is None  # expired


def test_polls_follow_rfc_8628(device: DeviceStore, person: int) -> None:
    code, grant = device.start(CLIENT, now=NOW)
    at = NOW + timedelta(seconds=1)
    assert device.poll(code, client_id=CLIENT, now=at).outcome == AUTHORIZATION_PENDING
    fast = device.poll(code, client_id=CLIENT, now=at + timedelta(seconds=2))
    assert (fast.outcome, fast.interval_s) == (SLOW_DOWN, POLL_INTERVAL_S + 5)
    faster = device.poll(code, client_id=CLIENT, now=at + timedelta(seconds=9))  # 7 s: under 10
    assert (faster.outcome, faster.interval_s) == (SLOW_DOWN, POLL_INTERVAL_S + 10)
    patient = device.poll(code, client_id=CLIENT, now=at + timedelta(seconds=25))
    assert (patient.outcome, patient.interval_s) == (AUTHORIZATION_PENDING, POLL_INTERVAL_S + 10)
    assert device.poll(code, client_id="another", now=at).outcome == INVALID_GRANT
    assert device.poll("unknown", client_id=CLIENT, now=at).outcome == INVALID_GRANT

    assert device.approve(grant.user_code, user_id=person, idp_refresh="ezs2.sealed", now=at) is True
    assert device.approve(grant.user_code, user_id=person, idp_refresh="other", now=at) is False  # decided
    taken = device.poll(code, client_id=CLIENT, now=at + timedelta(seconds=30))
    assert (taken.outcome, taken.user_id, taken.client_id, taken.idp_refresh) == (
        GRANTED,
        person,
        CLIENT,
        "ezs2.sealed",
    )
    assert device.poll(code, client_id=CLIENT, now=at + timedelta(seconds=40)).outcome == INVALID_GRANT  # once


def test_denied_and_expired(device: DeviceStore) -> None:
    code, grant = device.start(CLIENT, now=NOW)
    assert device.deny(grant.shown_code, now=NOW) is True
    assert device.poll(code, client_id=CLIENT, now=NOW).outcome == ACCESS_DENIED
    late, late_grant = device.start(CLIENT, now=NOW)
    assert device.poll(late, client_id=CLIENT, now=NOW + GRANT_TTL).outcome == EXPIRED_TOKEN
    assert device.approve(late_grant.user_code, user_id=1, idp_refresh=None, now=NOW + GRANT_TTL) is False


def test_a_refresh_token_is_rotated_at_each_use(device: DeviceStore, engine: Engine, person: int) -> None:
    token, session = device.open_session(
        user_id=person, client_id=CLIENT, idp_refresh="ezs2.a", key_public_id=None, days=30, now=NOW
    )
    with engine.connect() as conn:
        (row,) = conn.execute(select(user_sessions)).all()
    assert token not in [str(v) for v in row] and row.token_hash == secret_hash(token)
    claimed = device.claim(token, now=NOW + timedelta(days=1))
    assert claimed is not None
    new, seen = claimed
    assert new != token and seen.public_id == session.public_id and seen.idp_refresh == "ezs2.a"
    assert device.claim(token, now=NOW + timedelta(days=1)) is None  # the old one: refused
    device.complete(seen, idp_refresh="ezs2.b", key_public_id=None, days=30, now=NOW + timedelta(days=1))
    again = device.claim(new, now=NOW + timedelta(days=30, hours=23))  # 30 days after the renewal, not the start
    assert again is not None and again[1].idp_refresh == "ezs2.b"
    assert device.claim(again[0], now=NOW + timedelta(days=62)) is None  # unused for 30 days: over


def test_an_unchecked_claim_is_undone_and_an_ended_session_refuses(device: DeviceStore, person: int) -> None:
    token, _ = device.open_session(
        user_id=person, client_id=CLIENT, idp_refresh=None, key_public_id=None, days=30, now=NOW
    )
    claimed = device.claim(token, now=NOW)
    assert claimed is not None
    new, session = claimed
    assert device.unclaim(session, new, token) is True  # the IdP couldn't be asked: as before
    assert device.claim(new, now=NOW) is None
    again = device.claim(token, now=NOW)
    assert again is not None
    assert device.end(session.id, now=NOW) is None  # no key minted from it
    assert device.claim(again[0], now=NOW) is None
    (ended,) = device.sessions_of(person)
    assert ended.ended_at == NOW and ended.idp_refresh is None


def test_the_purge_drops_what_is_over_for_a_day(device: DeviceStore, person: int) -> None:
    device.start(CLIENT, now=NOW)
    device.open_session(user_id=person, client_id=CLIENT, idp_refresh=None, key_public_id=None, days=1, now=NOW)
    assert device.purge(now=NOW + timedelta(hours=1)) == 0
    assert device.purge(now=NOW + timedelta(days=2, seconds=1)) == 2
    assert device.sessions_of(person) == []
