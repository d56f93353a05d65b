"""Data files are private: the database, its WAL/SHM, the limit counters, the journal's
helper and ``db backup``'s copy are created 0600 in folders made 0700, whatever the umask;
never in a shared /tmp."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ezat_compat.app import data_folder, embedded_limits_path
from ezat_compat.config import parse_config
from ezat_compat.datafiles import open_private, private_dir, private_file
from ezat_compat.limits import RateLimits
from ezat_compat.sealing import KEY_FILE, load_sealer
from ezat_compat.store.accounts import AuthContext
from ezat_compat.store.db import SchemaError, backup_sqlite, make_engine
from ezat_compat.store.journal import Journal
from ezat_compat.store.ledger import JOURNAL_DIR_ENV, default_journal_dir, legacy_journal_dirs

MODEL = {
    "id": "m",
    "aliases": [],
    "price": {"input": 1, "output": 1},
    "deployments": [{"name": "d", "base_url": "http://127.0.0.1:1", "upstream_model": "m"}],
}


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """A permissive umask, as many hosts have: the modes must not depend on it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_sqlite_database_and_its_wal_and_shm_are_0600(tmp_path: Path) -> None:
    db = tmp_path / "data" / "ezat.db"
    db.parent.mkdir()  # the operator's folder: a missing one is refused at start, never created
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
        with engine.connect() as conn:  # a reader keeps the WAL and SHM in place
            assert conn.execute(text("SELECT x FROM t")).scalar() == 1
            files = {p.name: mode(p) for p in db.parent.iterdir()}
    finally:
        engine.dispose()
    assert files == {"ezat.db": 0o600, "ezat.db-wal": 0o600, "ezat.db-shm": 0o600}, files


def test_an_existing_world_readable_database_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    db.write_bytes(b"")
    os.chmod(db, 0o644)
    Path(f"{db}-wal").write_bytes(b"")
    os.chmod(f"{db}-wal", 0o644)
    make_engine(f"sqlite:///{db}").dispose()
    assert (mode(db), mode(f"{db}-wal")) == (0o600, 0o600)


def test_limit_counters_and_their_wal_are_0600(tmp_path: Path) -> None:
    path = tmp_path / "counters" / "limits.db"
    limits = RateLimits(None, str(path))
    ctx = AuthContext(
        key_id=1,
        key_public_id="key_1",
        org_id=1,
        org_name="acme",
        model_patterns=(),
        spend_limit_micros=None,
        rpm=5,
        tpm=100,
    )
    try:
        limits.admit(ctx, 10)
        files = {p.name: mode(p) for p in path.parent.iterdir()}
    finally:
        limits.close()
    assert files["limits.db"] == 0o600 and files["limits.db-wal"] == 0o600 and files["limits.db-shm"] == 0o600, files
    assert mode(path.parent) == 0o700


def test_open_private_creates_0600_files_in_0700_folders(tmp_path: Path) -> None:
    journal = tmp_path / "a" / "b" / "journal.log"
    fd = open_private(journal)
    try:
        os.write(fd, b"x\n")
    finally:
        os.close(fd)
    assert (mode(journal), mode(journal.parent), mode(journal.parent.parent)) == (0o600, 0o700, 0o700)
    assert private_file(journal).read_bytes() == b"x\n"  # an existing file is kept
    assert private_dir(tmp_path) == tmp_path and mode(tmp_path) == stat.S_IMODE(os.stat(tmp_path).st_mode)


