"""Running the gateway as an operations team does: ``ezat-compat serve`` under gunicorn for
real on loopback, SIGHUP with a broken and then a fixed file, start-up failures in one line,
the pidfile and process titles, a deployment whose key variable is unset, the database
commands (``db upgrade | current | check | backup``, the ``alembic`` command), the demo's
process handling and the systemd unit (``systemd-analyze verify``)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from alembic.script import ScriptDirectory

from ezat_compat.store.db import alembic_config
from tests.conftest import IN_CI, free_port
from tests.integration.harness import REPO, ModelSpec, Sim

HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()  # this release's newest schema

pytestmark = pytest.mark.integration

SIM_KEY_ENV = "EZAT_TEST_SIM_KEY"
UNSET_KEY_ENV = "EZAT_TEST_UNSET_KEY"
KEYS = {SIM_KEY_ENV: "sk-sim", UNSET_KEY_ENV: "sk-other"}  # every deployment's key: check-config passes


def cli(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ezat_compat.cli", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The process failed with exactly one ``ezat-compat:`` line and no traceback; that line."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("ezat-compat:")]
    assert len(ours) == 1, done.stderr
    return ours[0]


def write_config(
    path: Path, sim_url: str, *, alias: str = "claude-sonnet-5-5", server: str = "", database_url: str = ""
) -> None:
    served = ModelSpec(aliases=(alias,), deployments=[{"name": "sim", "base_url": sim_url}])
    keyless = ModelSpec(
        id="anthropic/claude-keyless",
        aliases=("claude-keyless",),
        deployments=[{"name": "keyless", "base_url": sim_url}],
    )
    text = served.toml().replace('name = "sim"', f'name = "sim"\napi_key_env = "{SIM_KEY_ENV}"')
    text += keyless.toml().replace('name = "keyless"', f'name = "keyless"\napi_key_env = "{UNSET_KEY_ENV}"')
    database_url = database_url or f"sqlite:///{(path.parent / 'ezat.db').as_posix()}"
    path.write_text(
        f'[gateway]\ndatabase_url = "{database_url}"\n\n[server]\nworkers = 1\ngraceful_timeout_s = 5\n{server}\n'
        + text
    )


def serve_env() -> dict[str, str]:
    env = {**os.environ, SIM_KEY_ENV: "sk-sim"}
    for name in (UNSET_KEY_ENV, "PROMETHEUS_MULTIPROC_DIR", "EZAT_DATABASE_URL", "EZAT_BIND"):
        env.pop(name, None)
    return env


def wait_for(condition: object, timeout_s: float = 30, what: str = "condition") -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def serving(config: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``ezat-compat serve`` on a free port, its stderr in ``log``; stopped with SIGTERM."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ezat_compat.cli", "--config", str(config), "serve", "--bind", f"127.0.0.1:{port}"],
            env=serve_env(),
            stderr=stderr,
        )
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, 60, "the gateway")
        assert proc.poll() is None, log.read_text()
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def chat(url: str, key: str, model: str) -> requests.Response:
    return requests.post(
        url + "/openai/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": model, "max_completion_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def new_key(config: Path) -> str:
    assert cli(config, "orgs", "create", "ops", "--balance", "10").returncode == 0
    made = cli(config, "keys", "create", "--org", "ops")
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="ops-sim").start()
    yield server
    server.stop()


# ---------------------------------------------------------------- SIGHUP, pidfile, titles, keys


def test_sighup_refuses_a_bad_file_and_takes_a_fixed_one(tmp_path: Path, sim: Sim) -> None:
    config, log = tmp_path / "ezat.toml", tmp_path / "serve.log"
    pidfile = tmp_path / "run" / "ezat.pid"
    pidfile.parent.mkdir()
    write_config(config, sim.url, server=f'pidfile = "{pidfile}"\nname = "ops-a"')
    with serving(config, log) as (proc, url):
        key = new_key(config)
        # serve execs gunicorn: the process we started is the master, named in ps and in the pidfile
        assert pidfile.read_text().strip() == str(proc.pid)
        assert cmdline(proc.pid) == "gunicorn: master [ezat-compat: ops-a]"
        (worker,) = children(proc.pid)
        assert cmdline(worker) == "gunicorn: worker [ezat-compat: ops-a]"
        assert chat(url, key, "claude-sonnet-5-5").status_code == 200

        good = config.read_text()
        config.write_text(good.replace("[server]", "[server]\nworkerz = 3"))
        assert one_line_error(cli(config, "check-config", env=KEYS)).endswith("server.workerz: Unknown field.")
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: "configuration not reloaded" in log.read_text(), 30, "the refusal in the log")
        refusal = [line for line in log.read_text().splitlines() if "configuration not reloaded" in line]
        assert len(refusal) == 1 and "server.workerz: Unknown field." in refusal[0]
        assert "keep serving the previous configuration" in refusal[0]
        assert "Traceback" not in log.read_text()
        time.sleep(1.0)  # the reload's new worker has booted
        assert proc.poll() is None
        for _ in range(5):
            assert chat(url, key, "claude-sonnet-5-5").status_code == 200
        assert [m["id"] for m in requests.get(url + "/api/models", timeout=10).json()["data"]] == [
            "anthropic/claude-sonnet-5-5",
            "anthropic/claude-keyless",
        ]

        config.write_text(good.replace('aliases = ["claude-sonnet-5-5"]', 'aliases = ["sonnet-renamed"]'))
        assert cli(config, "check-config", env=KEYS).returncode == 0
        old_workers = set(children(proc.pid))
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: chat(url, key, "sonnet-renamed").status_code == 200, 30, "the new configuration")
        # gunicorn's old worker accepts for up to a second more (its loop looks at its state once
        # a second): once it is gone, only the new configuration answers
        wait_for(lambda: not set(children(proc.pid)) & old_workers, 30, "the old worker to exit")
        assert chat(url, key, "claude-sonnet-5-5").status_code == 404
        assert chat(url, key, "sonnet-renamed").status_code == 200
        assert "configuration reloaded from" in log.read_text()
        assert pidfile.read_text().strip() == str(proc.pid)
    assert proc.returncode == 0
    assert not pidfile.exists()  # removed on exit


def test_a_deployment_without_its_key_is_warned_about_and_skipped(tmp_path: Path, sim: Sim) -> None:
    config, log = tmp_path / "ezat.toml", tmp_path / "serve.log"
    write_config(config, sim.url)
    with serving(config, log) as (_, url):
        key = new_key(config)
        warnings = [line for line in log.read_text().splitlines() if UNSET_KEY_ENV in line]
        assert len(warnings) == 1 and '"level":"warning"' in warnings[0] and "deployment keyless" in warnings[0]
        assert "alembic" not in log.read_text()  # the start migrated the database: no library's INFO notes
        sim.clear()
        resp = chat(url, key, "claude-keyless")
        assert resp.status_code == 500
        assert UNSET_KEY_ENV in resp.json()["error"]["message"]
        assert sim.bodies() == []  # never sent upstream without a key
        assert chat(url, key, "claude-sonnet-5-5").status_code == 200
    # check-config refuses a model that no deployment can serve (serve warns and starts: the others work)
    checked = cli(config, "check-config", env={SIM_KEY_ENV: "sk-sim", UNSET_KEY_ENV: ""})
    assert checked.stdout == ""
    assert one_line_error(checked) == (
        f"ezat-compat: model anthropic/claude-keyless has no usable deployment: {UNSET_KEY_ENV} "
        "(deployment keyless) is not set in the environment"
    )
    assert cli(config, "check-config", env=KEYS).returncode == 0


# ---------------------------------------------------------------- start-up in one line


def _start(args: list[str], config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
        env={**serve_env(), "EZAT_CONFIG": str(config), **(env or {})},
    )


def _serve_argv(config: Path, bind: str) -> list[str]:
    return [sys.executable, "-m", "ezat_compat.cli", "--config", str(config), "serve", "--bind", bind]


GUNICORN_ARGV = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]


@pytest.mark.parametrize("how", ["serve", "gunicorn"])
def test_a_bind_in_use_is_one_line(tmp_path: Path, sim: Sim, how: str) -> None:
    config = tmp_path / "ezat.toml"
    write_config(config, sim.url)
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        bind = f"127.0.0.1:{holder.getsockname()[1]}"
        argv = _serve_argv(config, bind) if how == "serve" else GUNICORN_ARGV
        done = _start(argv, config, {"EZAT_BIND": bind})
    assert one_line_error(done) == (
        f"ezat-compat: cannot listen on {bind}: the address is already in use (another server, or another ezat-compat?)"
    )


@pytest.mark.parametrize(
    "database_url, message",
    [
        (
            "postgresql+psycopg://nobody@127.0.0.1:{port}/db",
            "cannot use the database postgresql+psycopg://nobody@127.0.0.1:{port}/db: ",
        ),
        (
            "mysql://u:secret@127.0.0.1/db",
            "unsupported database URL 'mysql://u:***@127.0.0.1/db': use sqlite:///PATH or postgresql",
        ),
        (
            "sqlite:////nonexistent-dir/x/ezat.db",
            "cannot use the database sqlite:////nonexistent-dir/x/ezat.db: unable to open database file",
        ),
    ],
    ids=["unreachable-postgres", "unsupported", "sqlite-folder-missing"],
)
def test_database_problems_at_start_are_one_line(tmp_path: Path, sim: Sim, database_url: str, message: str) -> None:
    port = free_port()  # nothing listens there
    config = tmp_path / "ezat.toml"
    write_config(config, sim.url, database_url=database_url.format(port=port))
    line = one_line_error(_start(_serve_argv(config, f"127.0.0.1:{free_port()}"), config))
    assert line.startswith("ezat-compat: " + message.format(port=port)), line
    assert "secret" not in line


# ---------------------------------------------------------------- database operations


@pytest.fixture()
def db_config(tmp_path: Path) -> Path:
    path = tmp_path / "ezat.toml"
    write_config(path, "http://127.0.0.1:9")
    return path


def _stamp(db_path: Path, revision: str) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (revision,))


def test_admin_commands_never_migrate(db_config: Path) -> None:
    db_path = db_config.parent / "ezat.db"
    line = one_line_error(cli(db_config, "keys", "list"))
    assert "no schema yet: run `ezat-compat db upgrade`" in line
    assert one_line_error(cli(db_config, "db", "check")) == line
    assert cli(db_config, "db", "current").stdout.strip() == "none"

    upgraded = cli(db_config, "db", "upgrade")
    assert upgraded.returncode == 0 and upgraded.stdout.strip() == f"upgraded the database from revision none to {HEAD}"
    assert cli(db_config, "db", "current").stdout.strip() == f"{HEAD} (head)"
    assert cli(db_config, "db", "check").returncode == 0
    assert cli(db_config, "db", "upgrade").stdout.strip() == f"the database's schema is up to date (revision {HEAD})"
    assert cli(db_config, "orgs", "create", "acme").returncode == 0

    _stamp(db_path, "0001")  # a database an older release left
    old = one_line_error(cli(db_config, "orgs", "create", "other"))
    assert old == (
        f"ezat-compat: the database's schema (revision 0001) is older than this release's ({HEAD}): "
        "run `ezat-compat db upgrade`"
    )
    assert cli(db_config, "db", "current").stdout.strip() == "0001"
    _stamp(db_path, HEAD)

    _stamp(db_path, "9999")  # a database a newer release migrated
    for command in (("keys", "list"), ("usage",), ("db", "upgrade"), ("db", "check")):
        newer = one_line_error(cli(db_config, *command))
        assert f"schema (revision 9999) is newer than this release of ezat-compat knows (newest: {HEAD})" in newer
    started = _start(_serve_argv(db_config, f"127.0.0.1:{free_port()}"), db_config)
    assert "is newer than this release" in one_line_error(started)


def test_an_older_schema_is_upgraded_in_place(db_config: Path) -> None:
    from alembic import command

    from ezat_compat.store.db import alembic_config, locked_connection, make_engine

    engine = make_engine(f"sqlite:///{db_config.parent / 'ezat.db'}")
    with locked_connection(engine) as conn:
        command.upgrade(alembic_config(conn), "0001")
    engine.dispose()
    assert cli(db_config, "db", "current").stdout.strip() == "0001"
    done = cli(db_config, "db", "upgrade")
    assert done.stdout.strip() == f"upgraded the database from revision 0001 to {HEAD}"
    with sqlite3.connect(db_config.parent / "ezat.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"orgs", "api_keys", "ledger", "reservations", "thinking_stash", "alembic_version"} <= tables


def test_upgrade_sql_for_dbas(db_config: Path) -> None:
    pg = "postgresql+psycopg://dba@127.0.0.1:1/prod"  # offline: nothing is connected
    full = cli(db_config, "db", "upgrade", "--sql", env={"EZAT_DATABASE_URL": pg})
    assert full.returncode == 0, full.stderr
    assert "CREATE TABLE orgs" in full.stdout and "CREATE TABLE thinking_stash" in full.stdout
    assert "INSERT INTO alembic_version (version_num) VALUES ('0001')" in full.stdout
    assert full.stdout.strip().endswith("COMMIT;")
    step = cli(db_config, "db", "upgrade", "--sql", "--from", "0001", env={"EZAT_DATABASE_URL": pg})
    assert "CREATE TABLE thinking_stash" in step.stdout and "CREATE TABLE orgs" not in step.stdout
    assert "UPDATE alembic_version SET version_num='0002' WHERE alembic_version.version_num = '0001'" in step.stdout
    assert "not a revision" in one_line_error(cli(db_config, "db", "upgrade", "--sql", "--from", "77"))
    assert not (db_config.parent / "ezat.db").exists()  # --sql touched no database


def test_upgrade_sql_without_from_says_what_it_prints_for_the_database_it_is_for(db_config: Path) -> None:
    fresh = cli(db_config, "db", "upgrade", "--sql")
    assert fresh.returncode == 0, fresh.stderr
    assert "does not exist yet: the SQL below creates the schema" in fresh.stderr
    assert "CREATE TABLE orgs" in fresh.stdout
    assert not (db_config.parent / "ezat.db").exists()  # it read nothing into being
    from alembic import command

    from ezat_compat.store.db import alembic_config, locked_connection, make_engine

    engine = make_engine(f"sqlite:///{db_config.parent / 'ezat.db'}")
    with locked_connection(engine) as conn:
        command.upgrade(alembic_config(conn), "0001")
    engine.dispose()
    older = cli(db_config, "db", "upgrade", "--sql")
    assert older.returncode == 0, older.stderr
    assert f"the database is at revision 0001: the SQL below upgrades it from 0001 to {HEAD}" in older.stderr
    assert "CREATE TABLE orgs" not in older.stdout  # a script that applies to this database
    assert "WHERE alembic_version.version_num = '0001'" in older.stdout
    assert cli(db_config, "db", "upgrade").returncode == 0
    current = cli(db_config, "db", "upgrade", "--sql")
    assert f"at revision {HEAD}, this release's newest: there is nothing to apply" in current.stderr
    assert "CREATE TABLE" not in current.stdout and "UPDATE alembic_version" not in current.stdout


def test_the_alembic_command_uses_the_gateways_database(db_config: Path) -> None:
    alembic = [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini")]
    env = {**os.environ, "EZAT_CONFIG": str(db_config)}
    env.pop("EZAT_DATABASE_URL", None)
    up = subprocess.run([*alembic, "upgrade", "head"], capture_output=True, text=True, timeout=60, env=env)
    assert up.returncode == 0, up.stderr
    current = subprocess.run([*alembic, "current"], capture_output=True, text=True, timeout=60, env=env)
    assert current.stdout.strip() == f"{HEAD} (head)"
    assert cli(db_config, "db", "check").returncode == 0


def test_the_alembic_command_finds_a_relative_database_where_the_gateway_does(db_config: Path, tmp_path: Path) -> None:
    """A relative SQLite ``EZAT_DATABASE_URL`` is the data folder's file (the config's folder
    here), for the ``alembic`` command as for the gateway and the admin commands, wherever it runs."""
    alembic = [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini")]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "EZAT_CONFIG": str(db_config), "EZAT_DATABASE_URL": "sqlite:///relative.db"}
    up = subprocess.run(
        [*alembic, "upgrade", "head"], capture_output=True, text=True, timeout=60, env=env, cwd=elsewhere
    )
    assert up.returncode == 0, up.stderr
    assert (db_config.parent / "relative.db").exists() and not (elsewhere / "relative.db").exists()
    assert cli(db_config, "db", "check", env={"EZAT_DATABASE_URL": "sqlite:///relative.db"}).returncode == 0


WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("PRAGMA wal_autocheckpoint=0")  # every committed row stays in the WAL
conn.execute("CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("INSERT INTO probe (payload) VALUES (?)", [("x" * 200,)] * 20)
    conn.execute("COMMIT")
"""


