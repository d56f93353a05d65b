"""One owner of each database file per process: the CLI runs beside serving workers and no
usage is lost (SQLite).

POSIX locks belong to a process, not to a descriptor: a worker that opens a second handle on
``ezat.db`` and closes it (a probe's own engine, a plain ``open()``) drops every lock the
process held on the file. The next CLI command then believes it is the last user of the
database: on closing it checkpoints and deletes ``ezat.db-wal`` and ``-shm`` while the worker
still writes into them, and the worker's rows vanish. Here the gateway serves, ``/readyz`` is
probed, every admin command runs beside it, and the gateway keeps serving: every request has
its ledger row while serving and after the stop, the WAL stays in place, and what the CLI
changes (a new key, a top-up, a revocation) is seen on the next request.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import standard_models
from tests.integration.faults import chat
from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration

PROBES = 6  # new connections each: with two workers both get probed


@pytest.fixture(params=[1, 2], ids=["one-worker", "two-workers"])
def served(request: pytest.FixtureRequest, sim: Sim, tmp_path: Path) -> Iterator[Gateway]:
    gateway = Gateway(root=tmp_path / "gw", models=standard_models(sim.url), workers=request.param, cli_as_program=True)
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def _probe(gateway: Gateway) -> None:
    for _ in range(PROBES):
        with requests.Session() as s:  # a new connection: any worker may take it
            assert s.get(gateway.url + "/readyz", timeout=10).status_code == 200


def _responses_create(gateway: Gateway, key: str) -> str:
    r = requests.post(
        gateway.url + "/openai/v1/responses",
        json={"model": "anthropic/claude-sonnet-5-5", "input": "keep this", "max_output_tokens": 32},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return str(r.headers["request-id"])


def _traffic(gateway: Gateway, key: str, label: str) -> list[str]:
    ids = []
    for i in range(4):
        out = chat(gateway.url, key, f"{label} {i}", stream=bool(i % 2))
        assert out.status == 200 and out.done, (out.status, out.error, out.body[:200])
        ids.append(out.request_id)
    ids.append(_responses_create(gateway, key))
    return ids


def _ledger_ids(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {row[0] for row in conn.execute("SELECT request_id FROM ledger")}
    finally:
        conn.close()


def test_admin_commands_beside_serving_workers_lose_no_usage(served: Gateway) -> None:
    gateway = served
    db = gateway.root / "ezat.db"
    wal = Path(str(db) + "-wal")
    key = gateway.new_key("owner")
    sent = _traffic(gateway, key, "before the probe")
    commands: list[tuple[str, ...]] = [
        ("usage",),
        ("keys", "create", "--org", "owner", "--name", "fresh"),
        ("orgs", "top-up", "owner", "1"),
        ("keys", "list"),
        ("usage", "--json"),
    ]
    for command in commands:
        _probe(gateway)
        inode = wal.stat().st_ino
        made = gateway.cli(*command)
        removed = f"`{' '.join(command)}` removed the WAL from under the gateway"
        assert wal.exists() and wal.stat().st_ino == inode, removed
        if command[:2] == ("keys", "create"):
            fresh = made.stdout.strip().splitlines()[-1]
            out = chat(gateway.url, fresh, "a key made by the CLI works at once", stream=False)
            assert out.status == 200, out.body
            sent.append(out.request_id)
        sent += _traffic(gateway, key, f"after {command}")
        recorded = {row["request_id"] for row in gateway.usage()}
        assert set(sent) <= recorded, f"after `{' '.join(command)}`: no ledger row for {set(sent) - recorded}"
    gateway.stop()
    assert set(sent) <= _ledger_ids(db)


def test_what_the_cli_changes_is_seen_on_the_next_request(served: Gateway) -> None:
    gateway = served
    key = gateway.new_key("poor", balance="0")
    _probe(gateway)
    assert chat(gateway.url, key, "no money yet", stream=False).status == 402
    gateway.cli("orgs", "top-up", "poor", "5")
    _probe(gateway)
    assert chat(gateway.url, key, "topped up", stream=False).status == 200
    (listed,) = [k for k in json.loads(gateway.cli("keys", "list", "--json").stdout) if k["org"] == "poor"]
    gateway.cli("keys", "update", listed["id"], "--spend-limit", "0")
    assert chat(gateway.url, key, "no spending allowed", stream=False).status == 402  # seen at once
    updated = gateway.cli("keys", "update", listed["id"], "--spend-limit", "none", "--rpm", "1")
    assert updated.stdout.strip() == f"updated key {listed['id']}: spend limit (USD) none, rpm 1, tpm none"
    assert chat(gateway.url, key, "one a minute", stream=False).status == 200
    assert chat(gateway.url, key, "the second this minute", stream=False).status == 429
    gateway.cli("keys", "update", listed["id"], "--rpm", "none")
    assert chat(gateway.url, key, "no limit again", stream=False).status == 200
    refused = gateway.cli("keys", "update", listed["id"], "--rpm", "0", check=False)
    assert refused.returncode == 1 and "--rpm" in refused.stderr
    assert gateway.cli("keys", "update", "key_nope", "--rpm", "5", check=False).returncode == 1
    gateway.cli("keys", "revoke", listed["id"])
    assert chat(gateway.url, key, "revoked", stream=False).status == 401
