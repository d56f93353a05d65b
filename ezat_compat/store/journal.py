"""The usage journal: settlements the database couldn't take, kept on local disk until it can.

Chat Completions reference, "Streaming" (usage is recorded before ``data: [DONE]``). When a
settlement fails on the database, ``Journal.append`` writes its ledger row as one JSON line to
this process's file and fsyncs it before returning, so the stream's ``[DONE]`` follows a
durable record. ``Journal.replay`` later applies every row through ``Ledger``'s settle, whose
ledger row is unique per ``request_id``: a row applied twice changes nothing, so a replay that
is cut short and run again applies each settlement exactly once. A reserve that failed with the
database gone journals a row marked ``if_held`` (``Ledger``): it settles its request, as a
failure at no cost, only if a reservation was taken.

Files live in one folder (0700), each file 0600, named ``<owner tag>~<suffix>.jsonl``
(``store/workers.py`` tags). A process appends only to its own ``<tag>~live.jsonl``. A replay
first *claims* a file by renaming it to ``<its own tag>~<random>.jsonl`` (a rename is atomic,
so two replayers never hold the same file), and only files whose owner is this process, dead
or ``orphan``; when the database fails again mid-file, the file is renamed ``orphan~…`` for
the next replay. A row the database refuses for a reason of its own (``RejectedRowError``: not
an outage) is set aside in ``rejected~<tag>.rejected`` and logged, so it never holds back the
rows after it nor keeps the journal pending. ``encode_row``, ``decode_rows`` and ``file_owner``
are the pure parts.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ezat_compat.datafiles import private_dir
from ezat_compat.store.workers import is_dead, parse_tag, worker_tag

log = logging.getLogger("ezat_compat")

SUFFIX = ".jsonl"
ORPHAN = "orphan"
LIVE = "live"
REJECTED = "rejected"
REJECTED_SUFFIX = ".rejected"
VERSION = 1
REPLAY_MAX_ROWS = 5_000  # rows applied per replay call (the rest wait for the next one)


def encode_row(row: Mapping[str, Any]) -> bytes:
    """One settlement as one line: ``{"v": 1, "row": {...}}`` and a newline (ASCII-only JSON)."""
    return json.dumps({"v": VERSION, "row": dict(row)}, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def decode_rows(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The rows of a journal file and how many lines were unreadable (a line torn by a crash
    mid-write has no newline or no valid JSON: it was never acknowledged, so it is skipped)."""
    rows: list[dict[str, Any]] = []
    bad = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        row = record.get("row") if isinstance(record, dict) and record.get("v") == VERSION else None
        if isinstance(row, dict) and isinstance(row.get("request_id"), str):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def file_owner(name: str) -> str | None:
    """The owner part of a journal file's name (a tag or ``orphan``), None for other files."""
    if not name.endswith(SUFFIX) or "~" not in name:
        return None
    return name[: -len(SUFFIX)].split("~", 1)[0] or None


class RejectedRowError(Exception):
    """Raised by a replay's ``apply`` when the database refuses a row for a reason of its own
    (not an outage): the row is set aside, the replay goes on."""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    applied: int = 0  # rows that settled now
    duplicates: int = 0  # rows already in the ledger (applied before)
    failed: bool = False  # the database failed mid-replay: the rest waits for the next one
    pending_files: int = 0  # files left claimable-or-not after this replay
    rejected: int = 0  # rows set aside (``RejectedRowError``)


