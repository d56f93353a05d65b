"""Module-scoped real servers: one simulator and one gateway (gunicorn, gevent) per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Gateway, ModelSpec, Sim


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="sim-a", flags=("--min-cache-tokens", "16")).start()
    yield server
    server.stop()


def standard_models(sim_url: str) -> list[ModelSpec]:
    """The catalog most integration tests use: one adaptive model, one older budget model,
    one always-thinking model without forced tool choice, all on one simulator."""
    deployment = [{"name": "sim-a", "base_url": sim_url}]
    return [
        ModelSpec(deployments=deployment),
        ModelSpec(
            id="anthropic/claude-haiku-4-5",
            aliases=("claude-haiku-4-5",),
            deployments=deployment,
            sampling=True,
            thinking="budget",
            efforts=("low", "medium", "high"),
            prefill=True,
            max_output_tokens=32000,
        ),
        ModelSpec(
            id="anthropic/claude-thinker",
            aliases=("claude-thinker",),
            deployments=deployment,
            thinking="always",
            forced_tool_choice=False,
        ),
    ]


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("gateway")
    server = Gateway(root=root, models=standard_models(sim.url), gateway_settings={"keepalive_s": 1}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(gateway: Gateway) -> str:
    return gateway.new_key("acme")


@pytest.fixture
def clean(sims: dict[str, Sim]) -> dict[str, Sim]:
    """A module's ``sims`` with their records cleared: counts are this test's."""
    for server in sims.values():
        server.clear()
    return sims
