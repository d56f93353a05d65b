"""docs/admin-api.md's examples, run as printed (only the address, the admin key and a key's id
changed) against the real gateway's admin listener: the ``anthropic`` SDK's and the curl lines."""

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
    gateway = Gateway(root=tmp_path_factory.mktemp("admin-docs"), models=standard_models(sim.url), admin=True)
    gateway.start()
    yield gateway
    gateway.stop()


def _as_printed(language: str, marker: str, gateway: Gateway, admin_key: str) -> str:
    source = code_block(PAGE, language, marker)
    assert BASE in source and KEY in source  # what a reader pastes, with their address and key
    return source.replace(BASE, gateway.admin_url).replace(KEY, admin_key)


def _bash(script: str, env: dict[str, str] | None = None) -> list[str]:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_the_sdk_example(served: Gateway, tmp_path: Path) -> None:
    admin_key = served.new_admin_key()
    script = tmp_path / "example.py"
    script.write_text(_as_printed("python", "admin.organization.workspaces", served, admin_key))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.split()[1:2] == ["data-science"] for line in lines)
    assert any(line.startswith("apikey_") and " ci ezat_sk_" in line for line in lines)
    trail = json.loads(served.cli("audit", "list", "--json").stdout)
    assert [e["action"] for e in trail][:4] == [
        "workspace.archive",
        "api_key.unblock",
        "api_key.block",
        "api_key.create",
    ]


def test_the_curl_examples(served: Gateway) -> None:
    admin_key = served.new_admin_key()
    answers = [json.loads(line) for line in _bash(_as_printed("bash", '"name": "research"', served, admin_key))]
    workspace, key, listed, topped, trail = answers
    assert (workspace["name"], workspace["balance"]["amount"]) == ("research", "50000")
    assert key["secret"].startswith("ezat_sk_") and key["rate_limits"]["requests_per_minute"] == 60
    assert [k["id"] for k in listed["data"]] == [key["id"]]
    assert topped["balance"]["amount"] == "60000"
    assert [e["action"] for e in trail["data"]][:3] == ["workspace.top_up", "api_key.create", "workspace.create"]

    rotation = code_block(PAGE, "bash", "/rotate").replace(KEY_ID, key["id"])
    env = {"ADMIN": served.admin_url + "/v1/organizations", "KEY": admin_key}
    rotated, blocked, unblocked = [json.loads(line) for line in _bash(rotation, env)]
    assert rotated["secret"] != key["secret"] and rotated["id"] == key["id"]
    assert (blocked["status"], unblocked["status"]) == ("inactive", "active")
