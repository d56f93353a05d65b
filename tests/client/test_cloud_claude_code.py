"""Claude Code configured for a cloud, pointed at the gateway: with ``CLAUDE_CODE_USE_BEDROCK=1``
and ``ANTHROPIC_BEDROCK_BASE_URL`` (our key as its Bedrock API key, ``AWS_BEARER_TOKEN_BEDROCK``:
InvokeModel and its event stream), and with ``CLAUDE_CODE_USE_VERTEX=1`` and
``ANTHROPIC_VERTEX_BASE_URL`` (``CLAUDE_CODE_SKIP_VERTEX_AUTH=1``, our key as
``ANTHROPIC_AUTH_TOKEN``: rawPredict and streamRawPredict). In print mode it reads a file and
edits it through the gateway, the simulator scripting the tool calls (the prompt's marker asks
for the Read; the file holds the marker of the Edit), and each request is billed to the key
under the model id Claude Code sent. The variables are docs/clients.md's, as printed there (only
the address and the key changed). Installed and skipped like ``test_node_clients.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import Gateway, Sim
from tests.support.docs import CLIENTS_PAGE, EXAMPLE_BASE, EXAMPLE_KEY, code_block
from tests.support.environment import QUIET_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Besides the variables docs/clients.md prints for each cloud: the small model's id.
SMALL_MODELS = {
    "bedrock": "us.anthropic.claude-haiku-4-5-20251001-v1:0",
    "vertex": "claude-haiku-4-5@20251001",
}
MARKERS = {"bedrock": "CLAUDE_CODE_USE_BEDROCK", "vertex": "CLAUDE_CODE_USE_VERTEX"}


def _cloud_env(cloud: str, url: str, key: str) -> dict[str, str]:
    """docs/clients.md's variables for ``cloud``, as printed but for the address and the key."""
    block = code_block(CLIENTS_PAGE, "sh", MARKERS[cloud])
    assert EXAMPLE_BASE in block and EXAMPLE_KEY in block
    env = {}
    for line in block.replace(EXAMPLE_BASE, url).replace(EXAMPLE_KEY, key).splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
    small = SMALL_MODELS[cloud]
    return {**env, "ANTHROPIC_SMALL_FAST_MODEL": small, "ANTHROPIC_DEFAULT_HAIKU_MODEL": small}


def _variant_env(variant: str, url: str, key: str) -> dict[str, str]:
    """The page's variables; "bedrock, skip auth": its other Bedrock setting, the key then sent
    from ``ANTHROPIC_AUTH_TOKEN`` with ``CLAUDE_CODE_SKIP_BEDROCK_AUTH=1``."""
    if variant != "bedrock, skip auth":
        return _cloud_env(variant, url, key)
    env = _cloud_env("bedrock", url, key)
    del env["AWS_BEARER_TOKEN_BEDROCK"]
    return {**env, "CLAUDE_CODE_SKIP_BEDROCK_AUTH": "1", "ANTHROPIC_AUTH_TOKEN": key}


@pytest.mark.parametrize("cloud", ["bedrock", "bedrock, skip auth", "vertex"])
def test_claude_code_on_a_cloud_reads_and_edits_a_file_through_the_gateway(
    cloud: str, gateway: Gateway, sim: Sim, node_clients: Path, tmp_path: Path
) -> None:
    org = "cc-" + cloud.replace(", ", "-").replace(" ", "-")
    key = gateway.new_key(org)
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.txt"
    # The Edit's marker spells the old text with an escape, so the file holds it once.
    edit = {"file_path": str(notes), "old_string": "color = r\\u0065d", "new_string": "color = blue"}
    edit_args = json.dumps(edit).replace("\\\\u0065", "\\u0065")
    notes.write_text(f"color = red\n[[sim:tool=Edit,args={edit_args}]]\n")
    read = json.dumps({"file_path": str(notes)})
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "AWS_", "GOOGLE_"))},
        **QUIET_ENV,
        "HOME": str(home),
        **_variant_env(cloud, gateway.url, key),
    }
    sim.clear()
    claude = node_clients / "node_modules" / ".bin" / "claude"
    done = subprocess.run(
        [
            str(claude),
            "-p",
            f"Change the color in notes.txt to blue. [[sim:tool=Read,args={read}]]",
            "--output-format",
            "json",
            "--allowedTools",
            "Read",
            "Edit",
            "--max-turns",
            "6",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["is_error"] is False, result
    assert notes.read_text().startswith("color = blue\n")  # Claude Code ran the Edit the reply asked for
    calls = [r["body"] for r in sim.requests() if r["path"] == "/v1/messages" and r["body"].get("tools")]
    uses = [
        block["name"]
        for body in calls
        for message in body["messages"]
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_use"
    ]
    assert {"Read", "Edit"} <= set(uses), uses
    model = env["ANTHROPIC_MODEL"]
    billed = [r for r in gateway.usage() if r["org"] == org and r["model"] == model]
    assert len(billed) >= 3 and all(r["status"] == 200 and r["endpoint"] == "messages" for r in billed), billed
    assert {r["canonical_model"] for r in billed} == {"anthropic/claude-sonnet-5-5"}
    assert all(r["output_tokens"] > 0 for r in billed)
