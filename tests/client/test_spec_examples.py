"""The spec's own examples (Python, Node.js, curl), unchanged but for the base URL, against
the real gateway: the streaming examples of the Chat Completions reference (Python, Node, curl) work
unchanged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import Gateway

EXAMPLES = Path(__file__).parent / "examples"
SPEC_BASE = "https://api.router.ezat.io"
NODE_CACHE = Path(os.environ.get("EZAT_NODE_CACHE", Path(__file__).parent / ".node"))
pytestmark = pytest.mark.integration


def _prepare(name: str, gateway: Gateway, target: Path) -> Path:
    source = (EXAMPLES / name).read_text()
    assert SPEC_BASE in source
    path = target / name
    path.write_text(source.replace(SPEC_BASE, gateway.url))
    return path


def _run(cmd: list[str], key: str, cwd: Path) -> str:
    env = {**os.environ, "EZAT_API_KEY": key}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def node_project() -> Path:
    """A folder with the openai Node SDK installed (npm, once per cache folder)."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("Node.js and npm are not installed on this machine")
    NODE_CACHE.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "package.json", NODE_CACHE / "package.json")
    if not (NODE_CACHE / "node_modules" / "openai").exists():
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_CACHE,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.skip(f"could not install the openai Node SDK from the npm registry: {done.stderr[-300:]}")
    return NODE_CACHE


@pytest.mark.parametrize("name", ["request.py", "streaming.py", "tools.py", "caching.py"])
def test_python_examples(name: str, gateway: Gateway, key: str, tmp_path: Path) -> None:
    out = _run([sys.executable, str(_prepare(name, gateway, tmp_path))], key, tmp_path)
    assert out.strip()
    if name == "request.py":
        assert "stop CompletionUsage(" in out
    if name == "streaming.py":
        assert "CompletionUsage(" in out
    if name == "tools.py":
        assert out.startswith("tool_calls [ChatCompletionMessageFunctionToolCall(") or "tool_calls" in out
        assert "9°C and clear" in out  # the second turn quotes the tool result


@pytest.mark.parametrize("name", ["request.mjs", "streaming.mjs"])
def test_node_examples(name: str, gateway: Gateway, key: str, node_project: Path) -> None:
    path = _prepare(name, gateway, node_project)
    out = _run(["node", str(path)], key, node_project)
    assert "prompt_tokens" in out


@pytest.mark.parametrize("name", ["request.sh", "streaming.sh"])
def test_curl_examples(name: str, gateway: Gateway, key: str, tmp_path: Path) -> None:
    if not shutil.which("curl"):
        pytest.skip("curl is not installed on this machine")
    out = _run(["bash", str(_prepare(name, gateway, tmp_path))], key, tmp_path)
    if name == "request.sh":
        assert json.loads(out)["object"] == "chat.completion"
    else:
        lines = [line for line in out.splitlines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["usage"]["total_tokens"] > 0
