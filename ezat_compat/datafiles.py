"""Private data files: the database, its WAL/SHM, the limit counters and the journal.

Everything the gateway writes to disk holds accounts, usage or keys' counters, so it is
created readable by its owner only: folders 0700, files 0600, with the mode set explicitly
(a umask of 022 would leave them 0644, and SQLite creates ``-wal``/``-shm`` later with the
database file's mode, so the database file must already be 0600 when SQLite first opens it).

- ``private_dir(path)``: create the folder (and missing parents) 0700; a folder that exists
  is left as the operator made it.
- ``private_file(path)``: create the file 0600 if missing, and tighten an existing one (and
  a SQLite database's ``-wal``, ``-shm`` and ``-journal`` beside it) to 0600 — without ever
  opening it (closing a descriptor drops the process's locks on the file).
- ``open_private(path, flags)``: ``os.open`` a file of the data folder, created 0600.
- ``writable_problem(path)``: why the gateway could not write files in the folder (``None``
  when it can), found by writing one: ``check-config`` asks it of every folder the gateway
  writes to.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ezat_compat.domain import Config

DIR_MODE = 0o700
FILE_MODE = 0o600
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_dir(path: str | os.PathLike[str]) -> Path:
    """The folder at ``path``, created 0700 (parents too) when missing."""
    folder = Path(path)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for parent in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            parent.mkdir(mode=DIR_MODE)
            os.chmod(parent, DIR_MODE)  # mkdir's mode passes through the umask
    return folder


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """``os.open(path, flags | O_CREAT)`` with the file 0600 whatever the umask; the caller
    closes the descriptor. The folder is created 0700 when missing."""
    private_dir(Path(path).parent)
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_file(path: str | os.PathLike[str]) -> Path:
    """Create the file at ``path`` 0600 if missing; tighten it (and a SQLite database's side
    files) to 0600 if it exists. Call before SQLite opens a database file.

    An existing file is never opened, only ``chmod``-ed: POSIX locks belong to the process,
    and closing any descriptor of a file drops every lock the process holds on it — a
    serving worker's SQLite locks included, after which another process's SQLite believes
    it is the database's last user and deletes the WAL the worker still writes into."""
    try:
        os.close(open_private(path, os.O_RDONLY | os.O_EXCL))  # nobody can hold locks on a new file
    except FileExistsError:
        os.chmod(path, FILE_MODE)
    for suffix in SQLITE_SIDE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(os.fspath(path) + suffix, FILE_MODE)
    return Path(path)


def data_folder(config: Config) -> str:
    """The data folder: ``[gateway] data_dir``, relative to the config file's folder (default:
    that folder itself). Everything the gateway writes beside its database lives here: the
    usage journal, the embedded rate-limit counters, the sealing key."""
    base = os.path.dirname(os.path.abspath(config.path or "."))
    return os.path.join(base, config.gateway.data_dir) if config.gateway.data_dir else base


def writable_problem(path: str | os.PathLike[str]) -> str | None:
    """Why files can't be made in the folder ``path`` (``"not writable (Read-only file system)"``),
    or ``None`` when they can. A folder that doesn't exist yet is judged by the nearest one that
    does, in which it would be made. Found by making (and removing) a file: permission bits
    don't show a read-only mount (systemd's ``ProtectSystem=strict``) or an ACL."""
    folder = Path(os.path.abspath(path))
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".ezat-write-check-", dir=folder)
    except OSError as exc:
        return f"{folder} is not writable ({exc.strerror})"
    os.close(fd)
    os.unlink(probe)
    return None
