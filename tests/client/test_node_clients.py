"""Node.js clients against the real gateway and the strict simulator: the AI SDK's
``generateObject`` through ``@ai-sdk/openai`` (chat completions), and Claude Code
(``@anthropic-ai/claude-code``, print mode) using the gateway as its Anthropic base URL and
running a tool. The npm packages are installed once into a cache folder (``EZAT_NODE_CACHE``,
by default ``tests/client/.node/clients``); without Node.js the tests skip, except under CI=true
where ``.ci/run`` installs it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.integration.harness import Gateway, Sim
from tests.support.environment import QUIET_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "anthropic/claude-sonnet-5-5"


def _objects(schema: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            found.append(schema)
        for value in schema.values():
            found += _objects(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _objects(value)
    return found


def test_ai_sdk_generate_object(gateway: Gateway, key: str, sim: Sim, node_clients: Path) -> None:
    sim.clear()
    env = {**os.environ, "EZAT_BASE_URL": gateway.url + "/openai/v1", "EZAT_API_KEY": key, "EZAT_MODEL": MODEL}
    done = subprocess.run(
        ["node", "generate_object.mjs"], cwd=node_clients, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["finishReason"] == "stop"
    assert set(out["object"]) == {"city", "forecast", "alert"} and out["object"]["forecast"]
    assert out["usage"]["inputTokens"] > 0
    bodies = sim.bodies()
    assert len(bodies) == 1
    schema = bodies[0]["output_config"]["format"]["schema"]  # accepted by the simulator's schema rules
    assert "$schema" not in json.dumps(schema)
    assert all(o.get("additionalProperties") is False for o in _objects(schema))


BASH_CALL = {"command": "echo hi-from-bash", "description": "Print a greeting"}


@dataclass
class Target:
    """A gateway to point Claude Code at: its URL, a key, its simulator and its usage rows."""

    url: str
    key: str
    sim: Sim
    usage: Any


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """``ezat-compat demo`` as a user starts it (its own simulator, data folder and key)."""
    root = tmp_path_factory.mktemp("demo")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "EZAT_CONFIG", "EZAT_DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ezat_compat.cli", "demo", "--bind", f"127.0.0.1:{port}"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        key = None
        deadline = time.monotonic() + 60
        while key is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if "API key" in line:
                key = line.split()[-1]
        assert key and key.startswith("ezat_sk_"), "the demo printed no key"
        config_path = root / "ezat-demo" / "ezat.toml"
        config = tomllib.loads(config_path.read_text())
        sim_url = next(d["base_url"] for m in config["models"] for d in m["deployments"])

        def usage() -> list[dict[str, Any]]:
            done = subprocess.run(
                [sys.executable, "-m", "ezat_compat.cli", "--config", str(config_path), "usage", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            return list(json.loads(done.stdout))

        yield Target(f"http://127.0.0.1:{port}", key, Sim(url=re.sub(r"/+$", "", sim_url)), usage)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


@pytest.fixture(params=["gateway", "demo"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "demo":
        found: Target = request.getfixturevalue("demo")
        return found
    gateway: Gateway = request.getfixturevalue("gateway")
    return Target(gateway.url, request.getfixturevalue("key"), request.getfixturevalue("sim"), gateway.usage)


def _claude_code(target: Target, node_clients: Path, tmp_path: Path, models: dict[str, str]) -> dict[str, Any]:
    """Claude Code in print mode with a prompt that makes it run one Bash command through
    ``target``; ``models``: its model variables (none: its own defaults). Its JSON result, after
    checking the tool loop reached the upstream whole: the thinking block kept in the second
    request, the tool's result sent back."""
    sim = target.sim
    sim.clear()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))},
        **QUIET_ENV,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": target.url,
        "ANTHROPIC_API_KEY": target.key,
        **models,
    }
    prompt = f"Run the greeting command. [[sim:tool=Bash,args={json.dumps(BASH_CALL)}]]"
    claude = node_clients / "node_modules" / ".bin" / "claude"
    done = subprocess.run(
        [str(claude), "-p", prompt, "--output-format", "json", "--allowedTools", "Bash(echo:*)", "--max-turns", "4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["is_error"] is False and result["num_turns"] == 2, result
    # The simulator's last answer quotes the tool results: Claude Code ran the command.
    assert result["result"] == "Tool results: hi-from-bash"
    calls = [r for r in sim.requests() if r["path"] == "/v1/messages"]
    assert len(calls) == 2, [r["body"]["messages"] for r in calls]
    first, second = (r["body"] for r in calls)
    assert "Bash" in {t["name"] for t in first["tools"]} and first["thinking"]["type"] in ("adaptive", "enabled")
    assert "claude-code" in calls[0]["headers"].get("anthropic-beta", "")  # the betas reach the upstream
    turn = second["messages"][-2]
    assert turn["role"] == "assistant" and turn["content"][0]["type"] == "thinking"  # kept by the client itself
    use = next(b for b in turn["content"] if b["type"] == "tool_use")
    assert (use["name"], use["input"]) == ("Bash", BASH_CALL)
    answer = second["messages"][-1]["content"]
    results = [b for b in answer if b["type"] == "tool_result" and b["tool_use_id"] == use["id"]]
    assert results and "hi-from-bash" in json.dumps(results[0]["content"])
    return dict(result)


def test_claude_code_runs_a_tool_through_the_gateway(target: Target, node_clients: Path, tmp_path: Path) -> None:
    models = {
        "ANTHROPIC_MODEL": "claude-sonnet-5-5",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "claude-haiku-4-5",
        "ANTHROPIC_SMALL_FAST_MODEL": "claude-haiku-4-5",
    }
    _claude_code(target, node_clients, tmp_path, models)
    billed = [r for r in target.usage() if r["endpoint"] == "messages" and r["model"] == "claude-sonnet-5-5"]
    assert len(billed) >= 2 and all(r["status"] == 200 for r in billed[-2:])


def test_claude_code_with_its_own_default_models_works_against_the_demo(
    demo: Target, node_clients: Path, tmp_path: Path
) -> None:
    """No model variables: Claude Code asks for its defaults (``claude-opus-4-8`` in 2.1.197),
    which the demo's pattern aliases (``claude-opus-*``…) take; the replies name the model as
    it was asked for, so Claude Code keeps its thinking blocks across the tool loop."""
    result = _claude_code(demo, node_clients, tmp_path, {})
    asked = [name for name in result["modelUsage"]]
    assert asked, result
    billed = [r for r in demo.usage() if r["endpoint"] == "messages" and r["status"] == 200]
    assert len(billed) >= 2
    assert all(r["canonical_model"].startswith("anthropic/claude-") for r in billed[-2:])
    assert {r["model"] for r in billed[-2:]} <= {name.removesuffix("[1m]") for name in asked}
