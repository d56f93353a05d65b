"""llama-index's ``OpenAILike`` (package ``llama-index-llms-openai-like``) with its defaults,
through the real gateway and the simulator: ``complete`` on the
legacy Completions API (its default, ``is_chat_model=False``), ``stream_complete``, and
``chat`` with ``is_chat_model=True``; each request billed under its endpoint.

llama-index pins ``openai < 3`` and ``marshmallow < 4``: it gets a venv of its own, made once
in a cache folder (``EZAT_LLAMA_CACHE``, default ``tests/client/.llama``) from the package index.
Outside CI the test skips when that install can't be made; under CI=true it must run.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.integration.harness import Gateway
from tests.support.docs import EXAMPLE_BASE, EXAMPLE_KEY, clients_example

pytestmark = pytest.mark.integration
PACKAGES = ("llama-index-llms-openai-like==0.8.1",)
CACHE = Path(os.environ.get("EZAT_LLAMA_CACHE", Path(__file__).parent / ".llama"))
SCRIPT = Path(__file__).parent / "python" / "llama_index_client.py"


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason}, and CI=true requires it")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def llama_python() -> Path:
    """The interpreter of a venv with ``PACKAGES`` installed (once per list of packages)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    python = CACHE / "venv" / "bin" / "python"
    stamp = CACHE / ".installed"
    wanted = "\n".join(PACKAGES)
    with (CACHE / ".install.lock").open("w") as lock:  # pytest-xdist's workers share the cache
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.read_text() != wanted:
            made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(CACHE / "venv")], capture_output=True)
            if made.returncode != 0:
                _missing(f"could not make a venv for llama-index: {made.stderr.decode()[-300:]}")
            # --no-compile: pip would byte-compile every module installed; the example imports a few.
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", *PACKAGES],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0:
                _missing(f"could not install llama-index from the package index: {done.stderr[-500:]}")
            stamp.write_text(wanted)
    return python


def test_the_clients_pages_llama_index_example_runs_as_printed(
    gateway: Gateway, llama_python: Path, tmp_path: Path
) -> None:
    """docs/clients.md's llama-index block, with only the address and the key changed: one
    completion on the legacy Completions API, one on Chat Completions."""
    key = gateway.new_key("llama-index-readme")
    source = clients_example("from llama_index")
    assert EXAMPLE_BASE in source and EXAMPLE_KEY in source
    script = tmp_path / "example.py"
    script.write_text(source.replace(EXAMPLE_BASE, gateway.url).replace(EXAMPLE_KEY, key))
    done = subprocess.run([str(llama_python), str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "Hello from the simulator. You said: What is a prompt cache?",
        "Hello from the simulator. You said: And a prompt prefix?",
    ]
    endpoints = sorted(row["endpoint"] for row in gateway.usage("--org", "llama-index-readme"))
    assert endpoints == ["chat.completions", "completions"]


def test_openai_like_with_its_defaults_completes_streams_and_chats(gateway: Gateway, llama_python: Path) -> None:
    key = gateway.new_key("llama-index")
    done = subprocess.run(
        [str(llama_python), str(SCRIPT), gateway.url + "/openai/v1", key, "anthropic/claude-sonnet-5-5"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers["complete"].endswith("You said: Say hello")
    assert answers["stream"].endswith("You said: Say hello again")
    assert answers["chat"].endswith("You said: Hello in a chat")
    rows = gateway.usage("--org", "llama-index")
    endpoints = sorted(row["endpoint"] for row in rows)
    assert endpoints == ["chat.completions", "completions", "completions"], endpoints
    assert all(row["status"] == 200 for row in rows)
