"""Node.js clients on the Responses endpoint (docs/responses.md) against the gateway and the
strict simulator: the openai npm SDK, the AI SDK's default ``openai(model)`` provider
(``generateText`` with a tool and ``stopWhen``, ``streamText``, ``generateObject``) and the
OpenAI Agents SDK for JavaScript. The packages (``tests/client/node/package.json``) are installed
by npm once into a cache folder; without Node.js the tests are skipped, except under CI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration


def run_node(folder: Path, script: str, gateway: Gateway, key: str) -> dict[str, Any]:
    env = {**os.environ, "EZAT_API_KEY": key, "EZAT_BASE_URL": gateway.url + "/openai/v1"}
    done = subprocess.run(["node", script], capture_output=True, text=True, env=env, cwd=folder, timeout=180)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_openai_npm_sdk(gateway: Gateway, key: str, node_clients: Path) -> None:
    out = run_node(node_clients, "openai_sdk.mjs", gateway, key)
    assert out["create"]["status"] == "completed" and out["create"]["id"].startswith("resp_")
    assert out["create"]["text"].endswith("You said: What is a prompt cache?") and out["create"]["total"] > 0
    assert out["stream"]["deltas"] == out["stream"]["text"] and out["stream"]["status"] == "completed"
    assert out["loop"]["calls"] == [["get_weather", {"city": "example"}]]
    assert out["loop"]["text"].startswith("Tool results: sunny")


def test_the_ai_sdk_default_openai_provider(gateway: Gateway, sim: Sim, node_clients: Path) -> None:
    key = gateway.new_key("resp-ai-sdk")
    sim.clear()
    out = run_node(node_clients, "ai_sdk.mjs", gateway, key)
    assert {row["endpoint"] for row in gateway.usage("--org", "resp-ai-sdk")} == {"responses"}
    assert out["generateText"]["called"] and out["generateText"]["steps"] == 2
    assert out["generateText"]["text"].startswith("Tool results: sunny in")
    assert out["streamText"]["text"].endswith("You said: Count to five") and out["streamText"]["finishReason"] == "stop"
    assert set(out["generateObject"]) == {"city", "degrees"}
    schema = sim.bodies()[-1]["output_config"]["format"]["schema"]
    assert "$schema" not in schema and schema["additionalProperties"] is False


def test_the_agents_sdk_for_javascript(gateway: Gateway, sim: Sim, node_clients: Path) -> None:
    key = gateway.new_key("resp-agents-js")
    sim.clear()
    out = run_node(node_clients, "agents.mjs", gateway, key)
    assert {row["endpoint"] for row in gateway.usage("--org", "resp-agents-js")} == {"responses"}
    assert out["called"] and out["output"].startswith("Tool results: sunny in")
    assert len(sim.bodies()) == 2
