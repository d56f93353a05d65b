"""LiteLLM's proxy for the side-by-side benchmark: its own virtual environment, pinned, cached.

The venv lives in ``<repo>/.bench-cache/litellm-<VERSION>/`` (gitignored) and is made once with
``pip install 'litellm[proxy]==VERSION'``; a ``.installed`` marker is written only after pip
succeeded, so an interrupted install is redone. Later runs reuse it.

Why this version: it is the newest LiteLLM whose ``[proxy]`` extra resolves on Python 3.11 from
the package index these machines reach (1.108.x and later pin ``litellm-proxy-extras`` /
``litellm-proxy`` releases that the index does not carry). Change ``VERSION`` to compare with
another release; the old venv stays in the cache until deleted.

The proxy is configured to route one Anthropic model to the simulator (``anthropic/<model>``
with ``api_base`` = the simulator's URL: LiteLLM posts to ``<api_base>/v1/messages``) and to
authenticate clients with a master key. It runs without a database: LiteLLM's virtual keys,
per-key rate limits and spend logs all need PostgreSQL, so its auth here is one string compare
and it writes no ledger — lighter than what our gateway does on every request.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

VERSION = "1.106.12"
MASTER_KEY = "sk-bench-master-key"
UPSTREAM_KEY = "sk-ant-bench"
INSTALL_TIMEOUT_S = 1200


def venv_dir(cache: Path) -> Path:
    return cache / f"litellm-{VERSION}"


def executable(cache: Path) -> Path:
    return venv_dir(cache) / "bin" / "litellm"


def installed(cache: Path) -> bool:
    """True when this version's venv is complete (its marker exists)."""
    return (venv_dir(cache) / ".installed").exists() and executable(cache).exists()


def install(cache: Path, log: Path) -> None:
    """Create the venv and pip-install the pinned proxy (a few minutes, ~750 MB); raises
    ``RuntimeError`` naming the log when pip fails."""
    target = venv_dir(cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not (target / "bin" / "python").exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(target)
    print(f"bench: installing litellm[proxy]=={VERSION} into {target} (once; log: {log})", file=sys.stderr, flush=True)
    with log.open("w") as out:
        done = subprocess.run(
            [
                str(target / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                f"litellm[proxy]=={VERSION}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install litellm[proxy]=={VERSION}; see {log}")
    (target / ".installed").write_text(VERSION + "\n")


def config_yaml(model: str, sim_url: str, image_hosts: tuple[str, ...] = ()) -> str:
    """The proxy's config: ``model`` routed to the simulator as an Anthropic deployment;
    ``image_hosts`` (``host:port``) may serve image URLs although they are private addresses
    (``user_url_allowed_hosts``, LiteLLM's counterpart of our ``allow_private_image_hosts``)."""
    allowed = "".join(f'    - "{host}"\n' for host in image_hosts)
    return (
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: anthropic/{model}\n"
        f"      api_base: {sim_url}\n"
        f"      api_key: {UPSTREAM_KEY}\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n" + ("  user_url_allowed_hosts:\n" + allowed if allowed else "")
    )


def environment() -> dict[str, str]:
    """The proxy's environment: no network fetch of the model cost map, quiet logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITELLM_", "DATABASE_URL", "REDIS_"))}
    env.update(
        {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "NO_DOCS": "True",
            "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
        }
    )
    return env
