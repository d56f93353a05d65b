"""CPU time of the billing hot path: ``Ledger.reserve`` + ``Ledger.settle_durably`` on a SQLite file.

    python bench/reserve_settle.py [--iterations N] [--rounds R] [--revisions 0004,head]

For each schema revision named (``head`` is this release's newest), a fresh SQLite file in a
temporary folder is migrated to it, one org and key are created, and then N requests are
reserved and settled one after the other on one thread, as a worker does. The figure is
``time.process_time`` (user + system CPU of the process) per reserve + settle pair; the
revisions are measured in turn, R rounds, and the best round of each is printed with the
median (a busy machine only ever adds time), and the pages one reserve's and one settle's
commit append to the WAL.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from alembic import command

from ezat_compat.domain import Usage
from ezat_compat.store.accounts import Accounts
from ezat_compat.store.db import alembic_config, locked_connection, make_engine
from ezat_compat.store.hotpath import make_hot_path
from ezat_compat.store.journal import Journal
from ezat_compat.store.ledger import Ledger, LedgerEntry


def wal_frames(path: Path) -> int:
    """Frames (pages) in the WAL of the SQLite database at ``path``."""
    wal = path.with_name(path.name + "-wal")
    size = wal.stat().st_size if wal.exists() else 0
    with sqlite3.connect(path) as conn:
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return max(0, size - 32) // (page_size + 24)


def measure(folder: Path, revision: str, iterations: int) -> tuple[float, int, int]:
    """Microseconds of CPU per reserve + settle pair on a new database at ``revision``, then the
    WAL pages one reserve and one settle commit."""
    path = folder / f"bench-{uuid.uuid4().hex[:8]}.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    hot = make_hot_path(engine)
    try:
        with locked_connection(engine) as conn:
            command.upgrade(alembic_config(conn), revision)
        accounts = Accounts(engine, hot)
        accounts.create_org("bench", 10**15)
        now = datetime.now(UTC)
        _, secret = accounts.create_key("bench", now=now)
        ctx = accounts.authenticate(secret, now)
        books = Ledger(engine, hot, journal=Journal(folder / f"journal-{uuid.uuid4().hex[:8]}"))
        entry = LedgerEntry(
            created_at=now,
            org_id=ctx.org_id,
            key_id=ctx.key_id,
            endpoint="chat.completions",
            model="claude-sonnet-5-5",
            canonical_model="anthropic/claude-sonnet-5-5",
            deployment="primary",
            usage=Usage(input_tokens=10, output_tokens=5),
            cost_micros=7,
            status=200,
            estimated=False,
        )
        ids = [f"req_{uuid.uuid4().hex}" for _ in range(iterations + 200)]
        for request_id in ids[:200]:  # warm up: statement cache, page cache, WAL
            books.reserve(ctx, request_id, 1000, endpoint="chat.completions", model="claude-sonnet-5-5")
            books.settle_durably(request_id, entry)
        start = time.process_time()
        for request_id in ids[200:]:
            books.reserve(ctx, request_id, 1000, endpoint="chat.completions", model="claude-sonnet-5-5")
            if not books.settle_durably(request_id, entry):
                raise RuntimeError("a settlement went to the journal: the database failed")
        cpu_us = (time.process_time() - start) / iterations * 1e6
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        books.reserve(ctx, "req_wal", 1000, endpoint="chat.completions", model="claude-sonnet-5-5")
        reserve_frames = wal_frames(path)
        books.settle_durably("req_wal", entry)
        return cpu_us, reserve_frames, wal_frames(path) - reserve_frames
    finally:
        hot.close()
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--revisions", default="0004,head")
    args = parser.parse_args(argv)
    revisions = [r.strip() for r in args.revisions.split(",") if r.strip()]
    figures: dict[str, list[float]] = {r: [] for r in revisions}
    frames: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="ezat-bench-") as tmp:
        for _ in range(args.rounds):
            for revision in revisions:
                cpu_us, *pages = measure(Path(tmp), revision, args.iterations)
                figures[revision].append(cpu_us)
                frames[revision] = (pages[0], pages[1])
    print(f"reserve + settle_durably, CPU per pair ({args.iterations} pairs x {args.rounds} rounds, SQLite file)")
    for revision, values in figures.items():
        reserve_pages, settle_pages = frames[revision]
        print(
            f"  {revision:>6}: best {min(values):7.1f} us   median {statistics.median(values):7.1f} us   "
            f"WAL pages per commit: reserve {reserve_pages}, settle {settle_pages}"
        )
    if len(revisions) == 2:
        a, b = (min(figures[r]) for r in revisions)
        print(f"  {revisions[1]} vs {revisions[0]}: {100 * (b - a) / a:+.1f} % (best rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
