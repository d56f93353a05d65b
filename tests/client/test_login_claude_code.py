"""Claude Code signed in as a person: ``ezat-compat login`` once (the browser step done with
``requests`` against the loopback OpenID Connect provider), then Claude Code with docs/people.md's
settings file as printed there (``apiKeyHelper`` = ``ezat-compat token``, ``ANTHROPIC_BASE_URL``
= the gateway; only the address changed) answers ``claude -p`` through the gateway, every request
billed to the person's key and the ledger naming the person. Installed and skipped like
``test_node_clients.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.harness import REPO, Sim
from tests.support.browser import ConsoleGateway
from tests.support.device import GROUP, approve, begin_login, device_gateway, laptop_env, rows, start_gateway
from tests.support.docs import code_block
from tests.support.environment import QUIET_ENV
from tests.support.oidc import LoopbackIdP, loopback_idp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PEOPLE_PAGE = REPO / "docs" / "people.md"
DOCS_GATEWAY = "https://llm.example.com"  # the address docs/people.md's recipes print


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="sim").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def idp() -> Iterator[LoopbackIdP]:
    with loopback_idp() as provider:
        provider.add_user("cody", name="Cody Coder", email="cody@example.com", groups=[GROUP])
        yield provider


@pytest.fixture(scope="module")
def gateway(
    node_clients: Path, sim: Sim, idp: LoopbackIdP, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleGateway]:
    """(``node_clients`` first: without Claude Code, the test skips before any server starts.)"""
    server = start_gateway(device_gateway(tmp_path_factory.mktemp("login-claude"), idp, sim))
    yield server
    server.stop()


def test_claude_code_with_ezat_compat_token_as_its_api_key_helper(
    gateway: ConsoleGateway, idp: LoopbackIdP, sim: Sim, node_clients: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    started = begin_login(home, gateway.url)
    assert approve(requests.Session(), started.uri, idp, "cody", user_code=started.code).status_code == 200
    status, _, said = started.finish()
    assert status == 0, said

    settings = code_block(PEOPLE_PAGE, "json", '"apiKeyHelper"')
    assert DOCS_GATEWAY in settings
    (home / ".claude").mkdir()
    (home / ".claude" / "settings.json").write_text(settings.replace(DOCS_GATEWAY, gateway.url))
    scripts = str(Path(sys.executable).parent)  # where pip put the ezat-compat command
    assert (Path(scripts) / "ezat-compat").exists()
    env = {
        **{k: v for k, v in laptop_env(home).items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "OPENAI_"))},
        **QUIET_ENV,
        "PATH": scripts + os.pathsep + os.environ.get("PATH", ""),
        "ANTHROPIC_MODEL": "claude-sonnet-5-5",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "claude-sonnet-5-5",
        "ANTHROPIC_SMALL_FAST_MODEL": "claude-sonnet-5-5",
    }
    sim.clear()
    claude = node_clients / "node_modules" / ".bin" / "claude"
    done = subprocess.run(
        [str(claude), "-p", "Say hello.", "--output-format", "json", "--max-turns", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["is_error"] is False, result
    assert result["result"]

    cody = rows(gateway, "SELECT id FROM users WHERE subject = 'cody'")[0]["id"]
    keys = {r["id"] for r in rows(gateway, "SELECT id FROM api_keys WHERE user_id = :u", u=cody)}
    billed = rows(gateway, "SELECT user_id, key_id, status FROM ledger WHERE endpoint = 'messages'")
    assert billed, "Claude Code's requests reached no ledger row"
    assert all(r["user_id"] == cody and r["key_id"] in keys and r["status"] == 200 for r in billed), billed
    calls = [r for r in sim.requests() if r["path"] == "/v1/messages"]
    assert calls, "Claude Code's requests never reached the upstream"