def test_backup_of_a_live_sqlite_database_has_every_committed_row(db_config: Path, tmp_path: Path) -> None:
    db_path = db_config.parent / "ezat.db"
    assert cli(db_config, "db", "upgrade").returncode == 0
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db_path), "20"])
    try:

        def committed() -> int:
            with sqlite3.connect(db_path, timeout=10) as conn:
                try:
                    return int(conn.execute("SELECT count(*) FROM probe").fetchone()[0])
                except sqlite3.OperationalError:
                    return 0

        wait_for(lambda: committed() > 2000, 30, "rows from the writer")
        plain = tmp_path / "plain-copy.db"
        shutil.copyfile(db_path, plain)  # what a plain cp takes: the main file, not the WAL
        before = committed()
        done = cli(db_config, "db", "backup", str(tmp_path / "backup.db"))
        assert done.returncode == 0, done.stderr
        assert writer.poll() is None  # the writes were in flight throughout
    finally:
        writer.kill()
        writer.wait()
    assert stat.S_IMODE(os.stat(tmp_path / "backup.db").st_mode) == 0o600  # key hashes and balances
    with sqlite3.connect(tmp_path / "backup.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        count, top = conn.execute("SELECT count(*), max(id) FROM probe").fetchone()
        assert count >= before and count == top and count % 20 == 0  # whole transactions, no gaps
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == HEAD
    with sqlite3.connect(plain) as conn:
        try:
            plain_count = conn.execute("SELECT count(*) FROM probe").fetchone()[0]
        except sqlite3.OperationalError:
            plain_count = 0
    assert plain_count < before  # why a backup command is needed at all
    assert "already exists" in one_line_error(cli(db_config, "db", "backup", str(tmp_path / "backup.db")))
    pg = one_line_error(cli(db_config, "db", "backup", "x.db", env={"EZAT_DATABASE_URL": "postgresql+psycopg://u@h/d"}))
    assert "pg_dump" in pg


# ---------------------------------------------------------------- the demo


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_demo_stops_what_it_started(tmp_path: Path, stop: signal.Signals) -> None:
    port, sim_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "EZAT_CONFIG", "EZAT_DATABASE_URL")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ezat_compat.cli",
            "demo",
            "--bind",
            f"127.0.0.1:{port}",
            "--sim-bind",
            f"127.0.0.1:{sim_port}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # its own session: SIGINT reaches the demo alone, as a terminal's Ctrl-C would not (which
        # signals every process of the group); the demo must stop its children by itself
        start_new_session=True,
    )
    try:
        wait_for(lambda: healthy(f"http://127.0.0.1:{port}") or demo.poll() is not None, 90, "the demo")
        assert demo.poll() is None
        assert requests.get(f"http://127.0.0.1:{sim_port}/healthz", timeout=5).status_code == 200
        started = children(demo.pid)
        assert len(started) == 2  # the simulator and the gunicorn master
        workers = [w for pid in started for w in children(pid)]
        assert workers
        demo.send_signal(stop)
        assert demo.wait(timeout=40) == 0
        wait_for(lambda: not any(alive(p) for p in started + workers), 20, "the demo's processes to exit")
        assert not healthy(f"http://127.0.0.1:{port}")
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def test_demo_refuses_a_sim_bind_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ezat_compat.cli",
                "demo",
                "--bind",
                f"127.0.0.1:{free_port()}",
                "--sim-bind",
                f"127.0.0.1:{taken}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert one_line_error(done) == (
        f"ezat-compat: 127.0.0.1:{taken} is already in use; pass --sim-bind 127.0.0.1:PORT with a free port"
    )


