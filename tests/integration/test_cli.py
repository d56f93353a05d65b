"""The operator interface (a contract: docs/operations.md): command names, flags, output shapes,
one-line errors without tracebacks, and ``serve`` running gunicorn with gevent workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port
from tests.integration.harness import ModelSpec, Sim
from tests.support.cli import run_in_process

pytestmark = pytest.mark.integration


def cli(config: Path | None, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["--config", str(config)] if config else []
    return subprocess.run(
        [sys.executable, "-m", "ezat_compat.cli", *prefix, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    path = tmp_path / "ezat.toml"
    spec = ModelSpec(deployments=[{"name": "d", "base_url": "http://127.0.0.1:9"}])
    path.write_text(f'[gateway]\ndatabase_url = "sqlite:///{tmp_path / "ezat.db"}"\n' + spec.toml())
    assert run_in_process(["--config", str(path), "db", "upgrade"]).returncode == 0  # admin commands never migrate
    return path


def test_db_upgrade_says_one_line_and_no_library_notes(tmp_path: Path) -> None:
    path = tmp_path / "ezat.toml"
    spec = ModelSpec(deployments=[{"name": "d", "base_url": "http://127.0.0.1:9"}])
    path.write_text(f'[gateway]\ndatabase_url = "sqlite:///{tmp_path / "ezat.db"}"\n' + spec.toml())
    done = cli(path, "db", "upgrade")
    assert done.returncode == 0 and done.stderr == "" and "alembic" not in done.stdout.lower()
    assert done.stdout.startswith("upgraded the database from revision none to ") and done.stdout.count("\n") == 1


def test_orgs_and_keys_lifecycle(config: Path) -> None:
    created = cli(config, "orgs", "create", "acme", "--balance", "12.5")
    assert created.returncode == 0 and "12.500000" in created.stdout
    assert cli(config, "orgs", "top-up", "acme", "0.000123").stdout.strip().endswith("$12.500123")
    assert cli(config, "orgs", "suspend", "acme").returncode == 0
    assert cli(config, "orgs", "resume", "acme").returncode == 0
    made = cli(
        config,
        "keys",
        "create",
        "--org",
        "acme",
        "--name",
        "ci",
        "--models",
        "anthropic/claude-*,x",
        "--spend-limit",
        "5",
        "--rpm",
        "60",
        "--tpm",
        "1000",
        "--expires",
        "2031-01-31T12:00:00Z",
    )
    secret = made.stdout.strip().splitlines()[-1]
    assert made.returncode == 0 and secret.startswith("ezat_sk_") and len(secret) >= 8 + 22
    (key,) = json.loads(cli(config, "keys", "list", "--json").stdout)
    assert set(key) == {
        "id",
        "prefix",
        "org",
        "name",
        "models",
        "spend_limit_usd",
        "spent_usd",
        "rpm",
        "tpm",
        "created_at",
        "expires_at",
        "revoked_at",
    }
    assert (
        key["org"],
        key["name"],
        key["models"],
        key["spend_limit_usd"],
        key["spent_usd"],
        key["rpm"],
        key["tpm"],
        key["revoked_at"],
    ) == ("acme", "ci", ["anthropic/claude-*", "x"], "5.000000", "0.000000", 60, 1000, None)
    assert key["expires_at"].startswith("2031-01-31T12:00:00") and secret.startswith(key["prefix"])
    assert secret not in cli(config, "keys", "list").stdout  # shown once, stored as a hash
    assert key["id"] in cli(config, "keys", "list", "--org", "acme").stdout
    assert cli(config, "keys", "revoke", key["id"]).returncode == 0
    assert json.loads(cli(config, "keys", "list", "--json").stdout)[0]["revoked_at"] is not None
    assert json.loads(cli(config, "usage", "--json").stdout) == []
    assert "COST_USD" in cli(config, "usage").stdout


def test_orgs_list_shows_balances_status_and_active_keys(config: Path) -> None:
    assert cli(config, "orgs", "create", "acme", "--balance", "12.5").returncode == 0
    assert cli(config, "orgs", "create", "beta").returncode == 0
    assert cli(config, "orgs", "suspend", "beta").returncode == 0
    for _ in range(2):
        assert cli(config, "keys", "create", "--org", "acme", "--expires", "2031-01-31T12:00:00Z").returncode == 0
    revoked = json.loads(cli(config, "keys", "list", "--json").stdout)[0]["id"]
    assert cli(config, "keys", "revoke", revoked).returncode == 0
    listed = cli(config, "orgs", "list", "--json")
    assert listed.returncode == 0 and listed.stderr == ""
    acme, beta = json.loads(listed.stdout)
    assert set(acme) == {"name", "balance_usd", "reserved_usd", "suspended", "keys", "created_at"}
    assert (acme["name"], acme["balance_usd"], acme["reserved_usd"], acme["suspended"], acme["keys"]) == (
        "acme",
        "12.500000",
        "0.000000",
        False,
        1,  # the revoked key is not counted
    )
    assert (beta["name"], beta["balance_usd"], beta["suspended"], beta["keys"]) == ("beta", "0.000000", True, 0)
    assert acme["created_at"].endswith("Z")
    header, _, *rows = cli(config, "orgs", "list").stdout.splitlines()
    assert header.split() == ["NAME", "BALANCE_USD", "RESERVED_USD", "STATUS", "KEYS", "CREATED"]
    assert [row.split()[:5] for row in rows] == [
        ["acme", "12.500000", "0.000000", "active", "1"],
        ["beta", "0.000000", "0.000000", "suspended", "0"],
    ]
    # an expired key no longer counts
    from ezat_compat.cli import org_rows
    from ezat_compat.config import load_config
    from ezat_compat.store.accounts import Accounts
    from ezat_compat.store.db import make_engine
    from ezat_compat.store.hotpath import make_hot_path

    engine = make_engine(load_config(config, environ={}).gateway.database_url)
    hot_path = make_hot_path(engine)
    try:
        accounts = Accounts(engine, hot_path)
        assert [o["keys"] for o in org_rows(accounts, datetime(2031, 1, 31, 11, tzinfo=UTC))] == [1, 0]
        assert [o["keys"] for o in org_rows(accounts, datetime(2031, 1, 31, 13, tzinfo=UTC))] == [0, 0]
    finally:
        hot_path.close()
        engine.dispose()


@pytest.mark.parametrize(
    "command, actions",
    [
        ("orgs", ["list", "create", "top-up", "suspend", "resume"]),
        ("keys", ["create", "list", "revoke"]),
        ("db", ["upgrade", "current", "check", "backup"]),
    ],
)
def test_help_lists_every_action_with_a_line_each(command: str, actions: list[str]) -> None:
    done = cli(None, command, "--help")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    for action in actions:
        (line,) = [line for line in lines if line.split()[:1] == [action]]
        assert len(line.split()) > 2, line  # the action, then what it does


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    "args",
    [("usage", "--json"), ("keys", "list"), ("--help",)],
    ids=["usage-json", "keys-list", "help"],
)
def test_output_into_a_closed_pipe_ends_quietly(config: Path, args: tuple[str, ...], unbuffered: str) -> None:
    """``usage --json | head``: the reader has gone before the command writes (a real pipe whose read
    end is closed), so every write fails with EPIPE: no traceback, no "Exception ignored", status 1
    (Unix tools: 141 by SIGPIPE, or 1). ``--help`` is printed by argparse, which ignores a failed write
    itself: quiet too. Python's stdout to a pipe is block-buffered unless PYTHONUNBUFFERED is set."""
    assert cli(config, "orgs", "create", "acme").returncode == 0
    assert cli(config, "keys", "create", "--org", "acme").returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ezat_compat.cli", "--config", str(config), *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**env, "PYTHONUNBUFFERED": unbuffered} if unbuffered else env,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode in ((0, 1) if args == ("--help",) else (1, 141))


