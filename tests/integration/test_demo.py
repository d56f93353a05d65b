"""``ezat-compat demo`` on a machine with no configuration: it prints a key and a curl line,
and pasting that curl returns a completion from the simulator through the whole gateway."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "proxy_environment",
    [
        pytest.param({}, id="direct"),
        # A company proxy that can't reach this machine's loopback: the demo's simulator and its
        # own health check must not go through it.
        pytest.param({"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}, id="company-proxy"),
        # An exported key switched the demo to Anthropic's API silently (no network: a 500 on the
        # printed curl); --simulator keeps the simulator, and the first line says which it is.
        pytest.param({"ANTHROPIC_API_KEY": "sk-ant-exported"}, id="key-exported-simulator-flag"),
    ],
)
def test_demo_prints_a_curl_line_that_works_as_pasted(tmp_path: Path, proxy_environment: dict[str, str]) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "EZAT_CONFIG", "EZAT_DATABASE_URL")}
    env.update(proxy_environment)
    flags = ["--simulator"] if "ANTHROPIC_API_KEY" in proxy_environment else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "ezat_compat.cli", "demo", "--bind", f"127.0.0.1:{port}", *flags],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        curl = key = None
        first = proc.stdout.readline()
        assert first.startswith("ezat-compat demo: the upstream is the bundled simulator ("), first
        assert ("--simulator;" in first) == bool(flags), first
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and curl is None:
            line = proc.stdout.readline()
            if not line:
                break
            if "API key" in line:
                key = line.split()[-1]
            if line.strip().startswith("curl "):
                curl = line.strip()
        assert key and key.startswith("ezat_sk_") and curl and key in curl
        done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30, env=env)
        answer = json.loads(done.stdout)
        assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]
        assert answer["model"] == "anthropic/claude-sonnet-5-5"
        assert (tmp_path / "ezat-demo" / "ezat.toml").exists() and (tmp_path / "ezat-demo" / "ezat.db").exists()
        usage = subprocess.run(
            [
                sys.executable,
                "-m",
                "ezat_compat.cli",
                "--config",
                str(tmp_path / "ezat-demo" / "ezat.toml"),
                "usage",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert json.loads(usage.stdout)[0]["request_id"] == answer["id"].removeprefix("chatcmpl-")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if proc.stdout:
            proc.stdout.close()


def test_demo_clouds_shows_bedrock_failing_over_to_vertex(tmp_path: Path) -> None:
    """``demo --clouds``: the second curl line it prints names the model on Bedrock (throttled)
    and Vertex AI; pasted, it answers 200 from Vertex, and the ledger row says so."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "EZAT_CONFIG", "EZAT_DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ezat_compat.cli", "demo", "--clouds", "--bind", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        curls: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(curls) < 2:
            line = proc.stdout.readline()
            if not line:
                break
            if line.strip().startswith("curl "):
                curls.append(line.strip())
        assert len(curls) == 2 and "anthropic/claude-clouds" in curls[1]
        done = subprocess.run(["bash", "-c", curls[1]], capture_output=True, text=True, timeout=60, env=env)
        answer = json.loads(done.stdout)
        assert answer["model"] == "anthropic/claude-clouds" and answer["choices"][0]["message"]["content"]
        config = tmp_path / "ezat-demo" / "ezat.toml"
        usage = subprocess.run(
            [sys.executable, "-m", "ezat_compat.cli", "--config", str(config), "usage", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        (row,) = [r for r in json.loads(usage.stdout) if r["request_id"] == answer["id"].removeprefix("chatcmpl-")]
        assert row["deployment"] == "vertex-us-east5" and row["status"] == 200
        account = tmp_path / "ezat-demo" / "clouds" / "service-account.json"
        assert account.stat().st_mode & 0o777 == 0o600  # a private key: the owner's only
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if proc.stdout:
            proc.stdout.close()