@pytest.mark.parametrize(
    ("data_dir", "expected"),
    [
        pytest.param("", "{root}", id="default-next-to-the-config"),
        pytest.param("var", "{root}/var", id="relative-to-the-config"),
        pytest.param("/srv/ezat", "/srv/ezat", id="absolute"),
    ],
)
def test_data_folder_and_the_counters_of_a_server_database(tmp_path: Path, data_dir: str, expected: str) -> None:
    config = parse_config(
        {"gateway": {"data_dir": data_dir}, "models": [MODEL]}, path=str(tmp_path / "ezat.toml"), environ={}
    )
    folder = data_folder(config)
    assert folder == expected.format(root=tmp_path)
    counters = embedded_limits_path("postgresql+psycopg://u@127.0.0.1/db", folder)
    assert os.path.dirname(counters) == folder
    assert not counters.startswith(tempfile.gettempdir() + os.sep + "ezat-limits-")
    # A SQLite database's counters are in the data folder too, wherever the database is.
    sqlite_counters = embedded_limits_path(f"sqlite:////var/db/{tmp_path.name}/x.db", folder)
    assert os.path.dirname(sqlite_counters) == folder


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_a_backup_is_0600_from_its_first_byte(tmp_path: Path, umask: int) -> None:
    db = tmp_path / "ezat.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (7)"))
    finally:
        engine.dispose()
    os.umask(umask)
    target = tmp_path / "backups" / "ezat-copy.db"
    target.parent.mkdir()
    seen: list[int] = []
    real_connect = sqlite3.connect

    def connect_and_look(path: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        if Path(path).name.endswith(".partial"):
            seen.append(mode(path))  # the copy's file, as SQLite is handed it
        return real_connect(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite3, "connect", connect_and_look)
        size = backup_sqlite(f"sqlite:///{db}", target)
    assert seen == [0o600]
    assert mode(target) == 0o600 and size == target.stat().st_size
    assert sorted(p.name for p in target.parent.iterdir()) == ["ezat-copy.db"]
    with sqlite3.connect(target) as conn:
        assert conn.execute("SELECT x FROM t").fetchone() == (7,)


@pytest.mark.parametrize("leftover", ["file", "symlink"], ids=["stale-partial", "symlink-partial"])
def test_a_backup_never_reuses_or_follows_a_leftover_partial(tmp_path: Path, leftover: str) -> None:
    db = tmp_path / "ezat.db"
    make_engine(f"sqlite:///{db}").dispose()
    target = tmp_path / "copy.db"
    partial = tmp_path / "copy.db.partial"
    elsewhere = tmp_path / "elsewhere"
    if leftover == "file":
        partial.write_bytes(b"")
    else:
        partial.symlink_to(elsewhere)
    with pytest.raises(SchemaError, match=r"copy\.db\.partial exists .*remove it"):
        backup_sqlite(f"sqlite:///{db}", target)
    assert not target.exists() and not elsewhere.exists()


CLOSE_LAST = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("SELECT count(*) FROM t").fetchone()
conn.close()  # SQLite checkpoints and deletes the WAL here when it finds no other user
"""


def test_private_file_on_a_database_in_use_keeps_the_process_locks(tmp_path: Path) -> None:
    """POSIX locks are the process's: a descriptor of the file opened and closed beside a live
    SQLite connection drops its locks, and another process's SQLite then deletes the WAL the
    connection still writes into. ``private_file`` of an existing database never opens it."""
    db = tmp_path / "ezat.db"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x INTEGER)")
        conn.execute("INSERT INTO t VALUES (1)")
        private_file(db)  # what a second engine on the file does before it connects
        subprocess.run([sys.executable, "-c", CLOSE_LAST, str(db)], check=True, timeout=30)
        assert Path(f"{db}-wal").exists(), "the WAL was removed from under a live connection"
        conn.execute("INSERT INTO t VALUES (2)")
    finally:
        conn.close()
    check = sqlite3.connect(db)
    try:
        assert check.execute("SELECT count(*) FROM t").fetchone() == (2,)
    finally:
        check.close()
    assert mode(db) == 0o600


@pytest.mark.parametrize(
    "database_url",
    [
        pytest.param("postgresql+psycopg://u@127.0.0.1/db", id="postgresql"),
        pytest.param("sqlite:////var/lib/elsewhere/ezat.db", id="sqlite-elsewhere"),
    ],
)
def test_the_journal_the_counters_and_the_sealing_key_live_in_the_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    monkeypatch.delenv(JOURNAL_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # never the working directory
    config = parse_config(
        {"gateway": {"data_dir": "data/ezat", "database_url": database_url}, "models": [MODEL]},
        path=str(tmp_path / "etc" / "ezat.toml"),
        environ={},
    )
    folder = Path(data_folder(config))
    assert folder == tmp_path / "etc" / "data" / "ezat"
    journal = Journal(default_journal_dir(database_url, folder))
    assert journal.folder.parent == folder
    journal.append({"request_id": "r1"})
    (written,) = journal.files()
    load_sealer(folder, {})
    key = folder / KEY_FILE
    assert Path(embedded_limits_path(database_url, str(folder))).parent == folder
    assert (mode(written), mode(written.parent), mode(key)) == (0o600, 0o700, 0o600)
    assert (mode(folder), mode(folder.parent)) == (0o700, 0o700)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["etc"]  # nothing in the working directory


def test_ezat_journal_dir_still_moves_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOURNAL_DIR_ENV, str(tmp_path / "elsewhere"))
    assert default_journal_dir("postgresql+psycopg://u@h/db", tmp_path / "data") == tmp_path / "elsewhere"


def test_a_journal_left_where_an_earlier_release_kept_it_is_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = "postgresql+psycopg://u@127.0.0.1/db"
    (legacy,) = [p for p in legacy_journal_dirs(url) if p.parent == tmp_path]
    Journal(legacy).append({"request_id": "old"})
    journal = Journal(tmp_path / "data" / "usage-journal")
    assert journal.adopt(legacy) == 1 and not Journal(legacy).files()
    (adopted,) = journal.files()
    assert adopted.name.startswith("orphan~") and b'"old"' in adopted.read_bytes()


def test_serve_makes_a_missing_data_folder_0700(tmp_path: Path) -> None:
    """``check-config`` passes a data_dir that doesn't exist yet (judged by the nearest folder
    that does); the start makes it, with a SQLite database inside it, rather than failing."""
    from ezat_compat.server.serving import prepare_database

    database = tmp_path / "data" / "sub" / "ezat.db"
    config = parse_config(
        {"gateway": {"data_dir": "data/sub", "database_url": f"sqlite:///{database}"}, "models": [MODEL]},
        path=str(tmp_path / "ezat.toml"),
        environ={},
    )
    prepare_database(config)
    for folder in (tmp_path / "data", tmp_path / "data" / "sub"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