@pytest.mark.parametrize(
    "args, message",
    [
        (("orgs", "top-up", "nobody", "5"), "nobody"),
        (("orgs", "create", "acme", "--balance", "-3"), "-3"),
        (("orgs", "create", "acme", "--balance", "1.0000001"), "1.0000001"),
        (("keys", "create", "--org", "nobody"), "nobody"),
        (("keys", "revoke", "key_000000000000"), "key_000000000000"),
        (("keys", "create", "--org", "x", "--expires", "tomorrow"), "--expires"),
        (("usage", "--since", "yesterday"), "--since"),
    ],
    ids=["unknown-org", "negative", "sub-micro", "key-for-unknown-org", "unknown-key", "bad-expiry", "bad-since"],
)
def test_mistakes_are_one_line_errors(config: Path, args: tuple[str, ...], message: str) -> None:
    done = cli(config, *args)
    assert done.returncode == 1 and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_bad_config_file_names_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "ezat.toml"
    bad.write_text('[gateway]\ndatabse_url = "x"\n')
    for command in (("serve",), ("keys", "list")):
        done = cli(bad, *command)
        assert done.returncode == 1 and "ezat.toml: gateway.databse_url: Unknown field." in done.stderr
        assert "Traceback" not in done.stderr
    missing = cli(None, "keys", "list", env={"EZAT_CONFIG": str(tmp_path / "nope.toml")})
    assert missing.returncode == 1 and "nope.toml: no such configuration file" in missing.stderr