# ---------------------------------------------------------------- systemd


UNIT = REPO / "deploy" / "ezat-compat.service"


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if IN_CI:
            pytest.fail("systemd-analyze is missing, and CI=true requires it (.ci/run installs systemd)")
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    text = UNIT.read_text()
    for directive in (
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "KillMode=mixed",
        "User=ezat",
        "StateDirectory=ezat-compat",
        "Environment=EZAT_DATA_DIR=/var/lib/ezat-compat",  # /etc/ezat is read-only (ProtectSystem=strict)
        "LogsDirectory=ezat",  # /var/log too: [server] access_log/error_log files go to /var/log/ezat
        "UMask=0077",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
    ):
        assert f"\n{directive}\n" in text, directive
    rotated = (REPO / "deploy" / "logrotate.conf").read_text()
    assert "/var/log/ezat/" in rotated  # the folder the unit makes is the one logrotate rotates
    stop_s = int(text.split("\nTimeoutStopSec=", 1)[1].split()[0])
    from ezat_compat.domain import GatewaySettings, ServerSettings

    assert stop_s > ServerSettings().graceful_timeout_s and stop_s > GatewaySettings().upstream_timeout_s
    # verify checks that the commands exist: point them at this checkout's ezat-compat
    script = Path(sys.executable).with_name("ezat-compat")
    assert script.exists()
    unit = tmp_path / "ezat-compat.service"
    unit.write_text(text.replace("/opt/ezat-compat/bin/ezat-compat", str(script)))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ezat-compat.service" not in done.stderr, done.stderr
