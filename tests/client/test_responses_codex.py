"""The Codex CLI (npm ``@openai/codex``) in ``codex exec`` mode with a custom model provider at
the gateway (``wire_api = "responses"``), its default features and tools left on, against the
strict simulator (docs/responses.md): over two tool rounds it runs a shell command that writes a
file in a scratch folder, then one that edits it, with ``reasoning.effort`` set, and every round
keeps its thinking.

The simulator is scripted with ``[[sim:tool=…,args=…]]``: the prompt's marker makes the first
call, and the first command prints the marker of the second (a marker in a tool's output scripts
the next call). A simulator without these markers skips the test.

Without Node, a Codex turn of a copied catalog entry (``supports_search_tool``,
``use_responses_lite``) is sent as Codex writes it, with the openai SDK: its tools in an
``additional_tools`` input item, a client-run ``tool_search`` among them, and the search's
``tool_search_output`` (shapes from openai/codex: codex-rs/tools/src/tool_spec.rs,
codex-rs/protocol/src/models.rs, codex-rs/tools/src/tool_search.rs)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import openai
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


EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" LF'},
}
TOOL_SEARCH = {
    "type": "tool_search",
    "execution": "client",
    "description": "Search app and MCP tools.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
        "required": ["query"],
        "additionalProperties": False,
    },
}
LITE = {  # create_tools_json_for_responses_lite: the top-level tools folded into "functions"
    "type": "additional_tools",
    "role": "developer",
    "tools": [
        {"type": "namespace", "name": "functions", "description": "Tools", "tools": [EXEC, APPLY_PATCH]},
        TOOL_SEARCH,
    ],
}
FOUND = {
    "type": "namespace",
    "name": "mcp__calendar__",
    "description": "Calendar",
    "tools": [
        {
            "type": "function",
            "name": "create_event",
            "description": "Create an event",
            "strict": False,
            "defer_loading": True,
            "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
        }
    ],
}


def _codex_turn(api: openai.OpenAI, items: list) -> dict:
    """One request as a Responses-lite catalog entry makes Codex send it (streamed, stateless)."""
    stream = api.responses.create(
        model=MODEL,
        input=[{"role": "developer", "content": "You are Codex."}, LITE, *items],
        tool_choice="auto",
        parallel_tool_calls=False,
        reasoning={"effort": "high", "context": "all_turns"},  # type: ignore[typeddict-unknown-key]
        store=False,
        stream=True,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="codex-session",
        extra_headers={"x-openai-internal-codex-responses-lite": "true"},
    )
    final = [event for event in stream if event.type == "response.completed"]
    assert len(final) == 1
    return final[0].response.model_dump(exclude_none=True)


def test_a_responses_lite_turn_with_a_client_run_tool_search(gateway: Gateway, sim: Sim) -> None:
    if not _scriptable(sim):
        pytest.skip("the simulator has no tool=/args= markers to script the tool search")
    api = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=gateway.new_key("codex-lite"), max_retries=0)
    ask = {"role": "user", "content": 'Book it. [[sim:tool=tool_search,args={"query": "calendar", "limit": 1}]]'}
    sim.clear()
    first = _codex_turn(api, [ask])
    reasoning, call = first["output"]
    assert call == {
        "id": call["id"],
        "type": "tool_search_call",
        "status": "completed",
        "call_id": call["call_id"],
        "execution": "client",
        "arguments": {"query": "calendar", "limit": 1},
    }
    output = {
        "type": "tool_search_output",
        "call_id": call["call_id"],
        "status": "completed",
        "execution": "client",
        "tools": [FOUND],
    }
    history = [ask, reasoning, call, output]
    second = _codex_turn(api, history)
    assert second["output"][-1]["content"][0]["text"].startswith("Tool results: Tools found")
    book = {"role": "user", "content": 'Go on. [[sim:tool=mcp__calendar__create_event,args={"title": "Demo"}]]'}
    third = _codex_turn(api, [*history, *second["output"], book])
    created = third["output"][-1]
    assert created["type"] == "function_call" and created["name"] == "create_event"
    assert created["namespace"] == "mcp__calendar__" and json.loads(created["arguments"]) == {"title": "Demo"}
    bodies = sim.bodies()
    assert [t["name"] for t in bodies[0]["tools"]] == ["exec_command", "apply_patch", "tool_search"]
    assert [t["name"] for t in bodies[2]["tools"]][-1] == "mcp__calendar__create_event"
    assert all("defer_loading" not in t for t in bodies[2]["tools"])
    assert bodies[1]["messages"][1]["content"][0]["type"] == "thinking"  # the sealed reasoning, sent back


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        pytest.param({"type": "tool_search", "execution": "server"}, "input[1].tools[2].execution", id="server-search"),
        pytest.param({"type": "image_generation"}, "input[1].tools[2].type", id="image-generation"),
    ],
)
def test_a_built_in_tool_we_cant_run_is_a_400_naming_it(gateway: Gateway, tool: dict, param: str) -> None:
    api = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=gateway.new_key("codex-lite"), max_retries=0)
    lite = {**LITE, "tools": [*LITE["tools"][:1], {"type": "namespace", "name": "x", "tools": []}, tool]}
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(
            model=MODEL, input=[{"role": "developer", "content": "Codex"}, lite, {"role": "user", "content": "hi"}]
        )  # type: ignore[list-item]
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == param and body["message"].startswith(param + ": ")
