"""Agent frameworks on their default Responses models against the gateway and the strict
simulator (docs/responses.md): the OpenAI Agents SDK running an agent with a function tool, and as
docs/clients.md prints it, and LangChain's ``ChatOpenAI(use_responses_api=True)`` in a tool loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Gateway, Sim, unscoped
from tests.support.docs import EXAMPLE_BASE, EXAMPLE_KEY, clients_example

pytestmark = pytest.mark.integration
MODEL = "anthropic/claude-sonnet-5-5"


def test_the_agents_sdk_runs_an_agent_with_a_function_tool(gateway: Gateway, key: str, sim: Sim) -> None:
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    async def run() -> object:
        async with AsyncOpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0) as client:
            agents.set_tracing_disabled(True)
            agent = agents.Agent(
                name="weather",
                instructions="Answer with the tool.",
                tools=[get_weather],
                model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
                model_settings=agents.ModelSettings(reasoning={"effort": "low"}),
            )
            return await agents.Runner.run(agent, "What is the weather in Oslo? Use the tool.")

    sim.clear()
    result: Any = asyncio.run(run())
    assert calls and result.final_output.startswith("Tool results: sunny in")
    bodies = sim.bodies()
    assert len(bodies) == 2 and bodies[0]["tools"][0]["name"] == "get_weather"
    assert all("thinking" in body for body in bodies)


def test_langchain_chat_openai_with_the_responses_api_in_a_tool_loop(gateway: Gateway, key: str, sim: Sim) -> None:
    lc_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"sunny in {city}"

    llm = lc_openai.ChatOpenAI(
        model=MODEL, base_url=gateway.url + "/openai/v1", api_key=key, use_responses_api=True, max_retries=0
    ).bind_tools([get_weather])
    messages: list = [HumanMessage("What is the weather in Oslo? Use the tool.")]
    sim.clear()
    for _ in range(3):
        reply = llm.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    assert isinstance(messages[-1].content, (str, list)) and "Tool results: sunny in" in messages[-1].text
    assert len(sim.bodies()) == 2


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(None, id="as-printed-an-alias"),
        pytest.param("openai/anthropic/claude-sonnet-5-5", id="the-openai-prefix"),
        pytest.param("anthropic/claude-sonnet-5-5", id="the-canonical-id-fails-in-the-sdk"),
    ],
)
def test_the_clients_pages_agents_sdk_example_runs_as_printed(
    gateway: Gateway, key: str, sim: Sim, tmp_path: Path, model: str | None
) -> None:
    """The Agents SDK example of docs/clients.md, run as a script with only the address and the key
    changed (and, for the other model names the page names, the model): the alias and the
    ``openai/`` prefix reach the gateway; the bare canonical id fails in the SDK, as it says."""
    pytest.importorskip("agents")
    source = clients_example("from agents import")
    assert EXAMPLE_BASE in source and EXAMPLE_KEY in source and 'model="claude-sonnet-5-5"' in source
    source = source.replace(EXAMPLE_BASE, gateway.url).replace(EXAMPLE_KEY, key)
    if model is not None:
        source = source.replace('model="claude-sonnet-5-5"', f'model="{model}"')
    script = tmp_path / "agent.py"
    script.write_text(source)
    sim.clear()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    if model == "anthropic/claude-sonnet-5-5":
        assert done.returncode != 0 and "UserError: Unknown prefix: anthropic" in done.stderr
        assert sim.bodies() == []
        return
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "Hello from the simulator. You said: What is a prompt cache?"
    (body,) = sim.bodies()
    assert unscoped(body)["system"][0]["text"] == "Answer in one sentence."
