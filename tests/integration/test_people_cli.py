"""``ezat-compat users …`` and ``ezat-compat groups …`` (people_cli.py), run as the operator runs
them: people listed (all, or one IdP group's; a table or one JSON array), disabled with or without
their keys, enabled, their keys revoked; groups mapped, changed, listed and deleted, a group of the
configuration file refused naming the file; ``spend-limits set --scope user:…|group:…``; an audit
row naming ``cli:<unix user>`` for every change; mistakes as one-line errors."""

from __future__ import annotations

import getpass
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ezat_compat.domain import IdentitySettings
from ezat_compat.store.people import SOURCE_CONFIG
from ezat_compat.store.store import Store, open_store
from tests.integration.harness import ModelSpec
from tests.support.cli import run_in_process

pytestmark = pytest.mark.integration

IDENTITY = IdentitySettings(groups_claim="groups")


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command's main, in this process (tests/integration/test_cli.py runs the program)."""
    return run_in_process(["--config", str(config), *args])


def ok(config: Path, *args: str) -> str:
    done = cli(config, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    path = tmp_path / "ezat.toml"
    spec = ModelSpec(deployments=[{"name": "d", "base_url": "http://127.0.0.1:9"}])
    path.write_text(f'[gateway]\ndatabase_url = "sqlite:///{tmp_path / "ezat.db"}"\n' + spec.toml())
    ok(path, "db", "upgrade")
    ok(path, "orgs", "create", "research")
    ok(path, "orgs", "create", "sales")
    return path


@pytest.fixture()
def store(config: Path, tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'ezat.db'}")
    yield opened
    opened.close()


def _sign_in(store: Store, name: str, groups: list[str]) -> str:
    assert store.people is not None
    claims = {"sub": f"sub-{name}", "email": f"{name}@example.com", "groups": groups}
    return store.people.sign_in(claims, IDENTITY).public_id


def _audit(config: Path) -> list[dict[str, Any]]:
    return list(json.loads(ok(config, "audit", "list", "--json")))


def test_groups_are_mapped_changed_listed_and_deleted(config: Path, store: Store) -> None:
    made = ok(config, "groups", "set", "ml-team", "--org", "research", "--models", "anthropic/*", "--daily-usd", "5")
    assert "group ml-team (group_" in made and "org research" in made and "daily 5.000000" in made
    ok(config, "groups", "set", "ml-team", "--monthly-usd", "100", "--daily-usd", "none")
    (group,) = json.loads(ok(config, "groups", "list", "--json"))
    assert (group["name"], group["org"], group["models"], group["source"]) == (
        "ml-team",
        "research",
        ["anthropic/*"],
        "api",
    )
    assert (group["daily_usd"], group["weekly_usd"], group["monthly_usd"]) == (None, None, "100.000000")
    listed = ok(config, "groups", "list")
    assert "ml-team" in listed and "research" in listed and "100.000000" in listed

    assert store.people is not None
    store.people.put_group("platform", org="sales", source=SOURCE_CONFIG)
    refused = cli(config, "groups", "set", "platform", "--org", "research")
    assert refused.returncode == 1 and str(config) in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert cli(config, "groups", "delete", "platform").returncode == 1
    assert store.people.get_group("platform").org == "sales"

    assert ok(config, "groups", "delete", "ml-team").strip() == f"deleted group ml-team ({group['id']})"
    assert [g["name"] for g in json.loads(ok(config, "groups", "list", "--json"))] == ["platform"]
    actions = [row["action"] for row in _audit(config) if row["target"]["type"] == "rbac_group"]
    assert actions == ["rbac_group.delete", "rbac_group.update", "rbac_group.create"]
    assert all(row["actor"] == f"cli:{getpass.getuser()}" for row in _audit(config))


def test_people_listed_disabled_enabled_and_their_keys_revoked(config: Path, store: Store) -> None:
    ok(config, "groups", "set", "ml-team", "--org", "research")
    ada = _sign_in(store, "ada", ["ml-team"])
    bob = _sign_in(store, "bob", ["ml-team", "other"])
    assert store.people is not None
    key, _ = store.people.mint_key(store.people.get(ada), hours=1)

    everyone = json.loads(ok(config, "users", "list", "--json"))
    assert [(p["id"], p["email"], p["org"], p["status"]) for p in everyone] == [
        (ada, "ada@example.com", "research", "active"),
        (bob, "bob@example.com", "research", "active"),
    ]
    assert everyone[0]["live_keys"] == 1 and everyone[1]["groups"] == ["ml-team", "other"]
    assert [p["email"] for p in json.loads(ok(config, "users", "list", "--group", "other", "--json"))] == [
        "bob@example.com"
    ]
    table = ok(config, "users", "list")
    assert "ada@example.com" in table and "STATUS" in table

    assert ok(config, "users", "disable", "ada@example.com").strip() == f"disabled {ada} (ada@example.com)"
    assert store.people.get(ada).disabled_at is not None and store.accounts.get_key(key.id).revoked_at is None
    assert ok(config, "users", "enable", ada).strip() == f"enabled {ada} (ada@example.com)"
    assert ok(config, "users", "revoke-keys", ada).strip() == f"revoked 1 key of {ada} (ada@example.com)"
    assert store.accounts.get_key(key.id).revoked_at is not None
    bob_key, _ = store.people.mint_key(store.people.get(bob), hours=1)
    ok(config, "users", "disable", bob, "--revoke-keys")
    assert store.accounts.get_key(bob_key.id).revoked_at is not None
    assert json.loads(ok(config, "users", "list", "--json"))[1]["status"] == "disabled"

    actions = [row["action"] for row in _audit(config) if row["target"]["type"] == "user"]
    assert actions == ["user.disable", "user.revoke_keys", "user.enable", "user.disable"]


def test_spend_limits_of_a_person_and_a_group_from_the_command_line(config: Path, store: Store) -> None:
    ok(config, "groups", "set", "ml-team", "--org", "research")
    _sign_in(store, "ada", ["ml-team"])
    mine = ok(config, "spend-limits", "set", "--scope", "user:ada@example.com", "--period", "daily", "--usd", "10")
    assert "user:ada@example.com daily 10.000000 USD" in mine
    team = ok(config, "spend-limits", "set", "--scope", "group:ml-team", "--period", "monthly", "--usd", "500")
    assert "group:ml-team monthly 500.000000 USD" in team
    scopes = {row["scope"] for row in json.loads(ok(config, "spend-limits", "list", "--json"))}
    assert scopes == {"user:ada@example.com", "group:ml-team"}
    missing = cli(
        config, "spend-limits", "set", "--scope", "user:nobody@example.com", "--period", "daily", "--usd", "1"
    )
    assert missing.returncode == 1 and "nobody@example.com" in missing.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("users", "disable", "nobody@example.com"), "nobody@example.com"),
        (("users", "enable", "user_missing"), "user_missing"),
        (("users", "revoke-keys", "nobody"), "nobody"),
        (("groups", "delete", "nothing"), "nothing"),
        (("groups", "set", "g", "--org", "nowhere"), "nowhere"),
        (("groups", "set", "g", "--daily-usd", "lots"), "lots"),
    ],
)
def test_mistakes_are_one_line_errors(config: Path, args: tuple[str, ...], words: str) -> None:
    done = cli(config, *args)
    assert done.returncode == 1, done.stdout
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_rate_limits_of_a_person_and_a_group_from_the_command_line(config: Path, store: Store) -> None:
    assert store.people is not None
    ok(config, "groups", "set", "ml-team", "--org", "research", "--rpm", "20")
    assert store.people.get_group("ml-team").rpm == 20
    ok(config, "groups", "set", "ml-team", "--tpm", "9000")  # what isn't given stays
    assert (store.people.get_group("ml-team").rpm, store.people.get_group("ml-team").tpm) == (20, 9000)
    person = store.people.sign_in({"sub": "s-eve", "email": "eve@example.com", "groups": ["ml-team"]}, IDENTITY)
    assert (person.group_rpm, person.group_tpm) == (20, 9000)
    ok(config, "users", "set-rate-limits", "eve@example.com", "--rpm", "5")
    assert store.people.get("eve@example.com").rpm == 5
    ok(config, "users", "set-rate-limits", "eve@example.com", "--rpm", "none")
    assert store.people.get("eve@example.com").rpm is None
    refused = cli(config, "users", "set-rate-limits", "eve@example.com", "--rpm", "0")
    assert refused.returncode == 1 and "--rpm" in refused.stderr
