"""Usage is never lost: the database goes away mid-traffic and comes back (issue: database blips).

While the database is unavailable, streams already running still end with ``[DONE]``: their
settlement is written to the usage journal (fsynced, 0600 in a 0700 folder) before the end
bytes, and new requests answer 503 ``overloaded`` with ``retry-after`` in OpenAI's envelope,
529 ``overloaded_error`` in Anthropic's on /v1/messages (never 500). When the database answers
again, the journal is applied exactly once: every admitted request has one ledger row, the
sum of the costs equals the balance decrease, no reservation remains.

PostgreSQL is cut through a loopback TCP proxy (``faults.TcpProxy``); SQLite is made
unavailable by another process holding its write lock past the busy timeout.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, make_url

from tests.integration.conftest import standard_models
from tests.integration.faults import Outcome, TcpProxy, chat, money, pg_schema, pg_url, wait_for
from tests.integration.harness import Gateway, Sim

BALANCE_MICROS = 100_000_000
STREAMS = 6


def _journal_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.jsonl")) if folder.exists() else []


def _messages(url: str, key: str) -> requests.Response:
    return requests.post(
        url + "/v1/messages",
        json={"model": "claude-sonnet-5-5", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        timeout=60,
    )


def _outage(
    sim: Sim,
    root: Path,
    database_url: str,
    gateway_url_for_db: str,
    cut: Callable[[], None],
    restore: Callable[[], None],
    stream_text: str,
) -> None:
    """Streams run, the database is cut, new requests are refused (503/529), the streams end,
    the database returns, the journal is applied: the money invariants hold exactly."""
    journal = root / "journal"
    with ExitStack() as stack:
        gateway = Gateway(
            root=root / "gw",
            models=standard_models(sim.url),
            workers=2,
            gateway_settings={"database_url": gateway_url_for_db, "keepalive_s": 1},
            env={"EZAT_DATABASE_URL": gateway_url_for_db, "EZAT_JOURNAL_DIR": str(journal)},
        )
        stack.callback(gateway.stop)
        gateway.start()
        engine = create_engine(database_url)
        stack.callback(engine.dispose)
        key = gateway.new_key("blip", balance="100")

        streams = [Outcome() for _ in range(STREAMS)]

        def client(i: int) -> None:
            streams[i] = chat(gateway.url, key, f"stream {i} {stream_text}", stream=True, max_tokens=200)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        wait_for(lambda: money(engine, "blip").reservations == STREAMS, timeout_s=30)
        cut()
        refused = chat(gateway.url, key, "refused while the database is down", stream=False)
        native = _messages(gateway.url, key)
        for t in threads:
            t.join(timeout=60)
        journaled = _journal_files(journal)
        modes = [stat.S_IMODE(p.stat().st_mode) for p in journaled]
        folder_mode = stat.S_IMODE(journal.stat().st_mode) if journal.exists() else None
        restore()
        # New traffic after the return: a worker replays the journal within seconds.
        after_ok = [chat(gateway.url, key, f"after {i}", stream=bool(i % 2)) for i in range(4)]

        def settled() -> bool:
            if _journal_files(journal):
                after_ok.append(chat(gateway.url, key, "nudge", stream=False))  # maintain() runs on admission
                return False
            return money(engine, "blip").reservations == 0

        wait_for(settled, timeout_s=40, step_s=1.0)
        after = money(engine, "blip")
        print(
            f"\n[{make_url(database_url).get_backend_name()}] journaled files {len(journaled)}; refused "
            f"{refused.status}/{native.status_code}; ledger rows {after.ledger_rows} "
            f"(statuses {after.statuses}); cost {after.ledger_cost} == balance decrease "
            f"{BALANCE_MICROS - after.balance}; reservations {after.reservations}"
        )

    assert all(s.status == 200 and s.done for s in streams), [(s.status, s.error) for s in streams]
    assert journaled, "the streams' settlements went to the journal while the database was down"
    assert modes and all(m == 0o600 for m in modes) and folder_mode == 0o700
    assert refused.status == 503, refused.body
    assert b'"code":"overloaded"' in refused.body.replace(b" ", b"")
    assert native.status_code == 529 and native.json()["error"]["type"] == "overloaded_error"
    assert int(native.headers["retry-after"]) > 0
    assert all(o.status == 200 for o in after_ok)
    admitted = [s.request_id for s in streams] + [o.request_id for o in after_ok]
    assert sorted(after.ledger_ids) == sorted(admitted)  # exactly one row each; the refused have none
    assert after.statuses == {200: len(admitted)}
    assert BALANCE_MICROS - after.balance == after.ledger_cost > 0
    assert after.reservations == 0 and after.reserved == 0 and after.key_reserved == 0


@pytest.mark.postgres
def test_postgresql_cut_mid_traffic_loses_no_usage(sim: Sim, postgres_url: str, tmp_path: Path) -> None:
    pg = make_url(postgres_url)
    proxy = TcpProxy((pg.host or "127.0.0.1", pg.port or 5432))
    with pg_schema(postgres_url) as schema:
        try:
            _outage(
                sim,
                tmp_path,
                pg_url(postgres_url, schema),
                pg_url(postgres_url, schema, port=proxy.port),
                proxy.cut,
                proxy.restore,
                "[[sim:words=30,token_delay_ms=150]]",  # ~4.5 s: the cut comes mid-stream
            )
        finally:
            proxy.cut()


LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@pytest.fixture
def sqlite_locker() -> Iterator[Callable[[str], tuple[Callable[[], None], Callable[[], None]]]]:
    procs: list[subprocess.Popen[str]] = []

    def make(path: str) -> tuple[Callable[[], None], Callable[[], None]]:
        def cut() -> None:
            proc = subprocess.Popen(
                [sys.executable, "-c", LOCKER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"

        def restore() -> None:
            proc = procs[-1]
            assert proc.stdin is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=10)

        return cut, restore

    yield make
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sqlite_locked_past_the_busy_timeout_loses_no_usage(
    sim: Sim, tmp_path: Path, sqlite_locker: Callable[[str], tuple[Callable[[], None], Callable[[], None]]]
) -> None:
    db = tmp_path / "ezat.db"
    url = f"sqlite:///{db.as_posix()}"
    cut, restore = sqlite_locker(str(db))
    started = time.monotonic()
    _outage(sim, tmp_path, url, url, cut, restore, "[[sim:words=10,token_delay_ms=100]]")
    assert time.monotonic() - started < 90
