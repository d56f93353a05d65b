"""docs/admin-api.md's spend-limit examples ("Spend limits by period"), run as printed (only the
address, the admin key and a key's id changed) against the real gateway's admin listener."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import standard_models
from tests.integration.harness import REPO, Gateway, Sim
from tests.support.docs import code_block

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "admin-api.md"
BASE = "http://127.0.0.1:8081"
KEY = "ezat_admin_…"
KEY_ID = "apikey_…"


@pytest.fixture(scope="module")
def served(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = Gateway(root=tmp_path_factory.mktemp("spend-docs"), models=standard_models(sim.url), admin=True)
    gateway.start()
    yield gateway
    gateway.stop()


def _as_printed(language: str, marker: str, gateway: Gateway, admin_key: str, key_id: str) -> str:
    source = code_block(PAGE, language, marker)
    assert BASE in source and KEY in source and KEY_ID in source  # what a reader pastes, with their own
    return source.replace(BASE, gateway.admin_url).replace(KEY, admin_key).replace(KEY_ID, key_id)


def _key_id(gateway: Gateway, org: str) -> str:
    gateway.new_key(org)
    listed = json.loads(gateway.cli("keys", "list", "--org", org, "--json").stdout)
    return "apikey_" + listed[-1]["id"].removeprefix("key_")


def test_the_curl_example(served: Gateway) -> None:
    key_id = _key_id(served, "research")
    script = _as_printed("bash", '"period": "monthly"', served, served.new_admin_key(), key_id)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    monthly, daily, effective = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert (monthly["scope"]["type"], monthly["amount"], monthly["period"]) == ("workspace", "20000", "monthly")
    assert daily["scope"] == {"type": "api_key", "api_key_id": key_id} and daily["amount"] == "500"
    [row] = [r for r in effective["data"] if r["actor"]["scoped_api_key_id"] == key_id]
    assert (row["period"], row["spend_limit_id"], row["amount"]) == ("daily", daily["id"], "500")
    trail = json.loads(served.cli("audit", "list", "--json").stdout)
    assert [e["action"] for e in trail][:2] == ["spend_limit.create", "spend_limit.create"]


def test_the_sdk_example(served: Gateway, tmp_path: Path) -> None:
    key_id = _key_id(served, "sdk-docs")
    script = tmp_path / "example.py"
    script.write_text(_as_printed("python", "spend_limits.set", served, served.new_admin_key(), key_id))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    first, *rows = done.stdout.splitlines()
    limit_id, amount, period = first.split()
    assert limit_id.startswith("spl_") and (amount, period) == ("500", "daily")
    assert f"{key_id} {limit_id} 500 0" in rows
    trail = json.loads(served.cli("audit", "list", "--json").stdout)
    assert [(e["action"], e["target"]["id"]) for e in trail][:2] == [
        ("spend_limit.delete", limit_id),
        ("spend_limit.create", limit_id),
    ]
