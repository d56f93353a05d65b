"""The operator's week on SQLite, compressed: HAProxy's recipe (deploy/haproxy.cfg, the real
HAProxy) in front of the gateway probes ``/readyz`` every 2 s, an operator runs ``usage``,
``keys create`` and ``orgs top-up`` every few seconds, and 20 requests a second (JSON and
streams) go through the proxy, with one and with two workers. At the end every answered request
has exactly one ledger row, the WAL was never removed from under the gateway, and every key the
CLI made worked on its first request.

``EZAT_SOAK_S`` sets the seconds of traffic (default 20; the issue's run is 300).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import standard_models
from tests.integration.faults import chat
from tests.integration.harness import Gateway, Sim
from tests.support.proxies import Proxy, start_proxy

pytestmark = pytest.mark.integration

SOAK_S = float(os.environ.get("EZAT_SOAK_S", "20"))
RATE = 20  # requests a second
ADMIN_EVERY_S = 3.0


@pytest.fixture(params=[1, 2], ids=["one-worker", "two-workers"])
def behind_haproxy(request: pytest.FixtureRequest, sim: Sim, tmp_path: Path) -> Iterator[tuple[Gateway, Proxy]]:
    gateway = Gateway(
        root=tmp_path / "gw", models=standard_models(sim.url), workers=request.param, cli_as_program=True
    ).start()
    try:
        proxy = start_proxy("haproxy", tmp_path, gateway.url, "/readyz")
        try:
            yield gateway, proxy
        finally:
            proxy.stop()
    finally:
        gateway.stop()


def _ledger(db: Path) -> Counter[str]:
    conn = sqlite3.connect(db)
    try:
        return Counter(row[0] for row in conn.execute("SELECT request_id FROM ledger"))
    finally:
        conn.close()


@pytest.mark.timeout(SOAK_S + 180)  # the soak itself, then the load's last requests and the checks
def test_admin_commands_beside_traffic_through_haproxy_lose_no_usage(
    behind_haproxy: tuple[Gateway, Proxy],
) -> None:
    gateway, proxy = behind_haproxy
    db = gateway.root / "ezat.db"
    wal = Path(str(db) + "-wal")
    key = gateway.new_key("soak", balance="100000")
    answered: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def one(i: int) -> None:
        out = chat(proxy.url, key, f"soak {i}", stream=bool(i % 2), max_tokens=32)
        with lock:
            if out.status == 200 and out.done:
                answered.append(out.request_id)
            else:
                failures.append(f"{i}: {out.status} {out.error} {out.body[:200]!r}")

    def traffic() -> None:
        threads: list[threading.Thread] = []
        started, i = time.monotonic(), 0
        while not stop.is_set():
            due = started + i / RATE
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            thread = threading.Thread(target=one, args=(i,))
            thread.start()
            threads.append(thread)
            i += 1
        for thread in threads:
            thread.join(60)

    load = threading.Thread(target=traffic)
    load.start()
    inode = None
    made_keys = 0
    deadline = time.monotonic() + SOAK_S
    try:
        while time.monotonic() < deadline:
            for command in (
                ("usage",),
                ("keys", "create", "--org", "soak", "--name", f"k{made_keys}"),
                ("orgs", "top-up", "soak", "1"),
            ):
                if wal.exists():
                    inode = inode or wal.stat().st_ino
                done = gateway.cli(*command)
                assert wal.exists() and wal.stat().st_ino == inode, f"`{' '.join(command)}` removed the WAL"
                if command[:2] == ("keys", "create"):
                    made_keys += 1
                    fresh = done.stdout.strip().splitlines()[-1]
                    out = chat(proxy.url, fresh, "a new key at once", stream=False)
                    assert out.status == 200, out.body
                    with lock:
                        answered.append(out.request_id)
                time.sleep(ADMIN_EVERY_S / 3)
    finally:
        stop.set()
        load.join(120)
    assert failures == [], failures[:5]
    assert len(answered) >= SOAK_S * RATE * 0.8, len(answered)
    rows = _ledger(db)
    assert not [r for r in answered if rows[r] != 1], "requests without exactly one ledger row"
    gateway.stop()
    rows = _ledger(db)
    assert not [r for r in answered if rows[r] != 1], "after the stop: requests without exactly one ledger row"
    assert made_keys >= 1
