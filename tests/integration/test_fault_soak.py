"""The fault soak: a bad day in production, bounded, on loopback (issue: nothing lost, nothing stuck).

Concurrent streams and non-streams of one organisation run for ~25 s while the simulator answers
529s, cuts streams and stalls them, one gateway worker is killed with SIGKILL, and PostgreSQL is
cut and restored through a loopback TCP proxy. Afterwards the money invariants hold exactly (the
ledger's costs sum to the balance decrease, one ledger row per admitted request, no reservation),
the simulator has no stream open, and no client got a 500.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url

from tests.integration.conftest import standard_models
from tests.integration.faults import Outcome, TcpProxy, chat, money, pg_schema, pg_url, wait_for, worker_holds
from tests.integration.harness import Gateway, Sim

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

BALANCE_MICROS = 100_000_000
CLIENTS = 8
RUN_S = 25.0
KILL_AT_S, CUT_AT_S, RESTORE_AT_S = 5.0, 10.0, 14.0
MARKERS = (
    "",
    "[[sim:status=529]]",
    "[[sim:cut=4]]",
    "[[sim:stall=2]]",
    "[[sim:words=25,token_delay_ms=60]]",
    "[[sim:error_after=3]]",
)


def test_fault_soak(sim: Sim, postgres_url: str, tmp_path: Path) -> None:
    pg = make_url(postgres_url)
    proxy = TcpProxy((pg.host or "127.0.0.1", pg.port or 5432))
    journal = tmp_path / "journal"
    with pg_schema(postgres_url) as schema:
        direct, via_proxy = pg_url(postgres_url, schema), pg_url(postgres_url, schema, port=proxy.port)
        gateway = Gateway(
            root=tmp_path / "gw",
            models=standard_models(sim.url),
            workers=2,
            gateway_settings={"database_url": via_proxy, "keepalive_s": 1, "cooldown_failures": 1000},
            env={"EZAT_DATABASE_URL": via_proxy, "EZAT_JOURNAL_DIR": str(journal)},
        )
        engine = create_engine(direct)
        try:
            gateway.start()
            key = gateway.new_key("soak", balance="100")
            sim.clear()
            outcomes: list[Outcome] = []
            lock = threading.Lock()
            stop = time.monotonic() + RUN_S

            def client(n: int) -> None:
                for i in itertools.count():
                    if time.monotonic() >= stop:
                        return
                    marker = MARKERS[(n + i) % len(MARKERS)]
                    out = chat(gateway.url, key, f"soak {n}.{i} {marker}", stream=(n + i) % 2 == 0, timeout_s=30)
                    with lock:
                        outcomes.append(out)

            threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
            started = time.monotonic()
            for t in threads:
                t.start()
            time.sleep(KILL_AT_S)
            holds = worker_holds(engine)
            victim = max(holds, key=lambda pid: holds[pid]) if holds else None
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
            time.sleep(max(0.0, started + CUT_AT_S - time.monotonic()))
            proxy.cut()
            time.sleep(max(0.0, started + RESTORE_AT_S - time.monotonic()))
            proxy.restore()
            for t in threads:
                t.join(timeout=RUN_S + 60)

            def settled() -> bool:
                if list(journal.glob("*.jsonl")) if journal.exists() else []:
                    with lock:
                        outcomes.append(chat(gateway.url, key, "nudge", stream=False))  # maintain() on admission
                    return False
                return money(engine, "soak").reservations == 0

            wait_for(settled, timeout_s=40, step_s=1.0)
            after = money(engine, "soak")
            sim_stats = sim.stats()
        finally:
            gateway.stop()
            engine.dispose()
            proxy.cut()

    statuses = Counter(o.status for o in outcomes)
    admitted = {o.request_id for o in outcomes if o.status == 200}
    unknown = sum(1 for o in outcomes if not o.request_id)  # cut before their headers (the killed worker)
    rows = Counter(after.ledger_ids)
    print(
        f"\n[soak] {len(outcomes)} requests, client statuses {dict(statuses)} ({unknown} cut before headers); "
        f"killed worker {victim}; ledger rows {after.ledger_rows} ({after.statuses}); cost {after.ledger_cost} "
        f"== balance decrease {BALANCE_MICROS - after.balance}; reservations {after.reservations}; "
        f"sim open streams {sim_stats['open_streams']}"
    )
    assert victim is not None, "a worker held reservations when it was killed"
    assert len(outcomes) > 50
    assert statuses[500] == 0 and set(statuses) <= {0, 200, 503}
    assert statuses[503] > 0  # the 529s (and the database cut) were seen
    assert after.reservations == 0 and after.reserved == 0 and after.key_reserved == 0
    assert BALANCE_MICROS - after.balance == after.ledger_cost > 0
    assert all(count == 1 for count in rows.values())
    assert admitted <= set(rows)  # every admitted request has its row…
    seen = {o.request_id for o in outcomes if o.request_id}
    assert len(set(rows) - seen) <= unknown  # …and no row belongs to nobody
    assert sim_stats["open_streams"] == 0
