"""Data files are private: the database, its WAL/SHM, the limit counters and the journal's
helper are created 0600 in folders made 0700, whatever the umask; never in a shared /tmp."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from ezat_compat.app import data_folder, embedded_limits_path
from ezat_compat.config import parse_config
from ezat_compat.datafiles import open_private, private_dir, private_file
from ezat_compat.limits import RateLimits
from ezat_compat.store.accounts import AuthContext
from ezat_compat.store.db import make_engine

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