def test_environment_overrides_the_database(tmp_path: Path, config: Path) -> None:
    other = tmp_path / "other.db"
    assert cli(config, "db", "upgrade", env={"EZAT_DATABASE_URL": f"sqlite:///{other}"}).returncode == 0
    assert cli(config, "orgs", "create", "env-org", env={"EZAT_DATABASE_URL": f"sqlite:///{other}"}).returncode == 0
    assert other.exists()
    assert cli(config, "keys", "create", "--org", "env-org").returncode == 1  # not in the file's database


def test_serve_runs_gunicorn_with_gevent_workers(tmp_path: Path) -> None:
    sim = Sim(name="serve-sim").start()
    port = free_port()
    path = tmp_path / "ezat.toml"
    spec = ModelSpec(deployments=[{"name": "sim", "base_url": sim.url}])
    path.write_text(f'[gateway]\ndatabase_url = "sqlite:///{tmp_path / "db.sqlite"}"\n' + spec.toml())
    env = {**os.environ, "ANTHROPIC_API_KEY": "k"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ezat_compat.cli",
            "--config",
            str(path),
            "serve",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        key = cli(path, "keys", "create", "--org", "o") if cli(path, "orgs", "create", "o", "--balance", "1") else None
        assert key is not None and key.returncode == 0
        resp = requests.post(
            f"http://127.0.0.1:{port}/openai/v1/chat/completions",
            headers={"authorization": "Bearer " + key.stdout.strip().splitlines()[-1]},
            json={"model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        sim.stop()
    # gunicorn's gevent worker, as ours (server/worker.py: its own refusals in the JSON envelope)
    assert "Using worker: ezat_compat.server.worker.JSONErrorsGeventWorker" in stderr
    assert stderr.count("Booting worker") >= 2


def test_check_config_validates_without_connecting(config: Path) -> None:
    done = cli(config, "check-config", env={"ANTHROPIC_API_KEY": "k"})
    assert done.returncode == 0 and done.stderr == ""
    fresh = config.parent / "fresh"
    fresh.mkdir()
    (fresh / "ezat.toml").write_text(config.read_text().replace(str(config.parent / "ezat.db"), str(fresh / "new.db")))
    assert cli(fresh / "ezat.toml", "check-config", env={"ANTHROPIC_API_KEY": "k"}).returncode == 0
    assert not (fresh / "new.db").exists()  # it creates nothing (the README says so), not even the database
    egress, verdict = done.stdout.strip().splitlines()
    assert egress.startswith("deployment ") and "proxy: " in egress and "CA bundle: " in egress  # test_egress.py
    assert verdict == (
        f"{config}: the configuration is valid (1 models, 1 deployments, "
        f"database sqlite:///{config.parent / 'ezat.db'})"
    )
    unreachable = cli(
        config,
        "check-config",
        env={"ANTHROPIC_API_KEY": "k", "EZAT_DATABASE_URL": "postgresql+psycopg://u@127.0.0.1:1/d"},
    )
    assert unreachable.returncode == 0  # like nginx -t: the file, not the servers it names


def test_check_config_fails_for_a_model_without_a_usable_deployment(config: Path) -> None:
    """Routing skips a deployment whose key variable is unset or empty: with none left, every request to the
    model would answer 500. check-config says so in one line naming the variable (a warning and exit 0 before)."""
    done = cli(config, "check-config", env={"ANTHROPIC_API_KEY": ""})
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "ezat-compat: model anthropic/claude-sonnet-5-5 has no usable deployment: ANTHROPIC_API_KEY "
        "(deployment d) is not set in the environment"
    ]
    assert cli(config, "check-config", env={"ANTHROPIC_API_KEY": "k"}).returncode == 0


def read_only(folder: Path, argv: list[str]) -> list[str]:
    """``argv`` run with ``folder`` read-only, as systemd's ``ProtectSystem=strict`` leaves
    /etc: a read-only bind mount in a mount namespace of its own when run as root (whom
    permission bits don't stop), else the folder made 0500."""
    if os.geteuid() != 0:
        folder.chmod(0o500)
        return argv
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], check=False).returncode:
        pytest.skip("running as root without mount namespaces (unshare -m)")
    mount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", mount, str(folder), *argv]


