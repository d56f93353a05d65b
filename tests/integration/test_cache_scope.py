"""Prompt-cache isolation between organisations, through the real gateway and the simulator's
prompt cache (one cache for every request, as an upstream account has): with
``isolate_prompt_cache = false`` an organisation reads from the cache what another sent (the
oracle); by default each organisation reads only its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="cache-scope").start()
    yield server
    server.stop()


def _gateway(root: Path, sim: Sim, isolate: bool | None) -> Gateway:
    """``isolate``: the setting (None: left out, the default)."""
    model = ModelSpec(
        id="anthropic/claude-c",
        aliases=("claude-c",),
        deployments=({"name": "a", "base_url": sim.url, "upstream_model": "claude-c"},),
    )
    settings = {} if isolate is None else {"isolate_prompt_cache": isolate}
    return Gateway(root=root, models=(model,), gateway_settings=settings).start()


@pytest.fixture(scope="module")
def shared(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = _gateway(Path(tmp_path_factory.mktemp("shared")), sim, isolate=False)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def isolated(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = _gateway(Path(tmp_path_factory.mktemp("isolated")), sim, isolate=None)  # the default
    yield gw
    gw.stop()


def long_prefix() -> str:
    """A system prompt over the cache's minimum, new for each test (no earlier entry to read)."""
    return f"[{uuid.uuid4()}] You are a careful assistant who answers briefly. " * 120


def native(gateway: Gateway, key: str, system: str) -> dict[str, Any]:
    resp = requests.post(
        gateway.url + "/v1/messages",
        json={
            "model": "claude-c",
            "max_tokens": 16,
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={"x-api-key": key},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    usage: dict[str, Any] = resp.json()["usage"]
    return usage


def chat(gateway: Gateway, key: str, system: str) -> dict[str, Any]:
    resp = requests.post(
        gateway.url + "/openai/v1/chat/completions",
        json={
            "model": "claude-c",
            "max_completion_tokens": 16,
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                },
                {"role": "user", "content": "hi"},
            ],
        },
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    usage: dict[str, Any] = resp.json()["usage"]
    return usage


def test_without_isolation_one_organisation_reads_what_another_sent(shared: Gateway) -> None:
    a, b = shared.new_key("org-a"), shared.new_key("org-b")
    prefix = long_prefix()
    first = native(shared, a, prefix)
    assert first["cache_creation_input_tokens"] > 1024
    assert native(shared, b, prefix)["cache_read_input_tokens"] == first["cache_creation_input_tokens"]  # the oracle


@pytest.mark.parametrize("send", [native, chat], ids=["messages", "chat"])
def test_with_isolation_each_organisation_reads_only_its_own(isolated: Gateway, send: Any) -> None:
    suffix = uuid.uuid4().hex[:8]
    a, b = isolated.new_key(f"org-a-{suffix}"), isolated.new_key(f"org-b-{suffix}")
    prefix = long_prefix()
    read = "cache_read_input_tokens" if send is native else "prompt_tokens_details"
    first = send(isolated, a, prefix)
    again = send(isolated, a, prefix)
    other = send(isolated, b, prefix)
    if send is native:
        assert first["cache_creation_input_tokens"] > 1024
        assert again[read] == first["cache_creation_input_tokens"]  # the organisation's own cache works
        assert other[read] == 0 and other["cache_creation_input_tokens"] > 1024
    else:
        assert again[read]["cached_tokens"] > 1024
        assert other[read]["cached_tokens"] == 0


def test_a_prompt_too_short_to_cache_goes_as_translated(isolated: Gateway, sim: Sim) -> None:
    """Below the model's ``min_cache_tokens`` (the harness's model: 16) by the gateway's bound,
    nothing can be cached or read: no scope block, the body as translated."""
    key = isolated.new_key(f"org-short-{uuid.uuid4().hex[:8]}")
    resp = requests.post(
        isolated.url + "/v1/messages",
        json={"model": "claude-c", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": key},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    assert "system" not in sim.bodies()[-1]
    long = native(isolated, key, long_prefix())
    assert long["cache_creation_input_tokens"] > 1024
    assert sim.bodies()[-1]["system"][0]["text"].startswith("cache scope ")
