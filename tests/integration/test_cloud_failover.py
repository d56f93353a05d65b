"""A tool loop with reasoning that fails over across clouds: it starts on Anthropic's API, the
Anthropic deployment dies mid-loop, the loop goes on on Amazon Bedrock, Bedrock dies, the loop
ends on Google Vertex AI. Every round answers 200 and no upstream refuses anything: the thinking
kept from earlier rounds (signed on another platform) is put back on the next one, because
"signature values are compatible across platforms (Claude APIs, Amazon Bedrock, and Google
Cloud). Values generated on one platform work on another" (Anthropic, extended thinking,
https://platform.claude.com/docs/en/build-with-claude/extended-thinking); the simulator signs
alike whichever provider it speaks. Three simulator processes, so each can be killed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from ezat_compat.sim.clouds import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY
from tests.integration.harness import Gateway, ModelSpec, Sim
from tests.support.clouds import bedrock_at, private_pem, service_account, vertex_at
from tests.support.tool_loops import TOOLS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 5
CITIES = ("Oslo", "Paris", "Lima", "Nairobi", "Quito")
KILL_AFTER = {1: "anthropic", 3: "bedrock"}  # round -> the deployment that dies after it


def ask_for(city: str) -> str:
    return f"Next: {city}. [[sim:tool=get_weather,args={json.dumps({'city': city})}]]"


@pytest.fixture
def clouds(tmp_path: Path) -> Iterator[tuple[Gateway, dict[str, Sim], str]]:
    pem = private_pem()
    service_account(tmp_path / "sa-sim.json", "unused", pem)
    sims = {
        "anthropic": Sim(name="anthropic").start(),
        "bedrock": Sim(name="bedrock").start(),
        "vertex": Sim(name="vertex", flags=("--google-service-account", str(tmp_path / "sa-sim.json"))).start(),
    }
    service_account(tmp_path / "sa.json", sims["vertex"].url + "/token", pem)
    (tmp_path / "aws-config").write_text("")
    deployments = [
        {"name": "anthropic", "base_url": sims["anthropic"].url, "priority": 0},
        {"name": "bedrock", **bedrock_at(sims["bedrock"].url), "priority": 1},
        {"name": "vertex", **vertex_at(sims["vertex"].url), "priority": 2},
    ]
    env = {
        "AWS_ACCESS_KEY_ID": SIM_AWS_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SIM_AWS_SECRET_ACCESS_KEY,
        "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-config"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "sa.json"),
    }
    gateway = Gateway(root=tmp_path / "gw", models=[ModelSpec(deployments=deployments)], env=env).start()
    try:
        yield gateway, sims, gateway.new_key("loop", balance="100")
    finally:
        gateway.stop()
        for sim in sims.values():
            sim.stop()


def _round(client: openai.OpenAI, messages: list[Any], stream: bool) -> tuple[str | None, list[Any]]:
    params: dict[str, Any] = {
        "model": "anthropic/claude-sonnet-5-5",
        "messages": messages,
        "tools": TOOLS,
        "reasoning_effort": "high",
        "max_completion_tokens": 4000,
    }
    if not stream:
        choice = client.chat.completions.create(**params).choices[0]
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in choice.message.tool_calls or []
            if c.type == "function"
        ]
        return choice.finish_reason, calls
    finish, parts = None, {}
    for chunk in client.chat.completions.create(**params, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                part = parts.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                part["id"] += call.id or ""
                if call.function is not None:
                    part["name"] += call.function.name or ""
                    part["arguments"] += call.function.arguments or ""
    calls = [
        {"id": p["id"], "type": "function", "function": {"name": p["name"], "arguments": p["arguments"]}}
        for _, p in sorted(parts.items())
    ]
    return finish, calls


def _thinking_turns(body: dict[str, Any]) -> list[list[str]]:
    return [
        [b["type"] for b in m["content"]]
        for m in body["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_loop_fails_over_from_anthropic_to_bedrock_to_vertex_without_a_400(
    clouds: tuple[Gateway, dict[str, Sim], str], stream: bool
) -> None:
    gateway, sims, key = clouds
    client = openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0, timeout=60)
    messages: list[Any] = [{"role": "user", "content": ask_for(CITIES[0])}]
    served: list[str] = []
    for n in range(1, ROUNDS + 2):
        before = {name: _count(sim) for name, sim in sims.items()}
        finish, calls = _round(client, messages, stream)
        took = {name: _count(sim) - before[name] for name, sim in sims.items() if before[name] >= 0}
        # One request reached one live upstream, and it answered 200 (a 400 would be the client's).
        assert sorted(took.values()) == [0] * (len(took) - 1) + [1], (n, took)
        served.append(next(name for name, count in took.items() if count == 1))
        if n > ROUNDS:
            assert finish == "stop"
            break
        assert finish == "tool_calls", (n, finish)
        (call,) = calls
        assert json.loads(call["function"]["arguments"]) == {"city": CITIES[n - 1]}
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{CITIES[n - 1]}: 9°C"})
        if n < ROUNDS:
            messages.append({"role": "user", "content": ask_for(CITIES[n])})
        if n in KILL_AFTER:
            sims[KILL_AFTER[n]].stop()
    assert served == ["anthropic", "bedrock", "bedrock", "vertex", "vertex", "vertex"], served
    # Each cloud's requests carried every earlier round's thinking, signed on another platform,
    # put back at the start of its tool turn, with thinking requested.
    last = sims["vertex"].requests()[-1]["body"]
    assert last.get("thinking") == {"type": "adaptive"}
    turns = _thinking_turns(last)
    assert len(turns) == ROUNDS and all(t == ["thinking", "tool_use"] for t in turns), turns


def _count(sim: Sim) -> int:
    if sim.proc is None or sim.proc.poll() is not None:
        return -1  # stopped: it takes nothing more
    return len(sim.requests())