def test_check_config_fails_in_one_line_when_the_data_folder_is_read_only(config: Path, tmp_path: Path) -> None:
    """The shipped unit's /etc/ezat is read-only: a data folder there left every Responses request
    a 500 while check-config said the configuration was valid."""
    state = tmp_path / "state"
    state.mkdir()
    config.write_text(config.read_text().replace("[gateway]\n", f'[gateway]\ndata_dir = "{state}"\n', 1))
    argv = [sys.executable, "-m", "ezat_compat.cli", "--config", str(config), "check-config"]
    env = {**os.environ, "ANTHROPIC_API_KEY": "k"}
    env.pop("EZAT_SEALING_KEY", None)
    done = subprocess.run(read_only(state, argv), capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"ezat-compat: the gateway could not write its files: data_dir: {state} is not writable "
        f"({'Read-only file system' if os.geteuid() == 0 else 'Permission denied'})"
    ]
    # the unit's way out: EZAT_DATA_DIR names its StateDirectory, which is writable
    writable = {**env, "EZAT_DATA_DIR": str(tmp_path / "var-lib")}
    ok = subprocess.run(read_only(state, argv), capture_output=True, text=True, timeout=60, env=writable)
    assert ok.returncode == 0, ok.stderr
    assert not (tmp_path / "var-lib").exists()  # check-config makes nothing (it may run as another user)


def test_check_config_and_serve_name_a_log_file_that_cant_be_written(config: Path, tmp_path: Path) -> None:
    """``check-config`` (the unit's ExecStartPre) checks the log files too: a missing or read-only
    logs folder failed only at the start, with gunicorn's "Unable to configure handler"."""
    logs = tmp_path / "logs"
    server = f'[server]\naccess_log = "{logs}/access.log"\nerror_log = "{logs}/error.log"\n'
    config.write_text(server + config.read_text())
    env = {"ANTHROPIC_API_KEY": "k"}
    missing = cli(config, "check-config", env=env)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.strip() == (
        f"ezat-compat: the gateway could not write its files: access_log: the folder {logs} does not exist; "
        f"error_log: the folder {logs} does not exist"
    )
    serve = cli(config, "serve", "--bind", f"127.0.0.1:{free_port()}", env=env)
    assert serve.returncode == 1 and "Unable to configure handler" not in serve.stderr
    assert f"access_log: the folder {logs} does not exist" in serve.stderr.strip().splitlines()[-1]
    logs.mkdir()
    argv = [sys.executable, "-m", "ezat_compat.cli", "--config", str(config), "check-config"]
    done = subprocess.run(read_only(logs, argv), capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 1 and f"access_log: {logs} is not writable" in done.stderr, done.stderr
    logs.chmod(0o700)
    assert cli(config, "check-config", env=env).returncode == 0
    assert not (logs / "access.log").exists()  # check-config makes nothing


@pytest.mark.parametrize(
    "key_file, env_key, message",
    [
        ("not a key\n", "", "ezat-sealing.key holds no 32-byte key (hex or base64): restore it from a backup"),
        (None, "abc", "EZAT_SEALING_KEY must hold 32 bytes as hex or base64"),
        ("ab" * 32 + "\n", "", None),
        (None, "cd" * 32, None),
    ],
    ids=["bad-key-file", "bad-key-variable", "key-file", "key-variable"],
)
def test_check_config_reads_the_sealing_key(
    config: Path, key_file: str | None, env_key: str, message: str | None
) -> None:
    if key_file is not None:
        (config.parent / "ezat-sealing.key").write_text(key_file)
    done = cli(config, "check-config", env={"ANTHROPIC_API_KEY": "k", "EZAT_SEALING_KEY": env_key})
    if message is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert message in done.stderr, done.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("[server]\nworkerz = 2\n", "ezat.toml: server.workerz: Unknown field."),
        ('[server]\nbind = "127.0.0.1:http"\n', "cannot listen on 127.0.0.1:http: use HOST:PORT"),
        ('[gateway]\ndatabase_url = "mysql://u@h/d"\n', "unsupported database URL 'mysql://u@h/d'"),
        ("[gateway\n", "ezat.toml: invalid TOML"),
        (
            '[gateway]\nkeepalive_s = -1\nmax_body_mb = "big"\n',
            "ezat.toml: gateway.keepalive_s: Must be greater than 0.; "
            "ezat.toml: gateway.max_body_mb: Not a valid number.",
        ),
    ],
    ids=["unknown-key", "bad-bind", "unsupported-database", "not-toml", "two-problems"],
)
def test_check_config_refuses_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "ezat.toml"
    spec = ModelSpec(deployments=[{"name": "d", "base_url": "http://127.0.0.1:9"}])
    path.write_text(text + spec.toml() if not text.startswith("[gateway\n") else text)
    done = cli(path, "check-config", env={"ANTHROPIC_API_KEY": "k"})
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
