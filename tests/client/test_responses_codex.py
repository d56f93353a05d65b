"""The Codex CLI (npm ``@openai/codex``) in ``codex exec`` mode with a custom model provider at
the gateway (``wire_api = "responses"``), its default features and tools left on, against the
strict simulator (docs/responses.md): over two tool rounds it runs a shell command that writes a
file in a scratch folder, then one that edits it, with ``reasoning.effort`` set, and every round
keeps its thinking.

The simulator is scripted with ``[[sim:tool=…,args=…]]``: the prompt's marker makes the first
call, and the first command prints the marker of the second (a marker in a tool's output scripts
the next call). A simulator without these markers skips the test."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests

from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration
MODEL = "anthropic/claude-sonnet-5-5"
EDIT = "sed -i s/hello/goodbye/ notes.txt && cat notes.txt"
NEXT = "[[sim:tool=exec_command,args=" + json.dumps({"cmd": EDIT})  # its closing brackets are printed apart
WRITE = f"printf 'hello from codex' > notes.txt && printf '%s]%s\\n' '{NEXT}' ']'"


def _scriptable(sim: Sim) -> bool:
    """Whether the simulator takes ``tool=``/``args=`` markers (an unknown marker is a 400)."""
    probe = {
        "model": "claude-sonnet-5-5",
        "max_tokens": 16,
        "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {}}}],
        "messages": [{"role": "user", "content": 'probe [[sim:tool=t,args={"a": 1}]]'}],
    }
    resp = requests.post(
        sim.url + "/v1/messages", json=probe, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}, timeout=10
    )
    return resp.status_code == 200


def test_codex_exec_writes_then_edits_a_file_over_two_tool_rounds(
    gateway: Gateway,
    sim: Sim,
    node_clients: Path,
    tmp_path: Path,
) -> None:
    if not _scriptable(sim):
        pytest.skip("the simulator has no tool=/args= markers to script Codex's tool call")
    key = gateway.new_key("resp-codex")
    home, scratch = tmp_path / "codex-home", tmp_path / "scratch"
    home.mkdir()
    scratch.mkdir()
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "ezat"\n'
        'model_reasoning_effort = "high"\n'
        "[model_providers.ezat]\n"
        'name = "EZAT"\n'
        f'base_url = "{gateway.url}/openai/v1"\n'
        'env_key = "EZAT_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    prompt = f"Write notes.txt, then edit it. [[sim:tool=exec_command,args={json.dumps({'cmd': WRITE})}]]"
    sim.clear()
    done = subprocess.run(
        [
            str(node_clients / "node_modules" / ".bin" / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-C",
            str(scratch),
            prompt,
        ],
        env={**os.environ, "CODEX_HOME": str(home), "EZAT_API_KEY": key},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"codex exec failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert (scratch / "notes.txt").read_text() == "goodbye from codex"
    assert "goodbye from codex" in done.stdout  # its last message quotes the second command's output
    bodies = sim.bodies()
    assert len(bodies) == 3  # two tool rounds, then the answer
    assert all(b["thinking"] == {"type": "adaptive"} and b["output_config"]["effort"] == "high" for b in bodies)
    names = [tool["name"] for tool in bodies[0]["tools"]]
    assert "exec_command" in names and any("__" in name for name in names)  # its namespace, flattened
    assert not any(tool.get("type", "").startswith("web_search") for tool in bodies[0]["tools"])
    for sent, rounds in ((bodies[1], 1), (bodies[2], 2)):
        turns = [m for m in sent["messages"] if m["role"] == "assistant"]
        assert len(turns) == rounds
        assert all(m["content"][0]["type"] == "thinking" for m in turns)  # sealed here, sent back by Codex
        assert all([b["name"] for b in m["content"] if b["type"] == "tool_use"] == ["exec_command"] for m in turns)
    rows = gateway.usage("--org", "resp-codex")
    assert len(rows) == 3 and {r["endpoint"] for r in rows} == {"responses"} and all(r["status"] == 200 for r in rows)
