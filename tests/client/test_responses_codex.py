"""The Codex CLI (npm ``@openai/codex``) in ``codex exec`` mode with a custom model provider at
the gateway (``wire_api = "responses"``), its default features and tools left on, against the
strict simulator (docs/responses.md): over two tool rounds it runs a shell command that writes a
file in a scratch folder, then one that edits it, with ``reasoning.effort`` set, and every round
keeps its thinking.

The simulator is scripted with ``[[sim:tool=…,args=…]]``: the prompt's marker makes the first
call, and the first command prints the marker of the second (a marker in a tool's output scripts
the next call). A simulator without these markers skips the test.

With a catalog entry copied from Codex's bundled models (``codex debug models --bundled``: the
first with Responses-lite, the tool search and the freeform ``apply_patch``, which also runs in
code mode), ``codex exec`` writes a file with a command, edits it with ``apply_patch`` and shows
it with another command, through one scripted ``exec`` call.

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
from tests.support.docs import code_block

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


DOCS = Path(__file__).parents[2] / "docs" / "responses.md"
DOC_BASE = "http://127.0.0.1:8080/openai/v1"


def _codex_config(home: Path, gateway: Gateway, *top: str) -> None:
    """``home/config.toml``: the docs' provider block for this gateway, ``top`` lines first."""
    home.mkdir(parents=True, exist_ok=True)
    block = code_block(DOCS, "toml", "[model_providers.ezat]")
    assert DOC_BASE in block
    (home / "config.toml").write_text(
        "".join(line + "\n" for line in top) + block.replace(DOC_BASE, gateway.url + "/openai/v1")
    )


def _codex_exec(codex: Path, home: Path, scratch: Path, key: str, prompt: str) -> subprocess.CompletedProcess[str]:
    """``codex exec`` of ``prompt`` in ``scratch``, its config in ``home``, as a user runs it with
    approvals and the sandbox off; it must succeed."""
    done = subprocess.run(
        [
            str(codex),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-C",
            scratch,
            prompt,
        ],
        env={**os.environ, "CODEX_HOME": str(home), "EZAT_API_KEY": key},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"codex exec failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


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
    scratch.mkdir()
    _codex_config(home, gateway, 'model_reasoning_effort = "high"')
    prompt = f"Write notes.txt, then edit it. [[sim:tool=exec_command,args={json.dumps({'cmd': WRITE})}]]"
    sim.clear()
    done = _codex_exec(node_clients / "node_modules" / ".bin" / "codex", home, scratch, key, prompt)
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


def _copied_catalog(codex: Path, home: Path) -> Path:
    """The docs' command, run as printed with ``home`` as the user's home: one entry of Codex's
    bundled models (the first with Responses-lite) copied under our model's id."""
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code_block(DOCS, "bash", "codex debug models --bundled")],
        env={**os.environ, "HOME": str(home), "PATH": f"{codex.parent}:{os.environ['PATH']}"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    catalog = home / ".codex" / "ezat-catalog.json"
    (entry,) = json.loads(catalog.read_text())["models"]
    assert entry["slug"] == MODEL
    # What a Responses-lite entry turns on, all of it through the gateway below.
    assert entry["supports_search_tool"] and entry["apply_patch_tool_type"] == "freeform"
    return catalog


# The copied entry runs in code mode: its one model-facing tool, ``exec``, takes JavaScript that
# calls Codex's tools; this script writes the file with a command, edits it with apply_patch and
# shows it with another command.
PATCH = "*** Begin Patch\n*** Update File: notes.txt\n@@\n-hello from codex\n+goodbye from codex\n*** End Patch\n"
SCRIPT = (
    "await tools.exec_command({cmd: \"printf 'hello from codex\\\\n' > notes.txt\"});\n"
    f"const patched = await tools.apply_patch({json.dumps(PATCH)});\n"
    'const shown = await tools.exec_command({cmd: "cat notes.txt"});\n'
    "text(JSON.stringify(patched)); text(JSON.stringify(shown));\n"
)


def test_codex_exec_with_a_copied_catalog_entry_patches_a_file_and_runs_a_command(
    gateway: Gateway, sim: Sim, node_clients: Path, tmp_path: Path
) -> None:
    """The issue's second client path: a bundled entry copied under our id (Responses-lite, the
    tool search, freeform ``apply_patch``, code mode) completes a task through the gateway."""
    if not _scriptable(sim):
        pytest.skip("the simulator has no tool=/args= markers to script Codex's tool call")
    key = gateway.new_key("codex-entry")
    home, scratch = tmp_path / "home", tmp_path / "scratch"
    scratch.mkdir()
    codex = node_clients / "node_modules" / ".bin" / "codex"
    catalog = _copied_catalog(codex, home)
    codex_home = home / ".codex"
    _codex_config(
        codex_home, gateway, 'model_reasoning_effort = "high"', f"model_catalog_json = {json.dumps(str(catalog))}"
    )
    prompt = "Write notes.txt, patch it, show it. [[sim:tool=exec,args=" + json.dumps({"input": SCRIPT}) + "]]"
    sim.clear()
    done = _codex_exec(codex, codex_home, scratch, key, prompt)
    assert (scratch / "notes.txt").read_text() == "goodbye from codex\n"  # written, then patched
    assert "goodbye from codex" in done.stdout  # its last message quotes the script's output
    bodies = sim.bodies()
    assert len(bodies) == 2  # the script's round, then the answer
    assert bodies[0]["tools"][0]["name"] == "exec"  # code mode's one tool, freeform (one string)
    assert bodies[0]["tools"][0]["input_schema"]["required"] == ["input"]
    assert all(b["thinking"] == {"type": "adaptive"} and b["output_config"]["effort"] == "high" for b in bodies)
    answer = bodies[1]["messages"]
    called = [b for m in answer if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    assert [b["name"] for b in called] == ["exec"] and called[0]["input"] == {"input": SCRIPT}
    assert answer[-2]["content"][0]["type"] == "thinking"  # the sealed reasoning, sent back by Codex
    results = [b for b in answer[-1]["content"] if b["type"] == "tool_result"]
    assert len(results) == 1 and "goodbye from codex" in json.dumps(results[0])
    rows = gateway.usage("--org", "codex-entry")
    assert len(rows) == 2 and all(r["endpoint"] == "responses" and r["status"] == 200 for r in rows)
