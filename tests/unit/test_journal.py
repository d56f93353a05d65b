"""The usage journal's pure parts and its files (store/journal.py, store/workers.py)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ezat_compat.store.journal import Journal, decode_rows, encode_row, file_owner
from ezat_compat.store.workers import Tag, current_tag, is_dead, parse_tag, sanitise_host, start_ticks, tag_prefix

ROW = {"request_id": "r1", "cost_micros": 12, "status": 200, "model": "m\u00e9"}


def test_a_row_round_trips_as_one_line() -> None:
    line = encode_row(ROW)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_rows(line) == ([ROW], 0)


@pytest.mark.parametrize(
    ("data", "rows", "bad"),
    [
        (b"", 0, 0),
        (encode_row(ROW) + encode_row({**ROW, "request_id": "r2"}), 2, 0),
        (encode_row(ROW) + b'{"v":1,"row":{"request_id"', 1, 1),  # torn by a crash mid-write
        (b'{"v":2,"row":{"request_id":"x"}}\n', 0, 1),  # unknown version
        (b'{"v":1,"row":{"cost_micros":1}}\n', 0, 1),  # no request id
        (b"\n\n" + encode_row(ROW), 1, 0),
    ],
)
def test_decode_rows_skips_what_is_unreadable(data: bytes, rows: int, bad: int) -> None:
    decoded, unreadable = decode_rows(data)
    assert (len(decoded), unreadable) == (rows, bad)


@pytest.mark.parametrize(
    ("name", "owner"),
    [
        ("h:b:1:2:3~live.jsonl", "h:b:1:2:3"),
        ("orphan~ab12.jsonl", "orphan"),
        ("h:b:1:2:3.jsonl", None),
        ("notes.txt", None),
        ("~x.jsonl", None),
    ],
)
def test_file_owner(name: str, owner: str | None) -> None:
    assert file_owner(name) == owner


@pytest.mark.parametrize(
    ("text", "tag"),
    [
        ("host:boot:10:20:30", Tag("host", "boot", 10, 20, 30)),
        ("host:boot:10:20", None),
        ("host:boot:x:20:30", None),
        (":boot:1:2:3", None),
    ],
)
def test_parse_tag(text: str, tag: Tag | None) -> None:
    assert parse_tag(text) == tag
    if tag is not None:
        assert str(tag) == text


def test_tags_and_prefixes() -> None:
    assert sanitise_host("a.b:c/d~e") == "a.b-c-d-e"
    assert tag_prefix("h", "b", 7) == "h:b:7:" and tag_prefix("h", "b", 7, 9) == "h:b:7:9:"
    me = current_tag()
    assert me.pid == os.getpid() and not is_dead(me)
    assert is_dead(Tag(me.host, me.boot, me.parent, me.pid, me.start + 1))  # a pid reused later
    assert is_dead(Tag(me.host, "an-earlier-boot", me.parent, me.pid, me.start))
    assert not is_dead(Tag("another-host", me.boot, 1, 1, 1))


def test_append_is_private_and_replay_applies_each_row_once(tmp_path: Path) -> None:
    folder = tmp_path / "journal"
    journal = Journal(folder)
    journal.append(ROW)
    journal.append({**ROW, "request_id": "r2"})
    (file_,) = journal.files()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(file_.stat().st_mode) == 0o600
    ledger: dict[str, Mapping[str, Any]] = {"r2": {}}  # r2 was settled before (a commit whose answer was lost)

    def apply(row: Mapping[str, Any]) -> bool:
        if row["request_id"] in ledger:
            return False
        ledger[row["request_id"]] = row
        return True

    report = journal.replay(apply)
    assert (report.applied, report.duplicates, report.failed, report.pending_files) == (1, 1, False, 0)
    assert journal.files() == [] and journal.replay(apply).applied == 0


def test_a_replay_cut_short_leaves_an_orphan_for_the_next(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    for i in range(3):
        journal.append({**ROW, "request_id": f"r{i}"})
    seen: list[str] = []

    def down_at_second(row: Mapping[str, Any]) -> bool:
        if row["request_id"] == "r1":
            raise ConnectionError("database down")
        seen.append(row["request_id"])
        return True

    report = journal.replay(down_at_second)
    assert report.failed and report.applied == 1
    (orphan,) = journal.files()
    assert file_owner(orphan.name) == "orphan"
    done: set[str] = set(seen)

    def apply(row: Mapping[str, Any]) -> bool:
        if row["request_id"] in done:
            return False
        done.add(row["request_id"])
        return True

    again = journal.replay(apply)
    assert (again.applied, again.duplicates, journal.files()) == (2, 1, [])


def test_files_of_live_other_processes_are_left_alone(tmp_path: Path) -> None:
    me = current_tag()
    dead = Tag(me.host, me.boot, me.parent, os.getppid(), 0)  # the parent's pid, another start: dead
    live_parent = Tag(me.host, me.boot, 0, os.getppid(), start_ticks(os.getppid()) or 0)
    (tmp_path / f"{live_parent}~live.jsonl").write_bytes(encode_row(ROW))
    (tmp_path / f"{dead}~live.jsonl").write_bytes(encode_row({**ROW, "request_id": "dead"}))
    applied: list[str] = []

    def apply(row: Mapping[str, Any]) -> bool:
        applied.append(row["request_id"])
        return True

    Journal(tmp_path).replay(apply)
    assert applied == ["dead"]  # the dead process's file, not the live one's
    assert [file_owner(p.name) for p in Journal(tmp_path).files()] == [str(live_parent)]
