"""A reservation never outlives its request's worker (issue: nothing stuck).

gunicorn with 2 gevent workers and the simulator; 15 streams stall mid-way (``[[sim:stall=…]]``)
and the worker holding most of them is killed with SIGKILL, as the OOM killer would. The
master's ``child_exit`` releases that worker's reservations within seconds and gives each its
ledger row (status 500, cost 0: the gateway cut the stream; spec chat-completions.md
"Streaming": a failure after the start isn't billed). The other worker's streams finish and
are billed as usual. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from tests.integration.conftest import standard_models
from tests.integration.faults import Outcome, chat, money, pg_schema, pg_url, wait_for, worker_holds
from tests.integration.harness import Gateway, Sim

STREAMS = 15
BALANCE_MICROS = 100_000_000  # $100
RELEASE_WITHIN_S = 5.0


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{(tmp_path / 'ezat.db').as_posix()}"
        return
    base = request.getfixturevalue("postgres_url")
    with pg_schema(base) as schema:
        yield pg_url(base, schema)


def test_a_killed_workers_reservations_are_released_with_one_ledger_row_each(
    sim: Sim, database_url: str, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        gateway = Gateway(
            root=tmp_path / "gw",
            models=standard_models(sim.url),
            workers=2,
            gateway_settings={"database_url": database_url, "keepalive_s": 1},
            env={"EZAT_DATABASE_URL": database_url, "EZAT_JOURNAL_DIR": str(tmp_path / "journal")},
        )
        stack.callback(gateway.stop)
        gateway.start()
        engine = create_engine(database_url)
        stack.callback(engine.dispose)
        key = gateway.new_key("crash", balance="100")

        outcomes = [Outcome() for _ in range(STREAMS)]

        def client(i: int) -> None:
            outcomes[i] = chat(gateway.url, key, f"stream {i} [[sim:stall=6]]", stream=True)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        wait_for(lambda: sum(worker_holds(engine).values()) == STREAMS, timeout_s=30)
        wait_for(lambda: sim.stats()["open_streams"] >= STREAMS, timeout_s=30)
        time.sleep(0.5)  # the gateway relays message_start: every client has its headers
        holds = worker_holds(engine)
        victim = max(holds, key=lambda pid: holds[pid])
        killed = holds[victim]
        os.kill(victim, signal.SIGKILL)
        released_in = wait_for(lambda: victim not in worker_holds(engine), timeout_s=RELEASE_WITHIN_S)
        for t in threads:
            t.join(timeout=60)
        wait_for(lambda: money(engine, "crash").reservations == 0, timeout_s=10)
        after = money(engine, "crash")
        print(
            f"\n[{database_url.split(':')[0]}] killed worker {victim} holding {killed} of {STREAMS} streams; "
            f"its reservations released in {released_in:.2f} s; ledger rows {after.ledger_rows}, "
            f"statuses {after.statuses}, cost {after.ledger_cost} micros"
        )

    assert after.reservations == 0 and after.reserved == 0 and after.key_reserved == 0
    ids = [o.request_id for o in outcomes]
    assert all(ids), [(o.status, o.error, o.body[:200]) for o in outcomes if not o.request_id]
    assert sorted(after.ledger_ids) == sorted(ids)  # exactly one row per request
    assert BALANCE_MICROS - after.balance == after.ledger_cost
    cut = [o for o in outcomes if not o.done]
    assert len(cut) == killed  # the victim's clients were cut, the others finished
    assert after.statuses.get(500, 0) == killed  # the cut streams: a gateway failure, not billed
    assert after.statuses.get(200, 0) == STREAMS - killed
    assert released_in < RELEASE_WITHIN_S
