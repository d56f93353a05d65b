"""The client examples of the README, docs/clients.md and docs/responses.md, run as printed (only
the address and the key changed) against the real gateway and the strict simulator: the OpenAI
SDK's chat completion (the README's and the clients page's), LangChain's ``ChatOpenAI``, the
Responses API example, and the AI SDK's default provider in a three-turn conversation that
replays ``response.messages`` with a tool and OpenAI's web search in the list. (The Agents SDK
example runs in test_responses_frameworks.py, llama-index's in test_llama_index.py, Codex's
blocks in test_responses_codex.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import Gateway, Sim
from tests.support.docs import code_block

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLIENTS_DOC = ROOT / "docs" / "clients.md"
RESPONSES_DOC = ROOT / "docs" / "responses.md"
BASE = "http://127.0.0.1:8080"
KEY = "ezat_sk_…"
ECHO = "Hello from the simulator. You said: "


def _as_printed(page: Path, language: str, marker: str, gateway: Gateway, key: str) -> str:
    source = code_block(page, language, marker)
    assert BASE in source and KEY in source  # what a reader pastes, with their address and key
    return source.replace(BASE, gateway.url).replace(KEY, key)


def _run_python(source: str, tmp_path: Path) -> str:
    script = tmp_path / "example.py"
    script.write_text(source)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("page", [README, CLIENTS_DOC], ids=["readme", "clients-page"])
def test_the_chat_completion_example(gateway: Gateway, key: str, sim: Sim, tmp_path: Path, page: Path) -> None:
    sim.clear()
    out = _run_python(_as_printed(page, "python", "client.chat.completions.create", gateway, key), tmp_path)
    assert out.startswith(ECHO + "What is a prompt cache?") and "CompletionUsage(" in out
    (body,) = sim.bodies()
    assert body["max_tokens"] == 64
    assert [block["text"] for block in body["messages"][0]["content"]] == ["What is a prompt cache?"]


def test_the_clients_pages_langchain_example(gateway: Gateway, key: str, sim: Sim, tmp_path: Path) -> None:
    pytest.importorskip("langchain_openai")
    sim.clear()
    out = _run_python(_as_printed(CLIENTS_DOC, "python", "from langchain_openai", gateway, key), tmp_path)
    assert out.strip() == ECHO + "What is a prompt cache?"
    assert len(sim.bodies()) == 1


def test_the_responses_docs_example(gateway: Gateway, key: str, sim: Sim, tmp_path: Path) -> None:
    sim.clear()
    out = _run_python(_as_printed(RESPONSES_DOC, "python", "client.responses.create", gateway, key), tmp_path)
    assert out.startswith(ECHO + "What is a prompt cache?") and "ResponseUsage(" in out
    assert len(sim.bodies()) == 1


@pytest.mark.slow
def test_the_clients_pages_ai_sdk_example(gateway: Gateway, key: str, sim: Sim, node_clients: Path) -> None:
    """Three turns of the AI SDK's ``openai(model)`` (store on): turns two and three send the
    earlier turns as item references, which the gateway resolves to what it stored; the web
    search tool in the list doesn't fail the request."""
    script = node_clients / "readme_ai_sdk.mjs"
    script.write_text(_as_printed(CLIENTS_DOC, "js", "@ai-sdk/openai", gateway, key))
    sim.clear()
    done = subprocess.run(
        ["node", script.name], cwd=node_clients, env=dict(os.environ), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    questions = ["What is a prompt cache?", "Is it shared between users?", "Thanks!"]
    assert done.stdout.strip().splitlines() == [ECHO + q for q in questions]
    bodies = sim.bodies()
    assert len(bodies) == 3
    last = bodies[-1]["messages"]
    said = [m["content"] for m in last if m["role"] == "assistant"]
    assert len(said) == 2  # the first two answers, resolved from their references
    # the function tool went up; web search is left out on a model without ``web_search = true``
    assert [t["name"] for t in bodies[-1]["tools"]] == ["getWeather"]
