"""The admin API's storage on a real database (SQLite and PostgreSQL): migration 0008, admin keys,
the append-only audit trail, and the key lifecycle ``authenticate`` sees at once — rotation with a
grace window, blocking, organisation-wide model access and rate caps, the last-used time — plus
the service layer's trace of each change (an audit row and a log line, no secret in either)."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import DBAPIError

from ezat_compat.admin import service
from ezat_compat.admin.auth import AdminContext
from ezat_compat.admin.errors import AdminConflictError, AdminNotFoundError
from ezat_compat.errors import AuthenticationError, PermissionDeniedError
from ezat_compat.store.accounts import Accounts, StoreError, api_key_id, hash_key, key_public_id
from ezat_compat.store.admin import AdminStore
from ezat_compat.store.db import alembic_config, locked_connection, make_engine, migrate
from ezat_compat.store.hotpath import HotPath
from ezat_compat.store.store import open_store
from ezat_compat.store.tables import admin_keys, api_keys, audit_log, orgs
from tests.support.stores import NOW

# Fixtures shared with the other store tests (tests/support/stores.py).
from tests.support.stores import db_url as db_url
from tests.support.stores import engine as engine
from tests.support.stores import hot_path as hot_path

pytestmark = pytest.mark.integration

CTX = AdminContext(actor="adminkey_test", read_only=False, address="10.0.0.7", request_id="req_test")


@pytest.fixture
def accounts(engine: Engine, hot_path: HotPath) -> Accounts:
    return Accounts(engine, hot_path)  # the keys' last use written by ``last_used.flush()`` only


@pytest.fixture
def admin(engine: Engine, hot_path: HotPath) -> AdminStore:
    return AdminStore(engine, hot_path)


def _refused(accounts: Accounts, secret: str, when: Any = NOW) -> str:
    with pytest.raises(AuthenticationError) as caught:
        accounts.authenticate(secret, when)
    return caught.value.message


# ---------------------------------------------------------------- the migration


def _migrate_to(engine: Engine, revision: str, *, down: bool = False) -> None:
    with locked_connection(engine) as conn:
        (command.downgrade if down else command.upgrade)(alembic_config(conn), revision)


def test_0008_gives_every_organisation_a_workspace_id_and_goes_down_and_up_again(db_url: str) -> None:
    eng = make_engine(db_url)
    try:
        _migrate_to(eng, "0007")
        with eng.begin() as conn:
            for n, suspended in enumerate((False, True, False)):
                conn.execute(
                    text(
                        "INSERT INTO orgs (name, balance_micros, reserved_micros, suspended, created_at) "
                        "VALUES (:n, 5, 0, :s, 1)"
                    ),
                    {"n": f"org{n}", "s": suspended},
                )
        _migrate_to(eng, "0008")
        with eng.connect() as conn:
            rows = conn.execute(select(orgs.c.name, orgs.c.public_id, orgs.c.suspended_at).order_by(orgs.c.id)).all()
        ids = [row.public_id for row in rows]
        assert len(set(ids)) == 3 and all(i.startswith("wrkspc_01") and len(i) == 31 for i in ids)
        assert [row.suspended_at is not None for row in rows] == [False, True, False]

        _migrate_to(eng, "0007", down=True)
        with eng.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM orgs")).scalar_one() == 3
        migrate(eng)  # and up to the head again
        with eng.connect() as conn:
            assert conn.execute(select(orgs.c.public_id).where(orgs.c.public_id.is_(None))).all() == []
    finally:
        eng.dispose()


def test_the_audit_trail_refuses_updates_and_deletes(admin: AdminStore, engine: Engine) -> None:
    admin.record(
        actor="cli:root", action="workspace.create", target_type="workspace", target_id="w", before=None, after={}
    )
    for statement in ("UPDATE audit_log SET actor = 'someone else'", "DELETE FROM audit_log"):
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(text(statement))
    with engine.connect() as conn:
        assert conn.execute(select(audit_log.c.actor)).scalars().all() == ["cli:root"]


# ---------------------------------------------------------------- admin keys


def test_an_admin_key_is_kept_as_its_hash_and_found_until_revoked(admin: AdminStore, engine: Engine) -> None:
    info, secret = admin.create_key(name="ops", read_only=True, created_by="cli:root", now=NOW)
    assert secret.startswith("ezat_admin_") and len(secret) == len("ezat_admin_") + 32
    assert info.id.startswith("adminkey_") and info.read_only and secret.startswith(info.prefix)
    with engine.connect() as conn:
        stored = conn.execute(select(admin_keys)).one()
    assert stored.key_hash == hash_key(secret) and secret not in repr(tuple(stored))
    found = admin.find_key(secret)
    assert found is not None and found.id == info.id and found.read_only
    assert admin.find_key(secret + "x") is None and admin.find_key("ezat_sk_" + secret[11:]) is None
    admin.revoke_key(info.id, now=NOW + timedelta(hours=1))
    first = admin.get_key(info.id).revoked_at
    admin.revoke_key(info.id, now=NOW + timedelta(hours=2))
    assert first == admin.get_key(info.id).revoked_at == NOW + timedelta(hours=1)
    found = admin.find_key(secret)
    assert found is not None and found.revoked_at == first  # found, and refused by its caller


def test_an_admin_keys_last_use_is_written_at_most_once_a_minute(admin: AdminStore) -> None:
    _, secret = admin.create_key(created_by="cli:root", now=NOW)
    key = admin.find_key(secret)
    assert key is not None
    admin.note_used(key, NOW)
    key = admin.find_key(secret)
    assert key is not None and key.last_used_at == NOW
    admin.note_used(key, NOW + timedelta(seconds=59))
    key = admin.find_key(secret)
    assert key is not None and key.last_used_at == NOW
    admin.note_used(key, NOW + timedelta(seconds=61))
    key = admin.find_key(secret)
    assert key is not None and key.last_used_at == NOW + timedelta(seconds=61)


def test_the_trail_is_read_newest_first_with_filters_and_pages(admin: AdminStore) -> None:
    for n in range(5):
        admin.record(
            actor="cli:a" if n % 2 else "adminkey_b",
            action="api_key.update",
            target_type="api_key",
            target_id=f"apikey_{n % 2}",
            before={"n": n - 1},
            after={"n": n},
            now=NOW + timedelta(minutes=n),
        )
    every = admin.entries()
    assert [e.after["n"] for e in every] == [4, 3, 2, 1, 0]
    assert [e.after["n"] for e in admin.entries(actor="cli:a")] == [3, 1]
    assert [e.after["n"] for e in admin.entries(target_type="api_key", target_id="apikey_0")] == [4, 2, 0]
    assert [e.after["n"] for e in admin.entries(since=NOW + timedelta(minutes=3))] == [4, 3]
    assert [e.after["n"] for e in admin.entries(before_id=every[1].id, limit=2)] == [2, 1]


# ---------------------------------------------------------------- the key lifecycle, as authenticate sees it


def test_a_rotated_keys_old_secret_works_until_its_grace_ends(accounts: Accounts) -> None:
    accounts.create_org("acme", 1_000_000)
    info, old = accounts.create_key("acme", now=NOW)
    rotated, new = accounts.rotate_key(api_key_id(info.id), grace=timedelta(seconds=60), now=NOW)
    assert new != old and rotated.id == info.id and new.startswith(rotated.prefix)
    assert accounts.authenticate(new, NOW).key_public_id == info.id
    assert accounts.authenticate(old, NOW + timedelta(seconds=59)).key_public_id == info.id
    assert _refused(accounts, old, NOW + timedelta(seconds=60)) == "Invalid API key."
    assert accounts.authenticate(new, NOW + timedelta(seconds=60)).key_public_id == info.id


def test_a_rotation_without_grace_refuses_the_old_secret_at_once(accounts: Accounts) -> None:
    accounts.create_org("acme", 1_000_000)
    info, old = accounts.create_key("acme", now=NOW)
    _, new = accounts.rotate_key(info.id, now=NOW)
    assert _refused(accounts, old) == "Invalid API key."
    assert accounts.authenticate(new, NOW).key_id


def test_revoking_a_rotated_key_refuses_its_old_secret_too(accounts: Accounts) -> None:
    accounts.create_org("acme", 1_000_000)
    info, old = accounts.create_key("acme", now=NOW)
    _, new = accounts.rotate_key(info.id, grace=timedelta(hours=1), now=NOW)
    accounts.revoke_key(info.id, now=NOW)
    assert _refused(accounts, old) == _refused(accounts, new) == "This API key has been revoked."
    with pytest.raises(StoreError, match="revoked"):
        accounts.rotate_key(info.id, now=NOW)


@pytest.mark.parametrize("grace", [timedelta(seconds=-1), timedelta(days=7, seconds=1)])
def test_a_grace_out_of_range_is_refused(accounts: Accounts, grace: timedelta) -> None:
    accounts.create_org("acme", 1_000_000)
    info, _ = accounts.create_key("acme", now=NOW)
    with pytest.raises(StoreError, match="grace"):
        accounts.rotate_key(info.id, grace=grace, now=NOW)


def test_a_blocked_key_is_refused_at_once_and_works_again_when_unblocked(accounts: Accounts) -> None:
    accounts.create_org("acme", 1_000_000)
    info, secret = accounts.create_key("acme", now=NOW)
    blocked = accounts.set_blocked(key_public_id(api_key_id(info.id)), True, now=NOW)
    assert blocked.status(NOW) == "inactive"
    assert "disabled" in _refused(accounts, secret)
    assert accounts.set_blocked(info.id, True, now=NOW + timedelta(hours=1)).blocked_at == NOW  # the first time kept
    assert accounts.set_blocked(info.id, False).status(NOW) == "active"
    assert accounts.authenticate(secret, NOW).key_public_id == info.id
    accounts.revoke_key(info.id, now=NOW)
    with pytest.raises(StoreError, match="revoked"):
        accounts.set_blocked(info.id, False)


def test_an_organisations_models_and_rate_caps_bound_each_of_its_keys(accounts: Accounts) -> None:
    accounts.create_org("acme", 1_000_000)
    _, own = accounts.create_key("acme", models=["anthropic/claude-*"], rpm=100, tpm=50, now=NOW)
    _, bare = accounts.create_key("acme", now=NOW)
    accounts.set_org_access("acme", models=["*-sonnet-*", "*-haiku-*"], rpm=60, tpm=None)
    ctx = accounts.authenticate(own, NOW)
    assert (ctx.rpm, ctx.tpm) == (60, 50)  # the lower of the key's and the organisation's
    assert ctx.allows("anthropic/claude-sonnet-5-5") and not ctx.allows("anthropic/claude-opus-5-5")
    assert not ctx.allows("openai/gpt-sonnet-1")  # the key's own patterns still apply
    loose = accounts.authenticate(bare, NOW)
    assert (loose.rpm, loose.tpm) == (60, None)
    assert loose.allows("anthropic/claude-haiku-4-5") and not loose.allows("anthropic/claude-opus-5-5")
    accounts.set_org_access("acme", models=[], rpm=None)
    assert accounts.authenticate(bare, NOW).allows("anthropic/claude-opus-5-5")
    with pytest.raises(StoreError, match="rpm"):
        accounts.set_org_access("acme", rpm=0)


def test_a_keys_last_use_is_noted_once_a_minute_and_written_off_the_request(accounts: Accounts, engine: Engine) -> None:
    accounts.create_org("acme", 1_000_000)
    info, secret = accounts.create_key("acme", now=NOW)
    writes: list[Any] = []
    accounts.last_used.hot = _Counting(accounts.last_used.hot, writes)
    for seconds in (0, 10, 59):
        accounts.authenticate(secret, NOW + timedelta(seconds=seconds))
    assert writes == []  # nothing written on a request's path
    accounts.last_used.flush()
    accounts.last_used.flush()  # nothing new noted: nothing written
    assert len(writes) == 1 and accounts.get_key(info.id).last_used_at == NOW
    accounts.authenticate(secret, NOW + timedelta(seconds=61))
    accounts.last_used.flush()
    assert len(writes) == 2 and accounts.get_key(info.id).last_used_at == NOW + timedelta(seconds=61)


def test_the_last_use_is_written_by_a_background_thread(engine: Engine, hot_path: HotPath) -> None:
    accounts = Accounts(engine, hot_path, last_used_in_background=True)  # as the gateway's store makes it
    accounts.create_org("acme", 1_000_000)
    info, secret = accounts.create_key("acme", now=NOW)
    accounts.authenticate(secret, NOW)
    deadline = time.monotonic() + 10
    while accounts.get_key(info.id).last_used_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert accounts.get_key(info.id).last_used_at == NOW


class _Counting:
    def __init__(self, hot: HotPath, writes: list[Any]) -> None:
        self.hot, self.writes = hot, writes

    def write(self, work: Any, params: Any, rider: Any = None) -> Any:
        self.writes.append(params)
        return self.hot.write(work, params, rider)


def test_a_suspension_keeps_its_first_time_and_a_resume_clears_it(accounts: Accounts) -> None:
    accounts.create_org("acme", 1_000_000)
    _, secret = accounts.create_key("acme", now=NOW)
    assert accounts.set_suspended("acme", True, now=NOW).suspended_at == NOW
    assert accounts.set_suspended("acme", True, now=NOW + timedelta(hours=1)).suspended_at == NOW
    with pytest.raises(PermissionDeniedError):
        accounts.authenticate(secret, NOW)
    assert accounts.set_suspended("acme", False).suspended_at is None


def test_an_organisation_is_found_by_its_workspace_id_or_its_name_and_renamed(accounts: Accounts) -> None:
    org = accounts.create_org("acme", 0)
    assert org.public_id.startswith("wrkspc_01") and len(org.public_id) == 31
    assert accounts.find_org(org.public_id) == accounts.find_org("acme") == org
    assert accounts.rename_org("acme", "acme-2").public_id == org.public_id
    assert accounts.find_org("acme") is None
    accounts.create_org("other", 0)
    with pytest.raises(StoreError, match="already exists"):
        accounts.rename_org("acme-2", "other")
    with pytest.raises(StoreError, match="not a valid organization name"):
        accounts.rename_org("acme-2", "has space")


# ---------------------------------------------------------------- the service layer's trace


def test_every_change_leaves_an_audit_row_and_a_log_line_without_a_secret(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    migrate(db_url)
    store = open_store(db_url)
    try:
        with caplog.at_level(logging.INFO, logger="ezat_compat.audit"):
            org = service.create_org(store, CTX, "acme", 5_000_000)
            key, secret = service.create_key(store, CTX, org.public_id, name="ci")
            _, rotated = service.rotate_key(store, CTX, api_key_id(key.id), grace_seconds=30)
            service.set_key_status(store, CTX, key.id, "inactive")
            service.set_key_status(store, CTX, key.id, "inactive")  # no change: no row
            service.set_key_status(store, CTX, key.id, "active")
            service.update_org(store, CTX, "acme", rpm=10)
            service.top_up(store, CTX, "acme", 1)
            service.set_suspended(store, CTX, "acme", True)
            admin_info, admin_secret = service.create_admin_key(store, CTX, name="ops")
            service.revoke_admin_key(store, CTX, admin_info.id)
            service.revoke_key(store, CTX, key.id)
        entries = list(reversed(service.admin_store(store).entries()))
        assert [e.action for e in entries] == [
            "workspace.create",
            "api_key.create",
            "api_key.rotate",
            "api_key.block",
            "api_key.unblock",
            "workspace.update",
            "workspace.top_up",
            "workspace.archive",
            "admin_key.create",
            "admin_key.revoke",
            "api_key.archive",
        ]
        assert {(e.actor, e.address, e.request_id) for e in entries} == {("adminkey_test", "10.0.0.7", "req_test")}
        created = entries[1]
        assert created.before is None and created.after["name"] == "ci" and created.target_id == api_key_id(key.id)
        assert entries[2].after["grace_seconds"] == 30 and entries[2].before["prefix"] == secret[:12]
        assert (entries[3].before["blocked_at"], entries[3].after["blocked_at"] is not None) == (None, True)
        lines = [r.getMessage() for r in caplog.records if r.name == "ezat_compat.audit"]
        assert [json.loads(line)["action"] for line in lines] == [e.action for e in entries]
        with store.engine.connect() as conn:
            stored = repr(conn.execute(select(audit_log)).all())
        for leaked in (secret, rotated, admin_secret):
            assert leaked not in stored and not any(leaked in line for line in lines)
    finally:
        store.close()


def test_the_service_says_what_it_cannot_find_or_do(db_url: str) -> None:
    migrate(db_url)
    store = open_store(db_url)
    try:
        with pytest.raises(AdminNotFoundError, match="nobody"):
            service.top_up(store, CTX, "nobody", 1)
        with pytest.raises(AdminNotFoundError, match="apikey_000000000000"):
            service.rotate_key(store, CTX, "apikey_000000000000")
        org = service.create_org(store, CTX, "acme")
        key, _ = service.create_key(store, CTX, org.name)
        service.revoke_key(store, CTX, key.id)
        for status in ("active", "inactive"):
            with pytest.raises(AdminConflictError, match="archived"):
                service.set_key_status(store, CTX, key.id, status)
        with pytest.raises(AdminConflictError):
            service.rotate_key(store, CTX, key.id)
        with store.engine.connect() as conn:
            assert conn.execute(select(api_keys.c.created_by)).scalar_one() == "adminkey_test"
    finally:
        store.close()
