"""The usage journal is replayed when the database answers, not when traffic comes.

Streams — chat completions and stored Responses — finish while PostgreSQL is cut (a loopback
TCP proxy, ``faults.TcpProxy``): their settlements, and the stored responses with them, go to
the usage journal in the data folder. When the database returns, no request is sent to the
gateway, yet within 5 s every reservation is released and every ledger row written (each
worker's replayer looks at the journal every second); then ``/readyz`` answers 200 and the
stored responses can be retrieved. The journal's folder and files are private (0700/0600).
"""

from __future__ import annotations

import json
import stat
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, make_url

from tests.integration.conftest import standard_models
from tests.integration.faults import Outcome, TcpProxy, chat, money, pg_schema, pg_url, wait_for
from tests.integration.harness import Gateway, Sim

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

CHATS = 4
RESPONSES = 2
SLOW = "[[sim:words=30,token_delay_ms=150]]"  # ~4.5 s: the cut comes mid-stream


def _responses_stream(url: str, key: str, text_: str) -> tuple[int, str, bool]:
    """A streamed Responses request: (status, the response's id, completed)."""
    response_id, completed = "", False
    with requests.post(
        url + "/openai/v1/responses",
        json={"model": "anthropic/claude-sonnet-5-5", "input": text_, "max_output_tokens": 200, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        stream=True,
        timeout=60,
    ) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[len(b"data: ") :])
            response_id = response_id or event.get("response", {}).get("id", "")
            completed = completed or event.get("type") == "response.completed"
        return r.status_code, response_id, completed


def _journal_files(root: Path) -> list[Path]:
    return sorted(root.glob("usage-journal-*/*.jsonl"))


def test_the_journal_is_replayed_when_postgresql_returns_without_traffic(
    sim: Sim, postgres_url: str, tmp_path: Path
) -> None:
    pg = make_url(postgres_url)
    proxy = TcpProxy((pg.host or "127.0.0.1", pg.port or 5432))
    with pg_schema(postgres_url) as schema, ExitStack() as stack:
        stack.callback(proxy.cut)
        direct, via_proxy = pg_url(postgres_url, schema), pg_url(postgres_url, schema, port=proxy.port)
        root = tmp_path / "gw"
        gateway = Gateway(
            root=root,
            models=standard_models(sim.url),
            workers=2,
            gateway_settings={"database_url": via_proxy, "keepalive_s": 1},
            env={"EZAT_DATABASE_URL": via_proxy},
        )
        stack.callback(gateway.stop)
        gateway.start()
        engine = create_engine(direct)
        stack.callback(engine.dispose)
        key = gateway.new_key("replay", balance="100")

        chats = [Outcome() for _ in range(CHATS)]
        stored: list[tuple[int, str, bool]] = [(0, "", False)] * RESPONSES

        def chat_client(i: int) -> None:
            chats[i] = chat(gateway.url, key, f"chat {i} {SLOW}", stream=True, max_tokens=200)

        def responses_client(i: int) -> None:
            stored[i] = _responses_stream(gateway.url, key, f"kept {i} {SLOW}")

        threads = [threading.Thread(target=chat_client, args=(i,)) for i in range(CHATS)]
        threads += [threading.Thread(target=responses_client, args=(i,)) for i in range(RESPONSES)]
        for t in threads:
            t.start()
        wait_for(lambda: money(engine, "replay").reservations == CHATS + RESPONSES, timeout_s=30)
        proxy.cut()
        for t in threads:
            t.join(timeout=60)
        journaled = _journal_files(root)
        modes = {stat.S_IMODE(p.stat().st_mode) for p in journaled}
        folders = {stat.S_IMODE(p.parent.stat().st_mode) for p in journaled}
        during = requests.get(gateway.url + "/readyz", timeout=10)
        time.sleep(1.5)  # past the readiness cache: nothing else reaches the gateway from here on
        proxy.restore()
        back = time.monotonic()

        def settled() -> bool:
            m = money(engine, "replay")
            return m.reservations == 0 and m.ledger_rows == CHATS + RESPONSES and not _journal_files(root)

        took = wait_for(settled, timeout_s=5, step_s=0.1)
        after = money(engine, "replay")
        assert time.monotonic() - back < 5.5
        ready = requests.get(gateway.url + "/readyz", timeout=10)
        kept = [
            requests.get(
                gateway.url + f"/openai/v1/responses/{rid}", headers={"Authorization": f"Bearer {key}"}, timeout=10
            )
            for _, rid, _ in stored
        ]
        log = gateway.log_text()

    print(f"\nreplayed {len(journaled)} journal file(s) {took:.2f} s after the database returned")
    assert all(c.status == 200 and c.done for c in chats), [(c.status, c.error) for c in chats]
    assert all(status == 200 and rid and done for status, rid, done in stored), stored
    assert journaled and modes == {0o600} and folders == {0o700}
    assert during.status_code == 503
    assert after.reservations == 0 and after.reserved == 0 and after.key_reserved == 0
    assert after.statuses == {200: CHATS + RESPONSES}
    assert 100_000_000 - after.balance == after.ledger_cost > 0
    assert ready.status_code == 200, ready.text
    assert [r.status_code for r in kept] == [200] * RESPONSES, [r.text for r in kept]
    assert [r.json()["id"] for r in kept] == [rid for _, rid, _ in stored]
    assert "could not store response" not in log