def _private_dir(folder: Path) -> None:
    private_dir(folder)  # missing parents 0700 too
    os.chmod(folder, 0o700)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """The journal folder of one process (a forked child takes its own tag on first use)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._replaying = False

    @property
    def tag(self) -> str:
        return worker_tag()

    def append(self, row: Mapping[str, Any]) -> None:
        """Write ``row`` (a ledger row: ``LEDGER_COLUMNS``) durably: appended, fsynced, and the
        folder fsynced when the file is new. Raises ``OSError`` when the disk refuses."""
        line = encode_row(row)
        with self._lock:
            _private_dir(self.folder)
            path = self.folder / f"{self.tag}~{LIVE}{SUFFIX}"
            new = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                _fsync_dir(self.folder)

    def files(self) -> list[Path]:
        """The journal files in the folder now (any owner)."""
        try:
            return sorted(p for p in self.folder.iterdir() if file_owner(p.name) is not None)
        except FileNotFoundError:
            return []

    def adopt(self, folder: str | os.PathLike[str]) -> int:
        """Move the journal files waiting in ``folder`` (where an earlier release kept them)
        into this journal as ``orphan`` files, for the next replay; returns how many."""
        source = Journal(folder)
        if source.folder.resolve() == self.folder.resolve():
            return 0
        moved = 0
        for path in source.files():
            with self._lock:
                _private_dir(self.folder)
                target = self.folder / f"{ORPHAN}~{secrets.token_hex(8)}{SUFFIX}"
                try:
                    os.rename(path, target)
                except FileNotFoundError:
                    continue  # another process took it
                except OSError:  # another file system: copied durably, then removed
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    try:
                        os.write(fd, path.read_bytes())
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    path.unlink()
                _fsync_dir(self.folder)
            moved += 1
        if moved:
            log.warning("usage journal: %d file(s) moved from %s to %s", moved, source.folder, self.folder)
        return moved

    def claimable(self) -> bool:
        """Whether a file this process may replay waits (a listing of the folder: no database)."""
        return any(self._claimable(owner) for p in self.files() if (owner := file_owner(p.name)) is not None)

    def _set_aside(self, row: Mapping[str, Any], exc: BaseException) -> None:
        path = self.folder / f"{REJECTED}~{self.tag}{REJECTED_SUFFIX}"
        with self._lock:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, encode_row(row))
                os.fsync(fd)
            finally:
                os.close(fd)
        log.error(
            "usage journal: the database refused the settlement of request %s (%s); set aside in %s",
            row.get("request_id"),
            exc,
            path,
        )

    def _claimable(self, owner: str) -> bool:
        if owner in (ORPHAN, self.tag):
            return True
        tag = parse_tag(owner)
        return tag is not None and is_dead(tag)

    def _claim(self, path: Path) -> Path | None:
        target = self.folder / f"{self.tag}~{secrets.token_hex(8)}{SUFFIX}"
        with self._lock:
            try:
                os.rename(path, target)
            except FileNotFoundError:
                return None  # another replayer took it
        return target

    def replay(self, apply: Callable[[Mapping[str, Any]], bool], max_rows: int = REPLAY_MAX_ROWS) -> ReplayReport:
        """Apply the rows of every claimable file with ``apply`` (settle: True when it settled
        now, False when the row was there already); a file is deleted once all its rows are in.
        An exception from ``apply`` (the database is down) stops the replay: the file goes back
        as ``orphan``. At most one replay runs per process at a time (another call returns at once)."""
        with self._lock:
            if self._replaying:
                return ReplayReport(pending_files=len(self.files()))
            self._replaying = True
        applied = duplicates = rejected = 0
        failed = False
        try:
            for path in self.files():
                if applied + duplicates >= max_rows:
                    break
                owner = file_owner(path.name)
                if owner is None or not self._claimable(owner):
                    continue
                claimed = self._claim(path)
                if claimed is None:
                    continue
                rows, bad = decode_rows(claimed.read_bytes())
                if bad:
                    log.warning("usage journal %s: %d unreadable line(s) skipped", claimed.name, bad)
                try:
                    for row in rows:
                        try:
                            if apply(row):
                                applied += 1
                            else:
                                duplicates += 1
                        except RejectedRowError as exc:
                            rejected += 1
                            self._set_aside(row, exc.__cause__ or exc)
                except Exception as exc:
                    failed = True
                    os.rename(claimed, self.folder / f"{ORPHAN}~{secrets.token_hex(8)}{SUFFIX}")
                    log.warning("usage journal replay stopped (%s); it resumes when the database answers", exc)
                    break
                claimed.unlink()
            if applied:
                log.warning("usage journal: %d settlement(s) recorded in the database now", applied)
        finally:
            with self._lock:
                self._replaying = False
        return ReplayReport(applied, duplicates, failed, len(self.files()), rejected)
