"""The admin commands of the operator interface (docs/admin-api.md): ``admin-keys create|list|
revoke``, ``audit list``, ``keys rotate|block|unblock``, and the audit rows every change leaves,
naming ``cli:<unix user>``; their one-line errors."""

from __future__ import annotations

import getpass
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.harness import ModelSpec
from tests.support.cli import run_in_process

pytestmark = pytest.mark.integration


def cli(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command's main, in this process (tests/integration/test_cli.py runs the program)."""
    return run_in_process(["--config", str(config), *args], env)


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
    return path


def test_admin_keys_are_made_listed_and_revoked(config: Path) -> None:
    made = cli(
        config, "admin-keys", "create", "--name", "terraform", "--read-only", "--expires", "2031-01-01T00:00:00Z"
    )
    assert made.returncode == 0
    secret = made.stdout.strip().splitlines()[-1]
    assert secret.startswith("ezat_admin_") and "read-only admin key adminkey_" in made.stderr
    (key,) = json.loads(ok(config, "admin-keys", "list", "--json"))
    assert key["name"] == "terraform" and key["read_only"] is True and key["status"] == "active"
    assert key["expires_at"].startswith("2031-01-01T00:00:00") and secret.startswith(key["prefix"])
    table = ok(config, "admin-keys", "list")
    assert key["id"] in table and "read-only" in table and secret not in table
    assert ok(config, "admin-keys", "revoke", key["id"]).strip() == f"revoked admin key {key['id']}"
    assert json.loads(ok(config, "admin-keys", "list", "--json"))[0]["status"] == "revoked"


def test_rotate_block_and_unblock(config: Path) -> None:
    ok(config, "orgs", "create", "acme")
    first = ok(config, "keys", "create", "--org", "acme").strip().splitlines()[-1]
    (key,) = json.loads(ok(config, "keys", "list", "--json"))
    rotated = cli(config, "keys", "rotate", key["id"], "--grace-seconds", "60")
    assert rotated.returncode == 0 and "works for 60 s more" in rotated.stderr
    second = rotated.stdout.strip().splitlines()[-1]
    assert second.startswith("ezat_sk_") and second != first
    assert json.loads(ok(config, "keys", "list", "--json"))[0]["prefix"] == second[:12]
    assert ok(config, "keys", "block", key["id"]).strip() == f"blocked key {key['id']}"
    assert ok(config, "keys", "unblock", key["id"]).strip() == f"unblocked key {key['id']}"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("keys", "rotate", "key_000000000000"), "key_000000000000"),
        (("keys", "block", "key_000000000000"), "key_000000000000"),
        (("keys", "rotate", "key_000000000000", "--grace-seconds", "-1"), "--grace-seconds"),
        (("admin-keys", "revoke", "adminkey_nope"), "adminkey_nope"),
        (("admin-keys", "create", "--expires", "2001-01-01T00:00:00Z"), "past"),
        (("audit", "list", "--since", "yesterday"), "--since"),
    ],
    ids=["rotate-unknown", "block-unknown", "negative-grace", "revoke-unknown-admin-key", "expired", "bad-since"],
)
def test_mistakes_are_one_line_errors(config: Path, args: tuple[str, ...], words: str) -> None:
    done = cli(config, *args)
    assert done.returncode in (1, 2) and words in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2


def test_every_change_of_the_cli_leaves_an_audit_row_naming_the_unix_user(config: Path) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    ok(config, "orgs", "create", "acme", "--balance", "5")
    ok(config, "orgs", "top-up", "acme", "1")
    ok(config, "orgs", "suspend", "acme")
    ok(config, "orgs", "resume", "acme")
    secret = ok(config, "keys", "create", "--org", "acme").strip().splitlines()[-1]
    (key,) = json.loads(ok(config, "keys", "list", "--json"))
    ok(config, "keys", "update", key["id"], "--rpm", "10")
    ok(config, "keys", "revoke", key["id"])
    trail = json.loads(ok(config, "audit", "list", "--json", "--since", before.isoformat()))
    assert [e["action"] for e in reversed(trail)] == [
        "workspace.create",
        "workspace.top_up",
        "workspace.archive",
        "workspace.unarchive",
        "api_key.create",
        "api_key.update",
        "api_key.archive",
    ]
    assert {e["actor"] for e in trail} == {f"cli:{getpass.getuser()}"}
    assert (trail[1]["before"]["rpm"], trail[1]["after"]["rpm"]) == (None, 10)
    assert secret not in json.dumps(trail)
    assert json.loads(ok(config, "audit", "list", "--json", "--since", "2999-01-01T00:00:00Z")) == []
    table = ok(config, "audit", "list")
    assert "api_key.archive" in table.splitlines()[2] and "workspace.create" in table.splitlines()[-1]


@pytest.mark.parametrize(
    ("admin_bind", "words"),
    [
        ("127.0.0.1:8080", "for the admin API: the main listener"),
        ("127.0.0.1:x", "cannot listen on 127.0.0.1:x: use HOST:PORT"),
    ],
    ids=["main-port", "not-an-address"],
)
def test_check_config_judges_the_admin_listener(config: Path, admin_bind: str, words: str) -> None:
    done = cli(config, "check-config", env={"EZAT_ADMIN_BIND": admin_bind, "EZAT_BIND": "127.0.0.1:8080"})
    assert done.returncode == 1 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_every_change_of_the_cli_writes_its_audit_line_where_the_gateway_logs(config: Path) -> None:
    """One JSON line per change on stderr ([server] error_log "-"), as the admin API's changes
    write theirs; never the secret a command prints."""
    made = cli(config, "orgs", "create", "acme", "--balance", "5")
    (line,) = [json.loads(text) for text in made.stderr.splitlines() if text.startswith("{")]
    assert (line["logger"], line["level"]) == ("ezat_compat.audit", "info")
    entry = json.loads(line["message"])
    assert (entry["action"], entry["actor"]) == ("workspace.create", f"cli:{getpass.getuser()}")
    created = cli(config, "keys", "create", "--org", "acme")
    secret = created.stdout.strip().splitlines()[-1]
    assert secret.startswith("ezat_sk_") and secret not in created.stderr
    assert [
        json.loads(json.loads(text)["message"])["action"]
        for text in created.stderr.splitlines()
        if text.startswith("{")
    ] == ["api_key.create"]
    listed = cli(config, "keys", "list", "--json")
    assert listed.stderr == ""  # a read leaves no line
    log = config.parent / "error.log"
    config.write_text(config.read_text().replace("[gateway]\n", f'[server]\nerror_log = "{log}"\n\n[gateway]\n', 1))
    assert cli(config, "orgs", "top-up", "acme", "1").stderr == ""
    assert json.loads(json.loads(log.read_text().strip())["message"])["action"] == "workspace.top_up"
