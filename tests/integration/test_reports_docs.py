"""docs/admin-api.md's report examples ("Usage and cost reports"), run as printed (only the address
and the admin key changed) against a real gateway after real requests: the ``anthropic`` SDK's and
the curl lines, whose figures must be the ledger's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import standard_models
from tests.integration.harness import REPO, Gateway, Sim
from tests.support.docs import code_block

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "admin-api.md"
BASE = "http://127.0.0.1:8081"
KEY = "ezat_admin_…"


@pytest.fixture(scope="module")
def served(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = Gateway(root=tmp_path_factory.mktemp("reports-docs"), models=standard_models(sim.url), admin=True)
    gateway.start()
    key = gateway.new_key("docs-team")
    for model in ("claude-sonnet-5-5", "claude-haiku-4-5", "claude-sonnet-5-5"):
        body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        answer = requests.post(gateway.url + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=60)
        assert answer.status_code == 200, answer.text
    yield gateway
    gateway.stop()


def _as_printed(language: str, marker: str, gateway: Gateway, admin_key: str) -> str:
    source = code_block(PAGE, language, marker)
    assert BASE in source and KEY in source  # what a reader pastes, with their address and key
    return source.replace(BASE, gateway.admin_url).replace(KEY, admin_key)


def test_the_sdk_example(served: Gateway, tmp_path: Path) -> None:
    script = tmp_path / "reports.py"
    script.write_text(_as_printed("python", "analytics.cost.list", served, served.new_admin_key("--read-only")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = served.usage()
    costs = [line.split() for line in done.stdout.splitlines() if line.startswith("wrkspc_")]
    assert {c[1] for c in costs} == {r["canonical_model"] for r in rows}
    assert sum(Decimal(c[2]) for c in costs) == sum(Decimal(r["cost_usd"]) * 100 for r in rows)
    tokens = [line.split() for line in done.stdout.splitlines() if not line.startswith("wrkspc_")]
    assert sum(int(t[3]) for t in tokens) == sum(r["output_tokens"] for r in rows)


def test_the_curl_examples(served: Gateway) -> None:
    script = _as_printed("bash", "analytics/cost", served, served.new_admin_key("--read-only"))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    cost, usage = (json.loads(line) for line in done.stdout.splitlines() if line.strip())
    rows = served.usage()
    assert sum(Decimal(r["cost"]["amount"]) for r in cost["data"]) == sum(Decimal(r["cost_usd"]) * 100 for r in rows)
    assert {r["group"]["api_key_id"] for r in cost["data"]} == {"apikey_" + r["key_id"][4:] for r in rows}
    assert len(usage["data"]) <= 24
    assert sum(res["requests"] for b in usage["data"] for res in b["results"]) == len(rows)
