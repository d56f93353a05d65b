"""The client tests reuse the integration servers (a simulator and the gateway), and share one
install of the Node clients (``node/package.json``: the openai npm SDK, the Agents SDK, the AI
SDK, Codex and Claude Code) in a cache folder, by default ``tests/client/.node/clients``."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.integration.conftest import gateway, key, sim  # noqa: F401 - pytest fixtures

SCRIPTS = Path(__file__).parent / "node"
NODE_CACHE = Path(os.environ.get("EZAT_NODE_CACHE", Path(__file__).parent / ".node")) / "clients"


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason}, and CI=true requires it (.ci/run installs Debian's nodejs and npm)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def node_clients() -> Path:
    """The cache folder with ``node/package.json`` installed (npm, once per manifest) and the
    scripts of ``node/`` copied in."""
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            _missing(f"{tool} is not installed on this machine")
    NODE_CACHE.mkdir(parents=True, exist_ok=True)
    manifest = (SCRIPTS / "package.json").read_text()
    stamp = NODE_CACHE / ".installed"
    # One install at a time: pytest-xdist's workers share the cache (the lock is freed on exit).
    with (NODE_CACHE.parent / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install(manifest, stamp)
    for script in SCRIPTS.glob("*.mjs"):
        shutil.copy(script, NODE_CACHE / script.name)
    return NODE_CACHE


def _install(manifest: str, stamp: Path) -> None:
    if not stamp.exists() or stamp.read_text() != manifest:
        (NODE_CACHE / "package.json").write_text(manifest)
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_CACHE,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            _missing(f"could not install the Node clients from the npm registry: {done.stderr[-500:]}")
        stamp.write_text(manifest)
