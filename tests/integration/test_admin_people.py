"""People and groups on the admin API (admin/users.py, admin/groups.py), driven by the ``anthropic``
SDK unchanged but for ``base_url``, an admin key and a WSGI transport to the real app on a real
SQLite database: users listed page by page, retrieved, updated, disabled, enabled and removed
(disabled, their keys revoked); rbac groups created, listed, retrieved, renamed, changed and
deleted, a group of the configuration file refused; spend limits of scope user and rbac_group set,
listed and shown in the effective limits; usage reports grouped by user and rbac group; an audit
row for every change, and a read-only admin key refused every change."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from flask import Flask

from ezat_compat.app import create_app
from ezat_compat.config import parse_config
from ezat_compat.domain import Config, IdentitySettings
from ezat_compat.store.db import make_engine, migrate
from ezat_compat.store.people import SOURCE_CONFIG, NoOrganisationError, PersonInfo
from ezat_compat.store.store import Store, open_store
from tests.support.stores import entry

pytestmark = pytest.mark.integration

USD = 1_000_000
IDENTITY = IdentitySettings(groups_claim="groups")


def _config(tmp_path: Path) -> Config:
    data = {
        "gateway": {"database_url": f"sqlite:///{tmp_path / 'ezat.db'}", "data_dir": str(tmp_path)},
        "admin": {"bind": "", "on_main_listener": True},
        "models": [
            {
                "id": "anthropic/m",
                "aliases": [],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "u"}],
            }
        ],
    }
    return parse_config(data, path=str(tmp_path / "ezat.toml"), environ={})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    config = _config(tmp_path)
    engine = make_engine(config.gateway.database_url)
    migrate(engine)
    engine.dispose()
    opened = open_store(config.gateway.database_url, config=config)
    yield opened
    opened.close()


@pytest.fixture
def app(tmp_path: Path, store: Store) -> Flask:
    return create_app(_config(tmp_path), store=store)


def _sdk(app: Flask, secret: str) -> anthropic.Anthropic:
    transport = httpx2.WSGITransport(app=app)
    return anthropic.Anthropic(
        api_key=secret, base_url="http://gateway.test", http_client=httpx2.Client(transport=transport), max_retries=0
    )


@pytest.fixture
def admin(app: Flask, store: Store) -> anthropic.Anthropic:
    assert store.admin is not None
    return _sdk(app, store.admin.create_key(name="people", created_by="cli:tests")[1])


@pytest.fixture
def reader(app: Flask, store: Store) -> anthropic.Anthropic:
    assert store.admin is not None
    return _sdk(app, store.admin.create_key(name="finance", read_only=True, created_by="cli:tests")[1])


@pytest.fixture
def world(store: Store) -> dict[str, PersonInfo]:
    """Two organisations, a group mapping each, and three people who signed in."""
    assert store.people is not None
    store.accounts.create_org("research", 100 * USD)
    store.accounts.create_org("sales", 100 * USD)
    store.people.put_group("ml-team", org="research", models=["anthropic/*"])
    store.people.put_group("sellers", org="sales")
    return {
        name: store.people.sign_in({"sub": f"sub-{name}", "email": f"{name}@example.com", "groups": groups}, IDENTITY)
        for name, groups in (("ada", ["ml-team"]), ("bob", ["ml-team", "other"]), ("cyd", ["sellers"]))
    }


def _audit(store: Store, action: str) -> list[Any]:
    assert store.admin is not None
    return [e for e in store.admin.entries(limit=500) if e.action == action]


# ---------------------------------------------------------------- users


def test_users_listed_page_by_page_retrieved_and_filtered(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    listed = list(admin.organization.users.list(limit=2))  # the SDK walks every page
    assert [u.email for u in listed] == ["ada@example.com", "bob@example.com", "cyd@example.com"]
    ada = listed[0]
    assert ada.id == world["ada"].public_id and ada.id.startswith("user_")
    assert (ada.type, ada.role, ada.name) == ("user", "user", "ada@example.com")
    extra = ada.model_extra or {}
    research = store.accounts.get_org("research")
    group = store.people.get_group("ml-team") if store.people else None
    assert group is not None
    assert extra["status"] == "active" and extra["workspace_id"] == research.public_id
    assert extra["rbac_group_ids"] == [group.public_id] and extra["models"] == ["anthropic/*"]
    assert [u.id for u in admin.organization.users.list(email="bob@example.com")] == [world["bob"].public_id]
    assert list(admin.organization.users.list(roles=["developer"])) == []
    members = admin.get("/v1/organizations/users", cast_to=object, options={"params": {"rbac_group_id": "ml-team"}})
    assert [u["email"] for u in members["data"]] == ["ada@example.com", "bob@example.com"]
    assert admin.organization.users.retrieve("cyd@example.com").id == world["cyd"].public_id
    with pytest.raises(anthropic.NotFoundError) as missing:
        admin.organization.users.retrieve("user_nobody")
    assert "user_nobody" in missing.value.message


def test_disable_enable_update_and_remove_a_person_with_their_audit_rows(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    assert store.people is not None
    ada = world["ada"]
    key, _secret = store.people.mint_key(ada, hours=1)
    with pytest.raises(anthropic.BadRequestError) as refused:
        admin.organization.users.update(ada.public_id, role="developer")
    assert "role" in refused.value.message
    same = admin.organization.users.update(ada.public_id, role="user")
    assert same.role == "user" and not _audit(store, "user.disable")

    disabled = admin.post(f"/v1/organizations/users/{ada.public_id}/disable", cast_to=object, body={})
    assert disabled["status"] == "disabled" and disabled["disabled_at"]
    assert store.people.get(ada.public_id).disabled_at is not None
    assert store.accounts.get_key(key.id).revoked_at is None  # disabling alone keeps the keys
    (row,) = _audit(store, "user.disable")
    assert row.target_id == ada.public_id and row.before["status"] == "active" and row.after["status"] == "disabled"

    enabled = admin.post(f"/v1/organizations/users/{ada.public_id}/enable", cast_to=object)
    assert enabled["status"] == "active" and len(_audit(store, "user.enable")) == 1

    keys = admin.get(f"/v1/organizations/users/{ada.public_id}/api_keys", cast_to=object)
    assert [k["id"] for k in keys["data"]] == ["apikey_" + key.id.removeprefix("key_")]

    removed = admin.organization.users.remove(ada.public_id)
    assert (removed.id, removed.type) == (ada.public_id, "user_deleted")
    assert store.people.get(ada.public_id).disabled_at is not None
    assert store.accounts.get_key(key.id).revoked_at is not None
    (deleted,) = _audit(store, "user.delete")
    assert deleted.before["live_keys"] == 1 and deleted.after["live_keys"] == 0
    assert admin.organization.users.retrieve(ada.public_id).model_extra["status"] == "disabled"

    bob_key, _ = store.people.mint_key(world["bob"], hours=1)
    answer = admin.post(f"/v1/organizations/users/{world['bob'].email}/revoke_keys", cast_to=object)
    assert answer == {"id": world["bob"].public_id, "type": "user_keys_revoked", "revoked": 1}
    assert store.accounts.get_key(bob_key.id).revoked_at is not None
    assert len(_audit(store, "user.revoke_keys")) == 1


def test_a_status_update_and_bad_values_answer_in_the_admin_envelope(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    cyd = world["cyd"]
    answer = admin.post(
        f"/v1/organizations/users/{cyd.public_id}", cast_to=object, body={"status": "disabled", "revoke_keys": True}
    )
    assert answer["status"] == "disabled"
    for body in ({"status": "asleep"}, {"revoke_keys": True}, {"role": "admin"}, {"nickname": "c"}):
        with pytest.raises(anthropic.BadRequestError) as bad:
            admin.post(f"/v1/organizations/users/{cyd.public_id}", cast_to=object, body=body)
        assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- groups


def test_rbac_groups_created_listed_renamed_changed_and_deleted(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    assert store.people is not None
    made = admin.organization.rbac_groups.create(
        name="designers",
        extra_body={"workspace_id": "sales", "models": ["anthropic/m"], "user_spend_limits": {"daily": "500"}},
    )
    assert made.id.startswith("group_") and made.type == "rbac_group" and made.source_type == "direct"
    extra = made.model_extra or {}
    assert extra["workspace_id"] == store.accounts.get_org("sales").public_id
    assert extra["user_spend_limits"] == {"daily": "500", "weekly": None, "monthly": None}
    assert store.people.get_group("designers").daily_micros == 5 * USD
    (created,) = _audit(store, "rbac_group.create")
    assert created.target_id == made.id and created.after["daily_usd"] == "5.000000"

    with pytest.raises(anthropic.ConflictError):
        admin.organization.rbac_groups.create(name="designers")
    names = [g.name for g in admin.organization.rbac_groups.list(limit=1)]  # every page
    assert names == ["designers", "ml-team", "sellers"]
    assert admin.organization.rbac_groups.retrieve("designers").id == made.id

    # a person who signs in with the new name gets what it gives; a rename moves the mapping
    with pytest.raises(NoOrganisationError):  # made, but nothing pays for her yet
        store.people.sign_in({"sub": "sub-dee", "email": "dee@example.com", "groups": ["ux"]}, IDENTITY)
    dee = store.people.get("dee@example.com")
    renamed = admin.organization.rbac_groups.update(made.id, name="ux")
    assert (renamed.id, renamed.name) == (made.id, "ux")
    assert store.people.get("dee@example.com").org == "sales"
    changed = admin.organization.rbac_groups.update(made.id, extra_body={"models": [], "workspace_id": None})
    assert (changed.model_extra or {})["workspace_id"] is None and store.people.get("dee@example.com").org == ""
    assert len(_audit(store, "rbac_group.update")) == 2

    members = admin.get(f"/v1/organizations/rbac_groups/{made.id}/members", cast_to=object)
    assert [m["email"] for m in members["data"]] == ["dee@example.com"]
    with pytest.raises(anthropic.BadRequestError):
        admin.post(f"/v1/organizations/rbac_groups/{made.id}/members", cast_to=object, body={"user_id": dee.public_id})

    gone = admin.organization.rbac_groups.delete(made.id)
    assert (gone.id, gone.type) == (made.id, "rbac_group_deleted")
    with pytest.raises(anthropic.NotFoundError):
        admin.organization.rbac_groups.retrieve(made.id)
    assert len(_audit(store, "rbac_group.delete")) == 1


def test_a_group_of_the_configuration_file_is_read_only_here(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    assert store.people is not None
    store.people.put_group("platform", org="research", source=SOURCE_CONFIG)
    listed = {g.name: g for g in admin.organization.rbac_groups.list()}
    assert (listed["platform"].model_extra or {})["source"] == "config"
    for change in (
        lambda: admin.organization.rbac_groups.update("platform", name="platform2"),
        lambda: admin.organization.rbac_groups.delete("platform"),
        lambda: admin.organization.rbac_groups.create(name="platform"),
    ):
        with pytest.raises(anthropic.ConflictError) as refused:
            change()
        assert "ezat.toml" in refused.value.message or "already" in refused.value.message
    assert store.people.get_group("platform").org == "research"
    with pytest.raises(anthropic.BadRequestError):
        admin.organization.rbac_groups.create(name="x", extra_body={"user_spend_limits": {"hourly": "1"}})
    with pytest.raises(anthropic.NotFoundError):
        admin.organization.rbac_groups.create(name="y", extra_body={"workspace_id": "nowhere"})


def test_a_read_only_admin_key_reads_people_and_groups_and_changes_nothing(
    reader: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    assert len(list(reader.organization.users.list())) == 3
    assert len(list(reader.organization.rbac_groups.list())) == 2
    ada = world["ada"].public_id
    for change in (
        lambda: reader.organization.users.update(ada, role="user"),
        lambda: reader.organization.users.remove(ada),
        lambda: reader.post(f"/v1/organizations/users/{ada}/disable", cast_to=object),
        lambda: reader.post(f"/v1/organizations/users/{ada}/revoke_keys", cast_to=object),
        lambda: reader.organization.rbac_groups.create(name="new"),
        lambda: reader.organization.rbac_groups.update("ml-team", name="renamed"),
        lambda: reader.organization.rbac_groups.delete("ml-team"),
        lambda: reader.beta.organization.spend_limits.set(amount="100", scope={"type": "user", "user_id": ada}),
    ):
        with pytest.raises(anthropic.PermissionDeniedError):
            change()
    assert store.people is not None and store.people.get(ada).disabled_at is None
    assert store.admin is not None and store.admin.entries(limit=50) == []


# ---------------------------------------------------------------- spend limits


def test_spend_limits_of_a_person_and_a_group(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    assert store.people is not None
    ada, group = world["ada"], store.people.get_group("ml-team")
    mine = admin.beta.organization.spend_limits.set(
        amount="1000", scope={"type": "user", "user_id": ada.email}, period="daily"
    )
    assert mine.scope.type == "user" and mine.scope.user_id == ada.public_id
    team = admin.beta.organization.spend_limits.set(
        amount="5000", scope={"type": "rbac_group", "rbac_group_id": "ml-team"}, period="daily"
    )
    assert team.scope.type == "rbac_group" and team.scope.rbac_group_id == group.public_id
    kinds = [limit.scope.type for limit in admin.beta.organization.spend_limits.list(scope_type=["user"])]
    assert kinds == ["user"]
    assert [s.id for s in admin.beta.organization.spend_limits.list(scope_type=["rbac_group"])] == [team.id]
    assert {a.action for a in _audit(store, "spend_limit.create")} == {"spend_limit.create"}
    with pytest.raises(anthropic.NotFoundError):
        admin.beta.organization.spend_limits.set(amount="1", scope={"type": "user", "user_id": "nobody@example.com"})
    with pytest.raises(anthropic.BadRequestError):
        admin.beta.organization.spend_limits.set(amount="1", scope={"type": "user"})  # type: ignore[typeddict-item]

    # ada's key: her own limit binds (least room), and per person the same with user_actor rows
    key, _ = store.people.mint_key(ada, hours=1)
    by_key = list(
        admin.organization.spend_limits.effective.list(
            period=["daily"], extra_query={"api_key_ids[]": ["apikey_" + key.id.removeprefix("key_")]}
        )
    )
    assert [(r.spend_limit_id, r.source.type) for r in by_key] == [(mine.id, "user")]
    by_person = list(admin.organization.spend_limits.effective.list(period=["daily"], user_ids=[ada.public_id]))
    (row,) = by_person
    assert row.actor.type == "user_actor" and row.actor.user_id == ada.public_id
    assert row.spend_limit_id == mine.id and row.scope.type == "user" and row.amount == "1000"
    (bob_row,) = admin.organization.spend_limits.effective.list(period=["daily"], user_ids=[world["bob"].public_id])
    assert bob_row.spend_limit_id == team.id  # only the group's applies to bob
    assert list(admin.organization.spend_limits.effective.list(user_ids=[world["cyd"].public_id])) == []

    # deleting the group deletes its limits too
    admin.organization.rbac_groups.delete("ml-team")
    assert [s.id for s in admin.beta.organization.spend_limits.list(scope_type=["rbac_group"])] == []


# ---------------------------------------------------------------- reports


def test_usage_and_cost_grouped_by_user_and_rbac_group(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    assert store.people is not None
    now = datetime.now(UTC)
    for name, cost in (("ada", 3), ("bob", 5), ("cyd", 7)):
        _key, secret = store.people.mint_key(world[name], hours=1)
        ctx = store.accounts.authenticate(secret, now)
        store.ledger.settle(f"req-{name}", entry(ctx, cost * USD, created_at=now))
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    end = start + timedelta(hours=3)
    rows = list(admin.beta.organization.analytics.cost.list(starting_at=start, ending_at=end, group_by=["actor"]))
    by_user = {r.group.actor.user_id: r.cost.amount for r in rows}
    assert by_user == {world["ada"].public_id: "300", world["bob"].public_id: "500", world["cyd"].public_id: "700"}
    grouped = list(
        admin.beta.organization.analytics.usage.list(starting_at=start, ending_at=end, group_by=["rbac_group_id"])
    )
    ml, sellers = store.people.get_group("ml-team"), store.people.get_group("sellers")
    assert {r.group.rbac_group_id: r.usage.requests for r in grouped} == {ml.public_id: 2, sellers.public_id: 1}

    # a key of nobody stays an api_actor; actor_types[] and actor_ids[] pick people or keys
    store.accounts.create_org("ops", 10 * USD)
    _, secret = store.accounts.create_key("ops")
    store.ledger.settle("req-ops", entry(store.accounts.authenticate(secret, now), 11 * USD, created_at=now))
    kinds = list(
        admin.beta.organization.analytics.cost.list(
            starting_at=start, ending_at=end, group_by=["actor_type"], order_by="amount"
        )
    )
    assert [(r.group.actor_type, r.cost.amount) for r in kinds] == [("user_actor", "1500"), ("api_actor", "1100")]
    just_bob = list(
        admin.beta.organization.analytics.cost.list(
            starting_at=start, ending_at=end, actor_ids=[world["bob"].public_id], group_by=["actor"]
        )
    )
    assert [(r.group.actor.user_id, r.cost.amount) for r in just_bob] == [(world["bob"].public_id, "500")]
    keys_only = list(
        admin.beta.organization.analytics.cost.list(starting_at=start, ending_at=end, actor_types=["api_actor"])
    )
    assert [r.cost.amount for r in keys_only] == ["1100"]
    by_group = list(
        admin.beta.organization.analytics.cost.list(
            starting_at=start, ending_at=end, rbac_group_ids=["sellers"], group_by=["workspace_id"]
        )
    )
    assert [(r.group.workspace_id, r.cost.amount) for r in by_group] == [
        (store.accounts.get_org("sales").public_id, "700")
    ]

    # the legacy report: a bucket a day, its results per group, a key of nobody in a null group
    (day,) = list(
        admin.beta.organization.analytics.usage_report.list(
            starting_at=now.replace(hour=0, minute=0, second=0, microsecond=0),
            bucket_width="1d",
            group_by=["rbac_group_id"],
            limit=1,
        )
    )
    assert {r.rbac_group_id: r.requests for r in day.results} == {ml.public_id: 2, sellers.public_id: 1, None: 1}


def test_rate_limits_of_a_person_and_of_a_groups_members(
    admin: anthropic.Anthropic, world: dict[str, PersonInfo], store: Store
) -> None:
    assert store.people is not None
    ada = world["ada"]
    changed = admin.organization.users.update(ada.public_id, role="user", extra_body={"rpm": 30, "tpm": 50000})
    assert (changed.model_extra or {})["rpm"] == 30 and (changed.model_extra or {})["tpm"] == 50000
    assert (store.people.get(ada.public_id).rpm, store.people.get(ada.public_id).tpm) == (30, 50000)
    [row] = _audit(store, "user.update")
    assert row.before["rpm"] is None and row.after["rpm"] == 30
    cleared = admin.organization.users.update(ada.public_id, role="user", extra_body={"tpm": None})
    assert (cleared.model_extra or {})["tpm"] is None and (cleared.model_extra or {})["rpm"] == 30
    with pytest.raises(anthropic.BadRequestError):
        admin.organization.users.update(ada.public_id, role="user", extra_body={"rpm": 0})
    # a group's: each member's cap, the lowest of their groups' (and read at authentication)
    group = admin.organization.rbac_groups.update(
        store.people.get_group("ml-team").public_id, extra_body={"user_rate_limits": {"rpm": 12}}
    )
    assert (group.model_extra or {})["user_rate_limits"] == {"rpm": 12, "tpm": None}
    bob = store.people.get(world["bob"].public_id)
    assert (bob.group_rpm, bob.group_tpm) == (12, None)
    _, secret = store.people.mint_key(bob, hours=1)
    assert store.accounts.authenticate(secret, datetime.now(UTC)).rpm == 12
    ada_key = store.people.mint_key(store.people.get(ada.public_id), hours=1)[1]
    assert store.accounts.authenticate(ada_key, datetime.now(UTC)).rpm == 12  # lower than her own 30
    assert store.accounts.authenticate(ada_key, datetime.now(UTC)).rate_id == f"u{ada.id}"
